"""Seconds per configuration of one ViT forward pass without gradients, by batch size.

Why `models/vit.ACTIVATION_BYTES` exists: on CPU a pass over many configurations at once
is slower per configuration than several smaller ones, once its activations leave the
caches. This times the network's single pass (`ViT._log_psi`, not the batched `forward`)
on the same random configurations cut into batches of each size, float64 and float32,
and prints one markdown row per dtype: microseconds per configuration and, in brackets,
the MLP hidden layer's size per pass.

    OMP_NUM_THREADS=1 taskset -c 0 python scripts/bench_forward.py CONFIG [--set KEY=VALUE ...]
        [--batches 64,128,256,512,1024,2048,4096] [--total 16384]

Only for a config whose model is a ViT (a symmetry average is timed through its network).
"""

from __future__ import annotations

import argparse
import time

import torch

from vitqs.build import build_hamiltonian, build_network
from vitqs.config import load
from vitqs.models import Symmetrized


def per_configuration(network, x: torch.Tensor, batch: int, repeats: int = 3) -> float:
    """Returns the fastest of ``repeats`` passes over ``x`` in batches, per configuration."""
    with torch.no_grad():
        for part in x.split(batch):  # warm-up
            network._log_psi(part)
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            for part in x.split(batch):
                network._log_psi(part)
            best = min(best, time.perf_counter() - start)
    return best / x.shape[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    parser.add_argument("--batches", default="64,128,256,512,1024,2048,4096")
    parser.add_argument("--total", type=int, default=16384)
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = load(args.config, args.overrides)
    hamiltonian = build_hamiltonian(config)
    network = build_network(config, hamiltonian)
    while isinstance(network, Symmetrized):
        network = network.model
    batches = [int(b) for b in args.batches.split(",")]
    n_patches, d_model = network.grid.n_patches, network.head.weight_re.shape[1]
    values = torch.as_tensor(hamiltonian.hilbert.local_states, dtype=torch.float64)
    generator = torch.Generator().manual_seed(0)
    pick = torch.randint(len(values), (args.total, hamiltonian.n_sites), generator=generator)
    print(f"| network | dtype | {' | '.join(f'B = {b}' for b in batches)} |")
    print(f"|---|---|{'---|' * len(batches)}")
    for dtype in (torch.float64, torch.float32):
        network = network.to(dtype)
        x = values[pick].to(dtype)
        cells = []
        for batch in batches:
            mib = batch * n_patches * 4 * d_model * x.element_size() / 2**20
            cells.append(f"{per_configuration(network, x, batch) * 1e6:.0f} µs ({mib:.1f} MiB)")
        name = f"{config.name}, {hamiltonian.n_sites} sites"
        print(f"| {name} | {str(dtype).removeprefix('torch.')} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
