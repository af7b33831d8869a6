"""What each rank does in the distributed tests; started by ``torchrun`` (gloo, CPU).

``reductions OUT``: every estimator that crosses ranks, on this rank's share of one fixed
data set (`dataset`); rank 0 saves the results to ``OUT/reductions.pt`` for the test to hold
against the same functions on the whole data set in one process.

``run CONFIG OUT``: ``run_config`` of a config file; every rank saves its parameters and its
chains to ``OUT/rank<r>.pt``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from vitqs import distributed
from vitqs.estimators import (
    gather_rows,
    importance_statistics,
    importance_weights,
    rank,
    statistics,
    world_size,
)
from vitqs.sr import clip_local_energy, energy_gradient, natural_gradient, parameter_vector

N_CHAINS, N_PER_CHAIN, N_PARAMS = 8, 16, 40
# the weighted rows split unevenly, as distinct configurations do between ranks
WEIGHTED_SPLIT = 60


def dataset() -> dict:
    """Returns fixed local energies with chain structure, log-derivatives and weights."""
    gen = torch.Generator().manual_seed(7)
    n = N_CHAINS * N_PER_CHAIN

    def complex_normal(*shape):
        parts = torch.randn(*shape, 2, generator=gen, dtype=torch.float64)
        return torch.view_as_complex(parts)

    drift = torch.cumsum(complex_normal(N_CHAINS, N_PER_CHAIN), dim=1) * 0.2  # correlated
    weights = torch.rand(n, generator=gen, dtype=torch.float64) + 0.1
    return {
        "e_chains": -3.0 + complex_normal(N_CHAINS, N_PER_CHAIN) + drift,
        "log_importance": torch.randn(N_CHAINS, N_PER_CHAIN, generator=gen, dtype=torch.float64),
        "jac": complex_normal(n, N_PARAMS),
        "weights": weights / weights.sum(),
    }


def share(data: dict, rank_: int, n_ranks: int) -> dict:
    """Returns rank ``rank_``'s part: whole chains (and their rows), and an uneven row split
    of the weighted rows (two ranks)."""
    per_rank = N_CHAINS // n_ranks
    chains = slice(rank_ * per_rank, (rank_ + 1) * per_rank)
    rows = slice(chains.start * N_PER_CHAIN, chains.stop * N_PER_CHAIN)
    weighted = slice(0, WEIGHTED_SPLIT) if rank_ == 0 else slice(WEIGHTED_SPLIT, None)
    if n_ranks == 1:
        weighted = slice(None)
    flat_e = data["e_chains"].reshape(-1)
    return {
        "e_chains": data["e_chains"][chains],
        "log_importance": data["log_importance"][chains],
        "jac": data["jac"][rows],
        "e_rows": flat_e[rows],
        "jac_weighted": data["jac"][weighted],
        "e_weighted": flat_e[weighted],
        "weights": data["weights"][weighted],
    }


def estimates(part: dict) -> dict:
    """Returns every cross-rank estimate of one rank's ``part`` (all ranks: the whole)."""
    out = {}
    stats = statistics(part["e_chains"])
    weights = importance_weights(part["log_importance"])
    weighted = importance_statistics(part["e_chains"], weights)
    for name, s in (("stats", stats), ("importance", weighted)):
        out[name] = torch.tensor(
            [s.mean.real, s.mean.imag, s.error_of_mean, s.variance, s.tau_corr, s.r_hat],
            dtype=torch.float64,
        )
        out[f"{name}_n"] = torch.tensor(s.n_samples)
    out["importance_weights"] = gather_rows(weights.reshape(-1))
    for method in ("sr", "minsr"):
        out[f"{method}_uniform"] = natural_gradient(
            part["jac"], part["e_rows"], diag_shift=1e-3, method=method
        )
        out[f"{method}_weighted"] = natural_gradient(
            part["jac_weighted"],
            part["e_weighted"],
            diag_shift=1e-3,
            weights=part["weights"],
            method=method,
        )
    out["gradient"] = energy_gradient(part["jac"], part["e_rows"])
    out["clipped"] = gather_rows(clip_local_energy(part["e_rows"], 1.0))
    return out


def _reductions(out_dir: Path) -> None:
    part = share(dataset(), rank(), world_size())
    result = estimates(part)
    if rank() == 0:
        torch.save(result, out_dir / "reductions.pt")


def _run(config_path: str, out_dir: Path) -> None:
    from vitqs.config import load
    from vitqs.run import run_config

    config = load(config_path)
    run_config(config, overwrite=True, progress=False)
    vmc_state = {
        "parameters": parameter_vector(_LAST_RUN["model"]),
        "chains": _LAST_RUN["sampler"]._chains.clone(),
    }
    torch.save(vmc_state, out_dir / f"rank{rank()}.pt")


_LAST_RUN: dict = {}


def _remember_build():
    """Keeps the model and sampler that ``run_config`` builds, to save them afterwards."""
    import vitqs.run as run_module

    build = run_module.build_vmc

    def build_and_keep(config):
        vmc = build(config)
        _LAST_RUN.update(model=vmc.model, sampler=vmc.sampler)
        return vmc

    run_module.build_vmc = build_and_keep


def main(argv: list[str]) -> None:
    mode, *args = argv
    torch.set_num_threads(1)
    with distributed.process_group(torch.device("cpu")):
        if mode == "reductions":
            _reductions(Path(args[0]))
        else:
            _remember_build()
            _run(args[0], Path(args[1]))


if __name__ == "__main__":
    main(sys.argv[1:])
