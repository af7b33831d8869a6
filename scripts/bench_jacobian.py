"""Milliseconds per Jacobian of a config's samples, by route: per sample (`vmap(jacrev)`), by
rows (one batched forward and one backward pass per part, `models/row_gradients.py`), and by
the route `auto` picks on a float32 copy of the network (`optimizer.jacobian_dtype`).

The config's VMC is built as `vitqs run` builds it, takes two steps (so the samples are
those of a training step, not of the first one), and the three differentiate the same
samples, alternating, in one process; one markdown row with the medians, the ratio of the
two float64 routes, the float64 `auto` route over the float32 one, and the float32 copy's
largest deviation, relative to the largest |O_k(x)|.

    OMP_NUM_THREADS=1 taskset -c 0 python scripts/bench_jacobian.py CONFIG [--set KEY=VALUE ...]
        [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from vitqs.build import build_vmc
from vitqs.config import ConfigError, load
from vitqs.models.precision import NetworkCopy
from vitqs.vmc.sr import log_derivatives, parameter_vector

ROUTES = ("per_sample", "rows", "float32")  # float32: `auto` on a float32 copy


def route_seconds(vmc, x: torch.Tensor, repeats: int) -> tuple[dict[str, float], float]:
    """Returns the median seconds of each route on ``x``, the routes alternating, and the
    float32 copy's largest deviation from the float64 Jacobian over its largest entry."""
    copy32 = NetworkCopy(torch.float32)

    def jacobian(route: str) -> torch.Tensor:
        if route == "float32":
            return log_derivatives(copy32(vmc.model), x, vmc.chunk_size)
        return log_derivatives(vmc.model, x, vmc.chunk_size, route=route)

    exact, rounded = jacobian("rows"), jacobian("float32")  # and the warm-up
    jacobian("per_sample")
    times = {route: [] for route in ROUTES}
    for _ in range(repeats):
        for route in ROUTES:
            start = time.perf_counter()
            jacobian(route)
            times[route].append(time.perf_counter() - start)
    deviation = float((rounded - exact).abs().max() / exact.abs().max())
    return {route: statistics.median(t) for route, t in times.items()}, deviation


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    try:
        vmc = build_vmc(load(args.config, args.overrides))
    except ConfigError as err:
        print(f"bench_jacobian: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    for _ in range(2):
        vmc.step()
    samples = vmc.sampler.sample(vmc.model)
    x = samples.x.reshape(-1, samples.x.shape[-1])
    seconds, deviation = route_seconds(vmc, x, args.repeats)
    per_sample, rows, rows32 = (seconds[route] for route in ROUTES)
    print(
        "| config | N_s | P | per-sample ms | rows ms | ratio | float32 ms | rows / float32 "
        "| float32 max dev. |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    print(
        f"| `{args.config}` {' '.join(args.overrides)} | {x.shape[0]} | "
        f"{parameter_vector(vmc.model).numel()} | {1e3 * per_sample:.2f} | {1e3 * rows:.2f} | "
        f"{per_sample / rows:.2f} | {1e3 * rows32:.2f} | {rows / rows32:.2f} | {deviation:.1e} |"
    )


if __name__ == "__main__":
    main()
