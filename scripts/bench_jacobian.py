"""Milliseconds per Jacobian of a config's samples, by route: per sample (`vmap(jacrev)`) and
by rows (one batched forward and one backward pass per part, `models/row_gradients.py`).

The config's VMC is built as `vitqs run` builds it, takes two steps (so the samples are
those of a training step, not of the first one), and both routes differentiate the same
samples, alternating, in one process; one markdown row with the medians and their ratio.

    OMP_NUM_THREADS=1 taskset -c 0 python scripts/bench_jacobian.py CONFIG [--set KEY=VALUE ...]
        [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from vitqs.build import build_vmc
from vitqs.config import load
from vitqs.vmc.sr import log_derivatives, parameter_vector

ROUTES = ("per_sample", "rows")


def route_seconds(vmc, x: torch.Tensor, repeats: int) -> dict[str, float]:
    """Returns the median seconds of each route on ``x``, the routes alternating."""
    times = {route: [] for route in ROUTES}
    for route in ROUTES:  # warm-up
        log_derivatives(vmc.model, x, vmc.chunk_size, route=route)
    for _ in range(repeats):
        for route in ROUTES:
            start = time.perf_counter()
            log_derivatives(vmc.model, x, vmc.chunk_size, route=route)
            times[route].append(time.perf_counter() - start)
    return {route: statistics.median(t) for route, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    vmc = build_vmc(load(args.config, args.overrides))
    for _ in range(2):
        vmc.step()
    samples = vmc.sampler.sample(vmc.model)
    x = samples.x.reshape(-1, samples.x.shape[-1])
    seconds = route_seconds(vmc, x, args.repeats)
    per_sample, rows = seconds["per_sample"], seconds["rows"]
    print("| config | N_s | P | per-sample ms | rows ms | ratio |")
    print("|---|---|---|---|---|---|")
    print(
        f"| `{args.config}` {' '.join(args.overrides)} | {x.shape[0]} | "
        f"{parameter_vector(vmc.model).numel()} | {1e3 * per_sample:.2f} | {1e3 * rows:.2f} | "
        f"{per_sample / rows:.2f} |"
    )


if __name__ == "__main__":
    main()
