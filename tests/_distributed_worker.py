"""What each rank does in the distributed tests; started by ``torchrun`` (gloo, CPU).

``reductions OUT``: every estimator that crosses ranks, on this rank's share of one fixed
data set (`dataset`); rank 0 saves the results to ``OUT/reductions.pt`` for the test to hold
against the same functions on the whole data set in one process.

``run CONFIG OUT``: ``run_config`` of a config file; every rank saves its parameters and its
chains to ``OUT/rank<r>.pt``, and once its process group is gone, how many gloo threads it
still runs to ``OUT/gloo_threads<r>.txt``.

``nan CONFIG OUT``: the same, but rank 1's chains draw one sample whose log ψ is NaN at its
third call: the NaN guard's retry must be every rank's, or the ranks' collectives part.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from vitqs import distributed
from vitqs.distributed import gather_rows, rank, world_size
from vitqs.models.jastrow import Jastrow
from vitqs.physics.lattice import Lattice
from vitqs.physics.operators import BoseHubbard, Heisenberg
from vitqs.vmc import observables
from vitqs.vmc.estimators import importance_statistics, importance_weights, statistics
from vitqs.vmc.samples import Samples
from vitqs.vmc.sr import energy_gradient, natural_gradient, parameter_vector

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
    spins, bosons = _systems()
    return {
        "e_chains": -3.0 + complex_normal(N_CHAINS, N_PER_CHAIN) + drift,
        "log_importance": torch.randn(N_CHAINS, N_PER_CHAIN, generator=gen, dtype=torch.float64),
        "jac": complex_normal(n, N_PARAMS),
        "weights": weights / weights.sum(),
        # uniform random states with chain structure, not samples of the Jastrow factors' |ψ|²:
        # the observables are not physical here, only the same numbers on 1 or 2 ranks
        "spin_x": spins.hilbert.random_states(N_CHAINS * 4, gen).reshape(N_CHAINS, 4, -1),
        "boson_x": bosons.hilbert.random_states(N_CHAINS * 4, gen).reshape(N_CHAINS, 4, -1),
    }


def _systems():
    return Heisenberg(Lattice((6,)), J1=1.0), BoseHubbard(Lattice((4,)), 1.0, 3.0, n_particles=4)


def _jastrow(shape, local_states=None) -> Jastrow:
    """Returns a Jastrow factor with fixed random couplings (the same on every rank)."""
    model = Jastrow(shape, local_states=local_states)
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.1 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return model


def _observables(part: dict) -> dict:
    """Returns the sampled spin and boson observables (means and errors) of ``part``."""
    spins, bosons = _systems()
    out = {}
    for system, model, x, measure in (
        (spins, _jastrow((6,)), part["spin_x"], observables.spin_observables),
        (bosons, _jastrow((4,), tuple(range(5))), part["boson_x"], observables.boson_observables),
    ):
        with torch.no_grad():
            log_psi = model(x.reshape(-1, x.shape[-1])).reshape(x.shape[:2])
        samples = Samples(x, log_psi, None, float("nan"))
        for name, estimate in measure(system, model, samples).items():
            out[f"{name}_mean"] = torch.as_tensor(estimate.mean)
            out[f"{name}_error"] = torch.as_tensor(estimate.error)
    return out


def share(data: dict, rank_: int, n_ranks: int) -> dict:
    """Returns rank ``rank_``'s part: whole chains (and their rows), and an uneven row split
    of the weighted rows (two ranks)."""
    per_rank = N_CHAINS // n_ranks
    chains = slice(rank_ * per_rank, (rank_ + 1) * per_rank)
    rows = slice(chains.start * N_PER_CHAIN, chains.stop * N_PER_CHAIN)
    weighted = slice(0, WEIGHTED_SPLIT) if rank_ == 0 else slice(WEIGHTED_SPLIT, None)
    configurations = {key: data[key][chains] for key in ("spin_x", "boson_x")}
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
        **configurations,
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
    out.update(_observables(part))
    return out


def _reductions(out_dir: Path) -> None:
    part = share(dataset(), rank(), world_size())
    result = estimates(part)
    if rank() == 0:
        torch.save(result, out_dir / "reductions.pt")


def _run(config_path: str, out_dir: Path) -> None:
    from vitqs.config import load
    from vitqs.runner import run_config

    config = load(config_path)
    run_config(config, overwrite=True, progress=False)
    vmc_state = {
        "parameters": parameter_vector(_LAST_RUN["model"]),
        "chains": _LAST_RUN["sampler"]._chains.clone(),
    }
    torch.save(vmc_state, out_dir / f"rank{rank()}.pt")


_LAST_RUN: dict = {}


def _poison_rank_1(at_call: int = 3) -> None:
    """Makes rank 1's Metropolis chains return one NaN log ψ at their ``at_call``-th call."""
    from vitqs.vmc.sampler import MetropolisSampler

    sample, calls = MetropolisSampler.sample, [0]

    def poisoned(self, model, n_discard=None):
        samples = sample(self, model, n_discard)
        calls[0] += 1
        if rank() == 1 and calls[0] == at_call:
            samples.log_psi[0, 0] = float("nan")
        return samples

    MetropolisSampler.sample = poisoned


def _remember_build():
    """Keeps the model and sampler that ``run_config`` builds, to save them afterwards."""
    import vitqs.runner as run_module

    build = run_module.build_vmc

    def build_and_keep(config):
        vmc = build(config)
        _LAST_RUN.update(model=vmc.model, sampler=vmc.sampler)
        return vmc

    run_module.build_vmc = build_and_keep


def _gloo_threads() -> int:
    """Returns how many of this process's threads are gloo's (named by torch, /proc)."""
    tasks = Path("/proc/self/task").iterdir()
    return sum("gloo" in (task / "comm").read_text() for task in tasks)


def main(argv: list[str]) -> None:
    mode, *args = argv
    torch.set_num_threads(1)
    with distributed.process_group(torch.device("cpu")):
        rank_ = rank()
        if mode == "reductions":
            _reductions(Path(args[0]))
        else:
            _remember_build()
            if mode == "nan":
                _poison_rank_1()
            _run(args[0], Path(args[1]))
    if mode == "run":  # what the group left behind once its block ended
        (Path(args[1]) / f"gloo_threads{rank_}.txt").write_text(str(_gloo_threads()))


if __name__ == "__main__":
    main(sys.argv[1:])
