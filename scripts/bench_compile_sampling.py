"""The sampling phase with the chains' network eager, then under ``torch.compile``.

Issue 30 asks whether compiling the forward pass of the Metropolis chains pays. This times
``sampler.sample`` (median of ``--repeats`` calls) with the float32 copy of the ViT as it is,
then with its single pass ``ViT._log_psi`` replaced by a compiled one (inductor, dynamic
batch size: the number of valid proposals changes at every Metropolis step), and prints the
compile time and the largest difference of log ψ on the chains' states.

    OMP_NUM_THREADS=1 taskset -c 0 python scripts/bench_compile_sampling.py CONFIG \
        [--set KEY=VALUE ...] [--repeats 5] [--real-parts]

``--real-parts`` compiles the network up to the head's real and imaginary parts and forms
the complex log ψ outside (inductor generates no code for complex operators).
Only for a config whose model is a bare ViT with a complex head.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from vitqs.build import build_hamiltonian, build_network, build_sampler
from vitqs.config import load


def sampling_seconds(sampler, model, repeats: int) -> float:
    """Returns the median seconds of ``repeats`` calls of ``sampler.sample``."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        sampler.sample(model)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def real_parts(network):
    """Returns ``x -> (Re log ψ, Im log ψ)`` of ``network``'s single pass, no complex op:
    patches, encoder blocks and the head's `LogCoshHead.parts`. A network with more than
    these (Jastrow factor, sign prior, a positive head) is refused."""
    extras = (network.jastrow, network.sign_sites)
    if any(extra is not None for extra in extras) or network.head.positive:
        raise SystemExit("--real-parts: only a ViT of patches, blocks and a complex head")

    def parts(x):
        h = network.embed(network.grid.split(x))
        for block in network.blocks:
            h = block(h)
        return network.head.parts(h)

    return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--real-parts", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = load(args.config, args.overrides)
    hamiltonian = build_hamiltonian(config)
    model = build_network(config, hamiltonian)
    sampler = build_sampler(config, hamiltonian, model)
    sampler.sample(model)  # warm-up: chains, float32 copy, caches
    eager = sampling_seconds(sampler, model, args.repeats)
    network = sampler.chains.evaluating(sampler.chains.sampled(model))
    eager_pass = network._log_psi
    if args.real_parts:
        compiled_parts = torch.compile(real_parts(network), dynamic=True)
        network._log_psi = lambda x: torch.complex(*compiled_parts(x))
    else:
        network._log_psi = torch.compile(eager_pass, dynamic=True)
    start = time.perf_counter()
    sampler.sample(model)
    first = time.perf_counter() - start
    compiled = sampling_seconds(sampler, model, args.repeats)
    x = sampler._chains.to(torch.float32)
    with torch.no_grad():
        difference = (network._log_psi(x) - eager_pass(x)).abs().max().item()
    print(
        f"| {config.name} | {'real parts' if args.real_parts else 'whole pass'} | {eager:.3f} | "
        f"{compiled:.3f} | {eager / compiled:.2f} | {first:.1f} | {difference:.1e} |"
    )


if __name__ == "__main__":
    main()
