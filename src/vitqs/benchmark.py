"""Speed of one VMC step, split by phase: what ``vitqs bench speed`` and ``bench_step.py`` print.

`time_steps` builds the config's Hamiltonian, network, sampler and optimizer through the same
``vitqs.runner`` builders a real run uses (so it times exactly what ``vitqs run`` executes), runs
warm-up steps, then times ``n_iter`` steps of ``VMC.step``. Phases come from the step's own
``timings`` (``sampling``, ``local_energy``, ``jacobian``, ``solve``); ``other`` is the rest of
the wall time of the step (statistics, parameter copies, the update). No files are written and
no exact diagonalization runs. Nothing here imports netket: the side-by-side comparison lives in
``scripts/bench_step.py``.
"""

from __future__ import annotations

import platform
import resource
import statistics as pystats
import sys
import time

import torch

from vitqs.build import build_vmc
from vitqs.config import Config
from vitqs.vmc.driver import VMC

PHASES = ("sampling", "local_energy", "jacobian", "solve", "other")


def time_steps(
    config: Config, n_warmup: int = 2, n_iter: int = 10, *, compile_chains: bool | None = None
) -> dict:
    """Returns median seconds per VMC step and per phase, throughputs and peak memory.

    Keys: ``seconds_per_iter`` (median wall time of a step after ``n_warmup`` warm-up steps),
    ``seconds`` (phase → median seconds, phases `PHASES`; ``other`` = step − Σ phases, per
    step), ``seconds_warmup`` (the warm-up steps' wall time minus ``n_warmup`` median steps:
    first-call costs such as allocator growth and lazy initialisation), ``samples_per_second``
    (kept samples / sampling time; thermalisation sweeps included in the time),
    ``proposals_per_second``, ``local_energies_per_second``, ``peak_memory_mib`` (CPU:
    ``ru_maxrss`` of the process; CUDA: ``torch.cuda.max_memory_allocated``), ``n_params``,
    ``n_samples``, ``method_used``, ``device``, ``dtype``, ``chain_dtype`` and
    ``local_energy_dtype`` (the networks the chains and the local energies run on),
    ``threads``, ``n_iter``, ``n_warmup``, ``compiled_chains`` (whether the chains' network
    went through ``torch.compile``), ``compiled_log_derivatives`` (whether the Jacobian did:
    a bare ViT of complex log ψ with compiled chains, `VMC._compiled_jacobian`),
    ``compile_seconds`` (the first compiled graphs, tracing and compiling, inside the
    warm-up; 0 without), ``flops`` (`phase_flops`: counted operations of ``sampling``,
    ``local_energy`` and ``jacobian+solve``, from one more step's calls), ``gflops`` (those
    over the phases' median seconds) and ``peak_gflops`` (`matmul_peak`: float64 and float32
    matrix-product GFLOP/s of this device and these threads), ``ops_per_step``,
    ``op_seconds`` and ``profiled_step_seconds`` (`op_count`).

    Args:
        config: a validated config; ``threads`` (if set) is applied with
            ``torch.set_num_threads``.
        n_warmup: steps run before timing starts (>= 0).
        n_iter: timed steps (>= 1).
        compile_chains: compile the chains' network (None: as a run of ``config`` would,
            `build.compiled_chains`).
    """
    if n_iter < 1 or n_warmup < 0:
        raise ValueError(f"n_iter={n_iter} must be >= 1 and n_warmup={n_warmup} >= 0")
    if config.threads:
        torch.set_num_threads(config.threads)
    vmc = build_vmc(config, compile_chains=compile_chains)
    model, sampler = vmc.model, vmc.sampler
    device = next(model.parameters()).device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    warmup = [_timed_step(vmc) for _ in range(n_warmup)]
    steps = [_timed_step(vmc) for _ in range(n_iter)]
    per_iter = pystats.median(total for total, _, _ in steps)
    n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    n_samples = sampler.n_samples
    seconds = {phase: pystats.median(t[phase] for _, t, _ in steps) for phase in PHASES}
    # an exact sum makes no proposals
    n_proposals = sampler.n_chains * getattr(sampler, "sweep_size", 0)
    n_proposals *= sampler.n_discard + sampler.n_per_chain
    ops = op_count(vmc)
    flops = phase_flops(vmc)
    fused = {"jacobian+solve": seconds["jacobian"] + seconds["solve"]}
    times = {"sampling": seconds["sampling"], "local_energy": seconds["local_energy"], **fused}
    return {
        "seconds_per_iter": per_iter,
        "seconds": seconds,
        # counted matrix-product operations per phase over its median time, beside the
        # machine's matrix-product peak: how far each phase is from the arithmetic limit
        "flops": flops,
        "gflops": {
            phase: None if flops.get(phase) is None else flops[phase] / t / 1e9
            for phase, t in times.items()
        },
        "peak_gflops": matmul_peak(device),
        **ops,
        "seconds_warmup": sum(total for total, _, _ in warmup) - n_warmup * per_iter,
        "samples_per_second": n_samples / seconds["sampling"],
        "proposals_per_second": n_proposals / seconds["sampling"],
        "local_energies_per_second": n_samples / seconds["local_energy"],
        "peak_memory_mib": _peak_memory_mib(device),
        "n_params": n_params,
        "n_samples": n_samples,
        "method_used": steps[-1][2],  # the solve the step ran (auto resolved)
        "device": str(device),
        "dtype": config.dtype,
        # a full sum has no chains and no network copies: everything in the model's dtype
        "chain_dtype": _copy_dtype(config, config.sampler.dtype),
        "local_energy_dtype": _copy_dtype(config, config.sampler.local_energy_dtype),
        "threads": torch.get_num_threads(),
        "n_iter": n_iter,
        "n_warmup": n_warmup,
        "compiled_chains": sampler.compiled,
        "compiled_log_derivatives": vmc.compiles_log_derivatives,
        "compile_seconds": vmc.compile_seconds,
    }


