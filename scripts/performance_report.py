"""Renders the current tables of ``results/performance.md`` from the stored per-row JSON.

Two blocks, each between ``<!-- begin NAME -->`` and ``<!-- end NAME -->`` (the prose around
them is kept):

- ``cpu-table``: one row per ``results/benchmarks/speed__*.json``, the rows that
  ``scripts/bench_step.py CONFIG --with-netket --store FILE`` writes (ours and netket's ViT in
  one invocation, pinned to the same cores): seconds per step, our phases, netket's step and
  the ratio ours / netket;
- ``gpu-table``: the rows of ``results/benchmarks/gpu_check_*.json`` (``scripts/gpu_check.py``
  on a lent GPU), ours per phase with peak memory, netket's step on the same card.

    python scripts/performance_report.py             # rewrite results/performance.md
    python scripts/performance_report.py --check     # exit 1 when the file is stale
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vitqs.accuracy import replace_block  # the same markers, one rule

REPO = Path(__file__).resolve().parents[1]
ROWS = REPO / "results" / "benchmarks"
REPORT = REPO / "results" / "performance.md"
PHASES = ("sampling", "local_energy", "jacobian", "solve")


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.4f}" if value < 0.1 else f"{value:.3f}"


def cpu_table(rows: list[dict]) -> str:
    """Returns the CPU table: ours per phase and per step beside netket's step, same cores."""
    header = ["row", "date", "cores", "samples", "params ours / netket"]
    header += [f"{phase} s" for phase in PHASES]
    header += ["ours s/step", "netket s/step", "**ours / netket**"]
    header += ["GFLOP/s: sampling / E_loc / Jacobian+solve (float64 matmul peak)"]
    header += ["torch ops a step", "machine"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in sorted(rows, key=lambda r: r["label"]):
        ours, netket = row["ours"], row.get("netket")
        ratio = row.get("ratio", {}).get("step")
        cells = [
            row["label"],
            row.get("date", "—"),
            ",".join(str(c) for c in row.get("cores") or []) or "—",
            str(ours["n_samples"]),
            f"{ours['n_params']:,} / " + (f"{netket['n_params']:,}" if netket else "—"),
            *(_seconds(ours["seconds"][phase]) for phase in PHASES),
            _seconds(ours["seconds_per_iter"]),
            _seconds(netket["seconds_per_iter"]) if netket else "not run",
            f"**{ratio:.2f}**" if ratio is not None else "—",
            _rates(ours),
            f"{ours['ops_per_step']:,}" if "ops_per_step" in ours else "—",
            row["machine"].replace("|", "\\|"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _rates(ours: dict) -> str:
    """Returns our phases' counted GFLOP/s and the float64 matrix-product peak, "—" for
    rows measured before `vitqs.benchmark` counted them."""
    gflops, peak = ours.get("gflops"), ours.get("peak_gflops")
    if not gflops or not peak:
        return "—"
    phases = ("sampling", "local_energy", "jacobian+solve")
    rates = " / ".join("—" if gflops.get(p) is None else f"{gflops[p]:.2g}" for p in phases)
    return f"{rates} ({peak['float64']:.0f})"


def gpu_table(checks: dict[str, dict]) -> str:
    """Returns the GPU table: every timed row of every stored `gpu_check.py` JSON, by file."""
    header = ["invocation", "card", "row", "params", "samples"]
    header += [f"{phase} s" for phase in PHASES]
    header += ["step s", "peak MiB", "status"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for stem, check in checks.items():
        card = check["environment"]["device"]
        for name, part in check["parts"].items():
            if "/" not in name:  # the tests and the equality check: in the check's own table
                continue
            seconds = part.get("seconds") or {}
            cells = [
                stem.removeprefix("gpu_check_"),
                card,
                name,
                f"{part['n_params']:,}" if part.get("n_params") else "—",
                str(part.get("n_samples", "—")),
                *(_seconds(seconds.get(phase)) for phase in PHASES),
                _seconds(part.get("seconds_per_iter")),
                f"{part['peak_memory_mib']:,.0f}" if part.get("peak_memory_mib") else "—",
                part["status"]
                if part["status"] == "ok"
                else f"{part['status']}: " + " ".join(str(part.get("error", "")).split())[:80],
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render(text: str, rows_dir: Path = ROWS) -> str:
    """Returns the report ``text`` with its two blocks rendered from ``rows_dir``."""
    rows = [json.loads(p.read_text()) for p in sorted(rows_dir.glob("speed__*.json"))]
    checks = {p.stem: json.loads(p.read_text()) for p in sorted(rows_dir.glob("gpu_check_*.json"))}
    text = replace_block(text, "cpu-table", cpu_table(rows) if rows else "(no stored rows)")
    return replace_block(text, "gpu-table", gpu_table(checks) if checks else "(no stored rows)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows-dir", type=Path, default=ROWS)
    parser.add_argument("--output", type=Path, default=REPORT)
    parser.add_argument("--check", action="store_true", help="exit 1 if the file is stale")
    args = parser.parse_args(argv)
    text = args.output.read_text() if args.output.exists() else "# Performance\n"
    rendered = render(text, args.rows_dir)
    if args.check:
        return 0 if rendered == text else 1
    args.output.write_text(rendered)
    print(args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