def op_count(vmc: VMC) -> dict[str, float | int]:
    """Returns one more step under torch's profiler (CPU activity): ``ops_per_step`` (calls
    of torch operators, nested ones included), ``op_seconds`` (the sum of their own times:
    the operators' work and their dispatch) and ``profiled_step_seconds`` (that step's wall
    time, the profiler's cost included). The wall time the operators do not account for is
    Python and the profiler: what a small step's fixed cost is made of."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        start = time.perf_counter()
        vmc.step()
        wall = time.perf_counter() - start
    averages = profiler.key_averages()
    return {
        "ops_per_step": int(sum(event.count for event in averages)),
        "op_seconds": sum(event.self_cpu_time_total for event in averages) / 1e6,
        "profiled_step_seconds": wall,
    }


def phase_flops(vmc: VMC) -> dict[str, int | None]:
    """Returns the floating-point operations of one more step's phases, as torch's
    `FlopCounterMode` counts them (matrix products, attention and convolutions: 2 per
    multiply-add; elementwise work is not counted): ``sampling`` (one `sample` call),
    ``local_energy`` and ``jacobian+solve`` (the update). None for a phase that cannot be
    counted (compiled chains: their graph is opaque to the counter)."""
    from torch.utils.flop_counter import FlopCounterMode

    def counted(function):
        with FlopCounterMode(display=False) as counter:
            out = function()
        return out, counter.get_total_flops()

    sampler = vmc.sampler
    if getattr(sampler, "compile_seconds", 0.0):
        samples, sampling = sampler.sample(vmc.model), None
    else:
        samples, sampling = counted(lambda: sampler.sample(vmc.model))
    network = vmc._local_energy_network(vmc.model)
    e_loc, local = counted(
        lambda: sampler.local_energy(vmc.step_hamiltonian, network, samples, vmc.chunk_size)
    )
    diag_shift = vmc.diag_shift(vmc.step_count, vmc.budget_progress())
    if vmc.compiles_log_derivatives:  # their graph is opaque to the counter too
        vmc._update(samples, e_loc, diag_shift, {})
        update = None
    else:
        _, update = counted(lambda: vmc._update(samples, e_loc, diag_shift, {}))
    return {"sampling": sampling, "local_energy": local, "jacobian+solve": update}


def matmul_peak(device: torch.device, size: int = 1024, repeats: int = 3) -> dict[str, float]:
    """Returns the GFLOP/s of a ``size``² matrix product in float64 and float32 on ``device``
    with torch's threads: the best of ``repeats`` after one warm-up."""
    peaks = {}
    for dtype in (torch.float64, torch.float32):
        a = torch.randn(size, size, dtype=dtype, device=device)
        best = float("inf")
        for _ in range(repeats + 1):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            a @ a
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            best = min(best, time.perf_counter() - start)
        peaks[str(dtype).removeprefix("torch.")] = 2 * size**3 / best / 1e9
    return peaks


def _timed_step(vmc: VMC) -> tuple[float, dict[str, float], str]:
    start = time.perf_counter()
    result = vmc.step()
    total = time.perf_counter() - start  # VMC's phase laps synchronise CUDA already
    phases = {phase: result.timings.get(phase, 0.0) for phase in PHASES[:-1]}
    phases["other"] = total - sum(phases.values())
    return total, phases, result.method


def _peak_memory_mib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes vs KiB


def machine() -> str:
    """Returns one line naming the machine: CPU model or GPU, torch version and threads."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next(line.split(":", 1)[1].strip() for line in info if "model name" in line)
    except (OSError, StopIteration):
        pass
    gpu = f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return (
        f"{cpu}{gpu}; torch {torch.__version__}, {torch.get_num_threads()} torch thread(s), "
        f"Python {platform.python_version()}"
    )


def _copy_dtype(config: Config, dtype: str | None) -> str:
    """Returns the dtype a network copy of the sampler runs in (null: the model's)."""
    return (dtype if config.sampler.kind == "metropolis" else None) or config.dtype


def _precision(result: dict) -> str:
    """Returns the model's dtype, and those of the chains' and local energies' networks
    where they differ from it."""
    others = {"chains": result["chain_dtype"], "E_loc": result["local_energy_dtype"]}
    differ = [f"{name} {dtype}" for name, dtype in others.items() if dtype != result["dtype"]]
    return result["dtype"] + (f" ({', '.join(differ)})" if differ else "")


def phase_table(result: dict) -> str:
    """Returns the phase table of a `time_steps` result as aligned text."""
    per_iter = result["seconds_per_iter"]
    lines = [f"{'phase':<16}{'seconds':>10}{'share':>8}{'GFLOP/s':>10}"]
    gflops = result.get("gflops", {})
    for phase in PHASES:
        value = result["seconds"][phase]
        lines.append(f"{phase:<16}{value:>10.4f}{value / per_iter:>8.1%}{_rate(gflops, phase)}")
    if "jacobian+solve" in gflops:
        lines.append(f"{'jacobian+solve':<16}{'':>18}{_rate(gflops, 'jacobian+solve')}")
    lines.append(f"{'step':<16}{per_iter:>10.4f}{1:>8.0%}")
    peak = result.get("peak_gflops")
    if peak:
        lines.append(
            "matmul peak    "
            + ", ".join(f"{dtype} {value:.1f} GFLOP/s" for dtype, value in peak.items())
            + " (a 1024² product, these threads; counted operations: matrix products only)"
        )
    if "ops_per_step" in result:
        lines.append(
            f"torch ops      {result['ops_per_step']:,} a step, their own time "
            f"{result['op_seconds']:.4f} s of a profiled {result['profiled_step_seconds']:.4f}-s "
            "step (the rest: Python and the profiler)"
        )
    lines += [
        f"warm-up extra  {result['seconds_warmup']:.3f} s over {result['n_warmup']} steps",
        *_compile_line(result),
        f"samples/s      {result['samples_per_second']:.0f} "
        f"({result['proposals_per_second']:.0f} proposals/s)",
        f"E_loc/s        {result['local_energies_per_second']:.0f}",
        f"peak memory    {result['peak_memory_mib']:.0f} MiB",
        f"n_params       {result['n_params']}  n_samples {result['n_samples']}  "
        f"method {result['method_used']}  {result['device']} {_precision(result)} "
        f"threads {result['threads']}  median of {result['n_iter']} steps",
    ]
    return "\n".join(lines)


def _rate(gflops: dict, phase: str) -> str:
    value = gflops.get(phase)
    return f"{value:>10.2f}" if value is not None else f"{'—':>10}" if phase in gflops else ""


def _compile_line(result: dict) -> list[str]:
    """Returns the line on the chains' compiled network (`build.compiled_chains`, or
    ``--compile``): its first pass's seconds; none for chains run eager."""
    if not result.get("compiled_chains"):
        return []
    seconds = result.get("compile_seconds", 0.0)
    what = "chains' and log-derivatives'" if result.get("compiled_log_derivatives") else "chains'"
    return [f"compile        {seconds:.3f} s (the {what} first compiled graphs, tracing included)"]
