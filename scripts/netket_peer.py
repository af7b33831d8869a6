"""NetKet's own ViT + VMC on a vitqs system spec: the peer our benchmarks run side by side.

Lives in ``scripts/`` because nothing in ``src/`` may import netket. Everything returned is in
vitqs units: NetKet's ``Heisenberg`` uses Pauli matrices, so its energies are 4× ours
(S = σ/2) and are multiplied by ``energy_factor = 0.25`` (variances by its square); NetKet's
``BoseHubbard`` is ``H = −J Σ_<ij>(b_i† b_j + h.c.) + (U/2) Σ_i n_i(n_i − 1) − μ Σ_i n_i``, the
same operator as ours (``energy_factor = 1``, checked element by element against a hand-built
matrix and by ED in ``tests/test_netket_peer.py``).

What a NetKet user would run (NetKet 3.23):

- graph: ``nk.graph.Grid([Ly, Lx], max_neighbor_order=...)`` (``Chain`` for 1D). NetKet numbers
  sites with the *last* coordinate fastest, so the extent is given as ``[Ly, Lx]`` to get our
  row-major order ``x + Lx * y``. Edge color 0 holds the J1 bonds (+x, +y), color 1 the J2
  bonds (+x±y); the J2 color exists only when ``J2 != 0``.
- Heisenberg: ``nk.operator.Heisenberg(hi, graph, J=J1 or [J1, J2], sign_rule=...)``. NetKet's
  ``sign_rule`` defaults to *True* on bipartite graphs for a scalar J, so it is always passed
  explicitly (a list ``[sign_rule, False]`` for J1-J2: the Marshall sign acts on J1 bonds only).
- model: NetKet 3.23 ships no ViT (``netket.models`` has none), so ``ViT`` below is the
  factored-attention ViT of NetKet's "Vision Transformer wave function" tutorial (Rende &
  Viteritti, 2025), generalised from ``L × L`` to chains and ``Lx × Ly`` patch grids.
- sampler: ``MetropolisExchange(graph=..., d_max=1, or 2 with J2)`` for spins (as the tutorial);
  ``MetropolisHamiltonian`` for fixed-N bosons, whose moves are the hops of H (one particle
  along a bond, N conserved). ``MetropolisExchange`` on ``Fock`` swaps two occupations, which
  conserves N but only permutes the occupation pattern: not ergodic, so not used.
- driver: ``nk.driver.VMC_SR`` (3.23's replacement of ``netket.experimental.driver.VMC_SRt``),
  ``use_ntk=True`` for the kernel/minSR form and ``False`` for plain SR, which NetKet documents
  as identical to ``VMC`` with ``nk.optimizer.SR(solver=cholesky_with_fallback)``; optimizer
  ``nk.optimizer.Sgd(lr)``. ``method="auto"`` uses our rule (``vitqs.vmc.sr.natural_gradient``):
  kernel form when the 2·n_samples stacked real/imaginary rows are fewer than the parameters.

Run ``python scripts/netket_peer.py --system heisenberg_chain16 --n-iter 20`` for a JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
import types

import numpy as np

from vitqs.config import NATURAL_GRADIENTS

try:
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import netket as nk
    from einops import rearrange

    _IMPORT_ERROR = None
except ImportError as err:  # keep the module importable so callers can skip with a reason
    _IMPORT_ERROR = f"netket peer needs netket, jax, flax and einops: {err}"
    # a stand-in so the flax module classes below can still be defined (never instantiated)
    nn = types.SimpleNamespace(Module=object, compact=lambda f: f)

HEISENBERG_FACTOR = 0.25  # netket Heisenberg (Pauli σ) → ours (S = σ/2): ×1/4
METHODS = NATURAL_GRADIENTS  # the solves ours offers, and the peer mirrors

PRESETS = {
    "heisenberg_chain16": {
        "lattice": {"shape": [16], "pbc": True},
        "hamiltonian": {"kind": "heisenberg", "J1": 1.0, "J2": 0.0, "sign_rule": False},
    },
    "heisenberg_4x4": {
        "lattice": {"shape": [4, 4], "pbc": True},
        "hamiltonian": {"kind": "heisenberg", "J1": 1.0, "J2": 0.0, "sign_rule": False},
    },
    "j1j2_4x4": {
        "lattice": {"shape": [4, 4], "pbc": True},
        "hamiltonian": {"kind": "heisenberg", "J1": 1.0, "J2": 0.5, "sign_rule": False},
    },
    "bose_hubbard_chain12": {
        "lattice": {"shape": [12], "pbc": True},
        "hamiltonian": {"kind": "bose_hubbard", "J": 1.0, "U": 3.3, "mu": 0.0, "n_particles": 12},
    },
}


def netket_available() -> str | None:
    """Returns None when netket, jax and flax import, else a one-line reason to skip."""
    return _IMPORT_ERROR


def _require_netket():
    if _IMPORT_ERROR is not None:
        raise RuntimeError(_IMPORT_ERROR)


# ---------------------------------------------------------------------------------------------
# System: graph, Hilbert space, Hamiltonian


def lattice_extent(system: dict) -> tuple[tuple[int, int], bool, int]:
    """Returns ``((Lx, Ly), pbc, ndim)`` of a system spec, ``Ly = 1`` for a chain."""
    lattice = system.get("lattice", {})
    if lattice.get("kind") not in (None, "chain", "square") or isinstance(lattice.get("pbc"), list):
        raise ValueError(
            f"lattice.kind={lattice.get('kind')}, pbc={lattice.get('pbc')}: the netket peer runs "
            "the tutorial's ViT on chains and square grids with one pbc for every axis only"
        )
    shape = [int(s) for s in lattice.get("shape", [])]
    if len(shape) not in (1, 2) or any(s < 1 for s in shape):
        raise ValueError(f"lattice.shape={shape} must be [L] or [Lx, Ly] of positive extents")
    extent = (shape[0], shape[1] if len(shape) == 2 else 1)
    return extent, bool(lattice.get("pbc", True)), len(shape)


def make_graph(system: dict, max_neighbor_order: int):
    """Returns the netket graph with our site order ``x + Lx * y`` and bond colors by order."""
    (lx, ly), pbc, ndim = lattice_extent(system)
    if ndim == 1:
        return nk.graph.Chain(lx, pbc=pbc, max_neighbor_order=max_neighbor_order)
    # netket's last coordinate runs fastest: [Ly, Lx] makes x the fast index, like ours
    return nk.graph.Grid([ly, lx], pbc=pbc, max_neighbor_order=max_neighbor_order)


def build_system(system: dict):
    """Returns ``(hilbert, hamiltonian, graph, n_sites, energy_factor)`` for a vitqs system spec.

    ``energy_factor`` converts netket energies to ours (``E_ours = energy_factor · E_netket``):
    0.25 for Heisenberg (Pauli matrices in netket, S = σ/2 here), 1 for Bose-Hubbard.

    Args:
        system: ``{"lattice": {"shape": [L] | [Lx, Ly], "pbc": bool}, "hamiltonian": {...}}``
            with ``kind: heisenberg`` (J1, J2, sign_rule, total_sz) or ``kind: bose_hubbard``
            (J, U, mu, n_particles, n_max defaulting to n_particles), as in our configs.
    """
    _require_netket()
    # a resolved config (`Config.to_dict`) lists every option, unset ones as None
    ham = {key: value for key, value in system.get("hamiltonian", {}).items() if value is not None}
    kind = ham.pop("kind", None)
    for key in ("J_leg", "J_rung"):
        if key in ham:
            raise ValueError(
                f"hamiltonian.{key}={ham[key]}: the netket peer runs chains and square grids, "
                "which have no ladder couplings"
            )
    if kind == "heisenberg":
        return _heisenberg(system, **ham)
    if kind == "bose_hubbard":
        return _bose_hubbard(system, **ham)
    raise ValueError(f"hamiltonian.kind={kind!r} must be 'heisenberg' or 'bose_hubbard'")


def _heisenberg(system, J1=1.0, J2=0.0, sign_rule=False, total_sz=0.0):
    J1, J2, sign_rule = float(J1), float(J2), bool(sign_rule)
    graph = make_graph(system, max_neighbor_order=2 if J2 != 0.0 else 1)
    hilbert = nk.hilbert.Spin(0.5, graph.n_nodes, total_sz=float(total_sz))
    if J2 != 0.0:
        # color 0 = J1 bonds, color 1 = J2 bonds; the Marshall sign belongs to J1 only
        hamiltonian = nk.operator.Heisenberg(
            hilbert, graph, J=[J1, J2], sign_rule=[sign_rule, False]
        )
    else:
        hamiltonian = nk.operator.Heisenberg(hilbert, graph, J=J1, sign_rule=sign_rule)
    return hilbert, hamiltonian, graph, graph.n_nodes, HEISENBERG_FACTOR


def _bose_hubbard(system, J=1.0, U=4.0, mu=0.0, n_particles=None, n_max=None):
    if n_particles is None:
        raise ValueError("hamiltonian.n_particles is required for kind: bose_hubbard")
    n_max = int(n_particles) if n_max is None else int(n_max)
    graph = make_graph(system, max_neighbor_order=1)
    hilbert = nk.hilbert.Fock(n_max=n_max, N=graph.n_nodes, n_particles=int(n_particles))
    hamiltonian = nk.operator.BoseHubbard(
        hilbert, graph, U=float(U), J=float(J), mu=float(mu), dtype=np.float64
    )
    return hilbert, hamiltonian, graph, graph.n_nodes, 1.0


# ---------------------------------------------------------------------------------------------
# Model: the ViT of netket's tutorial, for chains and Lx × Ly lattices


def relative_patch_index(grid_extent: tuple[int, int]) -> np.ndarray:
    """Returns ``(P, P)`` int: periodic displacement ``r_j − r_i`` numbered ``dx + Px * dy``.

    Gathering a ``(heads, P)`` table with it gives the tutorial's ``roll2d`` attention
    ``α_ij = α_{r_j − r_i}``, for any ``Px × Py`` grid of patches.
    """
    px, py = grid_extent
    x, y = np.meshgrid(np.arange(px), np.arange(py), indexing="xy")
    x, y = x.reshape(-1), y.reshape(-1)  # patch p = x + Px * y
    return (x[None, :] - x[:, None]) % px + px * ((y[None, :] - y[:, None]) % py)


class FactoredAttention(nn.Module):
    """Returns ``W concat_h(Σ_j α^h_ij (V x_j)^h)`` ``(batch, P, d_model)``: position-only weights.

    The tutorial's ``FMHA``; with ``transl_invariant`` the weights depend on ``r_j − r_i`` only.
    """

    d_model: int
    heads: int
    grid_extent: tuple[int, int]
    transl_invariant: bool = True

    @nn.compact
    def __call__(self, x):
        n_patches = self.grid_extent[0] * self.grid_extent[1]
        init = nn.initializers.xavier_uniform()
        if self.transl_invariant:
            table = self.param("alpha", init, (self.heads, n_patches), jnp.float64)
            alpha = table[:, relative_patch_index(self.grid_extent)]  # (heads, P, P)
        else:
            alpha = self.param("alpha", init, (self.heads, n_patches, n_patches), jnp.float64)
        v = nn.Dense(self.d_model, kernel_init=init, param_dtype=jnp.float64, name="v")(x)
        v = rearrange(v, "batch patch (head d) -> batch head patch d", head=self.heads)
        y = jnp.matmul(alpha, v)  # (batch, head, patch, d)
        y = rearrange(y, "batch head patch d -> batch patch (head d)")
        return nn.Dense(self.d_model, kernel_init=init, param_dtype=jnp.float64, name="W")(y)


class EncoderBlock(nn.Module):
    """Returns ``y + FF(LN(y))``, ``y = x + Attention(LN(x))``, FF = Dense(4d) → gelu → Dense(d)."""

    d_model: int
    heads: int
    grid_extent: tuple[int, int]
    transl_invariant: bool = True

    @nn.compact
    def __call__(self, x):
        init = nn.initializers.xavier_uniform()
        attention = FactoredAttention(
            self.d_model, self.heads, self.grid_extent, self.transl_invariant
        )
        x = x + attention(nn.LayerNorm(param_dtype=jnp.float64)(x))
        h = nn.LayerNorm(param_dtype=jnp.float64)(x)
        h = nn.Dense(4 * self.d_model, kernel_init=init, param_dtype=jnp.float64)(h)
        h = nn.Dense(self.d_model, kernel_init=init, param_dtype=jnp.float64)(nn.gelu(h))
        return x + h


class ViT(nn.Module):
    """Returns complex ``log ψ(x)`` ``(batch,)`` for configurations ``x`` ``(batch, n_sites)``.

    NetKet tutorial architecture: ``bx × by`` patches (row-major, as ``vitqs``' ``PatchGrid``)
    → Dense embedding → ``num_layers`` pre-LN encoder blocks with factored attention → output
    head ``Σ_α log cosh(LN(W_re z)_α + i LN(W_im z)_α)`` with ``z = LN(Σ_patches y)``. All
    parameters real, float64.
    """

    num_layers: int
    d_model: int
    heads: int
    lattice_extent: tuple[int, int]  # (Lx, Ly)
    patch_extent: tuple[int, int]  # (bx, by)
    transl_invariant: bool = True

    @nn.compact
    def __call__(self, x):
        x = jnp.atleast_2d(x).astype(jnp.float64)
        (lx, ly), (bx, by) = self.lattice_extent, self.patch_extent
        grid = (lx // bx, ly // by)
        x = rearrange(x, "batch (py by px bx) -> batch (py px) (by bx)", by=by, px=grid[0], bx=bx)
        init = nn.initializers.xavier_uniform()
        x = nn.Dense(self.d_model, kernel_init=init, param_dtype=jnp.float64)(x)
        for _ in range(self.num_layers):
            x = EncoderBlock(self.d_model, self.heads, grid, self.transl_invariant)(x)
        z = nn.LayerNorm(param_dtype=jnp.float64)(x.sum(axis=1))
        out_re = nn.LayerNorm(param_dtype=jnp.float64)(
            nn.Dense(self.d_model, kernel_init=init, param_dtype=jnp.float64)(z)
        )
        out_im = nn.LayerNorm(param_dtype=jnp.float64)(
            nn.Dense(self.d_model, kernel_init=init, param_dtype=jnp.float64)(z)
        )
        return jnp.sum(nk.nn.activation.log_cosh(out_re + 1j * out_im), axis=-1)


def make_vit(system: dict, *, d_model=16, heads=4, layers=2, patch_size=2, transl_invariant=True):
    """Returns the tutorial ``ViT`` for the system's lattice; ``patch_size`` b is b×b in 2D."""
    (lx, ly), _, ndim = lattice_extent(system)
    patch = (int(patch_size), int(patch_size) if ndim == 2 else 1)
    if lx % patch[0] or ly % patch[1]:
        raise ValueError(f"patch_size={patch_size} must divide lattice.shape={[lx, ly][:ndim]}")
    if d_model % heads:
        raise ValueError(f"heads={heads} must divide d_model={d_model}")
    return ViT(int(layers), int(d_model), int(heads), (lx, ly), patch, bool(transl_invariant))


# ---------------------------------------------------------------------------------------------
# Variational state, sampler and driver


def _make_sampler(hilbert, hamiltonian, graph, system, n_chains, sweep_size):
    if isinstance(hilbert, nk.hilbert.Fock):
        sampler = nk.sampler.MetropolisHamiltonian(
            hilbert, hamiltonian, n_chains=n_chains, sweep_size=sweep_size
        )
        return sampler, "MetropolisHamiltonian (hops of H, N conserved)"
    d_max = 2 if float(system["hamiltonian"].get("J2", 0.0)) != 0.0 else 1
    sampler = nk.sampler.MetropolisExchange(
        hilbert, graph=graph, d_max=d_max, n_chains=n_chains, sweep_size=sweep_size
    )
    return sampler, f"MetropolisExchange (graph distance <= {d_max})"


def make_driver(
    system: dict,
    *,
    d_model=16,
    heads=4,
    layers=2,
    patch_size=2,
    n_samples=1024,
    n_chains=None,
    sweep_size=None,
    n_discard_per_chain=16,
    lr=0.01,
    diag_shift=1e-3,
    method="auto",
    full_sum=False,
    chunk_size=None,
    on_the_fly=False,
    seed=0,
) -> dict:
    """Returns ``{driver, vstate, hamiltonian, energy_factor, n_sites, method_used, ...}``.

    ``n_chains`` defaults to ``min(256, n_samples)`` and ``sweep_size`` to ``n_sites``, our
    sampler defaults. ``method``: ``auto`` (kernel form when ``2·n_samples < n_params``),
    ``sr`` or ``minsr``; a full-sum state always uses ``sr``. ``on_the_fly=False`` stores the
    Jacobian and builds the kernel explicitly, as ``VMC_SRt`` and the tutorial do (netket's
    own default with ``use_ntk=True`` would be True).
    """
    _require_netket()
    if method not in METHODS:
        raise ValueError(f"method={method!r} must be one of {list(METHODS)}")
    hilbert, hamiltonian, graph, n_sites, factor = build_system(system)
    if not isinstance(hamiltonian, nk.operator.DiscreteJaxOperator):
        hamiltonian = hamiltonian.to_jax_operator()
    model = make_vit(system, d_model=d_model, heads=heads, layers=layers, patch_size=patch_size)
    if full_sum:
        vstate = nk.vqs.FullSumState(hilbert, model, chunk_size=chunk_size, seed=seed)
        sampler_used, use_ntk = "full_sum", False
    else:
        n_chains = min(256, n_samples) if n_chains is None else int(n_chains)
        sweep_size = n_sites if sweep_size is None else int(sweep_size)
        sampler, sampler_used = _make_sampler(
            hilbert, hamiltonian, graph, system, n_chains, sweep_size
        )
        vstate = nk.vqs.MCState(
            sampler,
            model,
            n_samples=n_samples,
            n_discard_per_chain=n_discard_per_chain,
            chunk_size=chunk_size,
            seed=seed,
            sampler_seed=seed + 1,
        )
        use_ntk = method == "minsr" or (
            method == "auto" and 2 * vstate.n_samples < vstate.n_parameters
        )
    with contextlib.redirect_stdout(sys.stderr):  # VMC_SR prints diagnostics settings
        driver = nk.driver.VMC_SR(
            hamiltonian,
            nk.optimizer.Sgd(learning_rate=lr),
            diag_shift=diag_shift,
            variational_state=vstate,
            use_ntk=use_ntk,
            on_the_fly=on_the_fly if use_ntk else False,
        )
    return {
        "driver": driver,
        "vstate": vstate,
        "hamiltonian": hamiltonian,
        "energy_factor": factor,
        "n_sites": n_sites,
        "method_used": "minsr" if use_ntk else "sr",
        "sampler_used": sampler_used,
    }


def _step(driver):
    """Returns the energy statistics (netket units) of one step, parameters updated and ready."""
    # the body of AbstractDriver.run without loggers and callbacks (constant lr/diag_shift, so
    # the step counter that schedules read is not needed)
    driver.reset_step()
    stats, dp = driver.compute_loss_and_update()
    driver.update_parameters(dp)
    jax.block_until_ready(driver.state.parameters)
    return stats


def _stats_in_our_units(stats, factor: float) -> tuple[float, float, float]:
    mean = float(np.real(stats.mean)) * factor
    error = float(stats.error_of_mean) * abs(factor)
    variance = float(stats.variance) * factor**2
    return mean, error, variance


def _acceptance(vstate) -> float | None:
    acceptance = getattr(getattr(vstate, "sampler_state", None), "acceptance", None)
    return None if acceptance is None else float(acceptance)


def run_netket_vit(
    system: dict,
    *,
    d_model=16,
    heads=4,
    layers=2,
    patch_size=2,
    n_samples=1024,
    n_chains=None,
    sweep_size=None,
    n_discard_per_chain=16,
    n_iter=300,
    budget_seconds=None,
    lr=0.01,
    diag_shift=1e-3,
    method="auto",
    full_sum=False,
    final_n_samples=8192,
    chunk_size=None,
    seed=0,
    exact_energy=None,
    enumerate_max_dim=None,
    e_inf=0.0,
) -> dict:
    """Returns netket's ViT ground-state run on ``system`` as a JSON-ready dict, in our units.

    Runs up to ``n_iter`` ``VMC_SR`` steps (stopping once ``budget_seconds`` of optimisation
    wall time have passed), then estimates the energy with ``final_n_samples`` samples.

    Keys: ``n_params, n_iter_done, seconds_setup`` (model, sampler, state, driver),
    ``seconds_compile`` (first two steps minus two median steps: tracing and XLA compilation),
    ``seconds_per_iter`` (median over the steps after the first two; after the first one when
    only two ran; both None after a single step), ``seconds_total`` (all steps),
    ``seconds_final_estimate, energy_history, energy_error_history, variance_history, energy,
    energy_error, variance, v_score`` (``N Var/(E − E∞)²`` with ``e_inf`` = E∞ in our units,
    Wu et al.), ``relative_error`` (signed; None without ``exact_energy``, given in our
    units), ``method_used, sampler_used, acceptance`` (None for a full sum),
    ``n_samples, energy_factor``; with ``enumerate_max_dim``, also
    ``enumerated_energy`` (the trained state's energy summed over its whole sector, our units;
    None above that many states), ``enumerated_relative_error`` and ``seconds_enumerate``.
    """
    start = time.perf_counter()
    parts = make_driver(
        system,
        d_model=d_model,
        heads=heads,
        layers=layers,
        patch_size=patch_size,
        n_samples=n_samples,
        n_chains=n_chains,
        sweep_size=sweep_size,
        n_discard_per_chain=n_discard_per_chain,
        lr=lr,
        diag_shift=diag_shift,
        method=method,
        full_sum=full_sum,
        chunk_size=chunk_size,
        seed=seed,
    )
    driver, vstate, factor = parts["driver"], parts["vstate"], parts["energy_factor"]
    seconds_setup = time.perf_counter() - start
    history, step_seconds = _optimize(driver, factor, n_iter, budget_seconds)

    start = time.perf_counter()
    if not full_sum:
        vstate.n_samples = final_n_samples
    energy, error, variance = _stats_in_our_units(vstate.expect(parts["hamiltonian"]), factor)
    seconds_final = time.perf_counter() - start
    start = time.perf_counter()
    enumerated = None
    if enumerate_max_dim is not None:
        enumerated = enumerated_energy(vstate, parts["hamiltonian"], factor, enumerate_max_dim)
    seconds_enumerate = time.perf_counter() - start
    return {
        "n_params": int(vstate.n_parameters),
        "n_iter_done": len(step_seconds),
        "seconds_setup": seconds_setup,
        **_timing_summary(step_seconds),
        "seconds_final_estimate": seconds_final,
        "energy_history": [h[0] for h in history],
        "energy_error_history": [h[1] for h in history],
        "variance_history": [h[2] for h in history],
        "energy": energy,
        "energy_error": error,
        "variance": variance,
        "v_score": parts["n_sites"] * variance / (energy - e_inf) ** 2 if energy != e_inf else None,
        "relative_error": _relative_error(energy, exact_energy),
        "method_used": parts["method_used"],
        "sampler_used": parts["sampler_used"],
        "acceptance": _acceptance(vstate),
        # per step: the samples, or every state of the sector for a full sum
        "n_samples": int(vstate.hilbert.n_states if full_sum else vstate.n_samples),
        "energy_factor": factor,
        "enumerated_energy": enumerated,
        "enumerated_relative_error": _relative_error(enumerated, exact_energy),
        "seconds_enumerate": seconds_enumerate,
    }


def _relative_error(energy, exact_energy):
    """Returns the signed (E − E_exact)/|E_exact|, as vitqs reports it, or None."""
    if energy is None or exact_energy is None:
        return None
    return (energy - exact_energy) / abs(exact_energy)


def enumerated_energy(vstate, hamiltonian, factor: float, max_dim: int, chunk: int = 8192):
    """Returns ⟨ψ|H|ψ⟩/⟨ψ|ψ⟩ of ``vstate``'s ψ summed over every state of its sector, in our
    units (× ``factor``), or None when the sector has more than ``max_dim`` states.

    The noise-free counterpart of the Monte Carlo estimate, the figure our own rows report
    as "enumerated" (``vitqs.report.state_energy``), so the two engines compare without noise.
    """
    sector = _sector(vstate.hilbert, hamiltonian, max_dim)
    if sector is None:
        return None
    states, sparse_h = sector
    # equal chunks (the last one padded) so that log_value compiles once
    n_chunks = -(-len(states) // chunk)
    padded = np.concatenate([states, np.repeat(states[:1], n_chunks * chunk - len(states), 0)])
    log_psi = np.concatenate(
        [np.asarray(vstate.log_value(padded[i * chunk : (i + 1) * chunk])) for i in range(n_chunks)]
    )[: len(states)]
    psi = np.exp(log_psi - log_psi.real.max())  # the largest amplitude is 1: no overflow
    h_psi = sparse_h @ psi
    return factor * float(np.vdot(psi, h_psi).real / np.vdot(psi, psi).real)


def _sector(hilbert, hamiltonian, max_dim: int):
    """Returns ``(states, sparse H)`` of the sector, or None when it has more than ``max_dim``
    states. netket indexes a Fock space through the space without the particle-number
    constraint ((n_max + 1)^N states: 13^12 for the L = N = 12 chain), so it cannot list the
    1.35M states of that sector itself; vitqs' `Bosons` lists and indexes them, and H is
    built from netket's ``get_conn_padded`` on them."""
    if hilbert.is_indexable:
        if hilbert.n_states > max_dim:
            return None
        return np.asarray(hilbert.all_states()), hamiltonian.to_sparse()
    n_particles = getattr(hilbert, "n_particles", None)
    if not isinstance(hilbert, nk.hilbert.Fock) or n_particles is None:
        return None
    from vitqs.physics.hilbert import Bosons

    sector = Bosons(hilbert.size, n_particles, hilbert.n_max)
    if sector.dimension > max_dim:
        return None
    states = sector.all_states()
    return states, sparse_on(hamiltonian, states, sector.state_index)


def sparse_on(hamiltonian, states: np.ndarray, index_of, chunk: int = 65536):
    """Returns H restricted to ``states`` as a scipy CSR matrix, from netket's
    ``get_conn_padded``; ``index_of(configurations)`` gives their rows in ``states`` (and
    raises for a configuration outside them)."""
    from scipy import sparse

    rows, cols, values = [], [], []
    for start in range(0, len(states), chunk):
        x_conn, mels = hamiltonian.get_conn_padded(states[start : start + chunk])
        mels = np.asarray(mels)
        kept = mels != 0  # the padding has zero matrix elements
        rows.append(np.nonzero(kept)[0] + start)
        cols.append(np.asarray(index_of(np.asarray(x_conn)[kept])))
        values.append(mels[kept])
    n = len(states)
    return sparse.csr_matrix(
        (np.concatenate(values), (np.concatenate(rows), np.concatenate(cols))), shape=(n, n)
    )


def _optimize(driver, factor, n_iter, budget_seconds):
    history, step_seconds = [], []
    for step in range(int(n_iter)):
        start = time.perf_counter()
        stats = _step(driver)
        step_seconds.append(time.perf_counter() - start)
        mean, error, variance = _stats_in_our_units(stats, factor)
        if not math.isfinite(mean):
            raise FloatingPointError(f"netket energy is {mean} at step {step}")
        history.append((mean, error, variance))
        if budget_seconds is not None and sum(step_seconds) >= budget_seconds:
            break
    return history, step_seconds


def _timing_summary(step_seconds: list[float]) -> dict:
    # the first steps trace and compile; with one step only there is no steady time (None)
    n_warm = min(2, len(step_seconds) - 1)
    if n_warm < 1:
        return {
            "seconds_compile": None,
            "seconds_per_iter": None,
            "seconds_total": sum(step_seconds),
        }
    per_iter = float(np.median(step_seconds[n_warm:]))
    return {
        "seconds_compile": sum(step_seconds[:n_warm]) - n_warm * per_iter,
        "seconds_per_iter": per_iter,
        "seconds_total": float(sum(step_seconds)),
    }


# ---------------------------------------------------------------------------------------------
# Per-phase timings


def _median_seconds(fn, n_repeats: int) -> float:
    jax.block_until_ready(fn())  # compile
    seconds = []
    for _ in range(n_repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        seconds.append(time.perf_counter() - start)
    return float(np.median(seconds))


def phase_timings(system: dict, *, n_repeats: int = 5, **driver_options) -> dict:
    """Returns median seconds per VMC phase of netket's ViT step (after one warm-up call each).

    Phases (``driver_options`` as for ``make_driver``; Monte Carlo states only):

    - ``sampling``: ``vstate.reset()`` then ``vstate.sample()``: ``n_discard_per_chain`` plus
      ``n_samples / n_chains`` sweeps of every chain;
    - ``local_energy``: ``vstate.local_estimators(H)`` on the cached samples (connected
      configurations, one forward pass over them, the sum);
    - ``energy_and_gradient``: ``vstate.expect_and_grad(H)`` on cached samples (local energies,
      statistics and the plain VJP gradient: what a first-order optimiser needs);
    - ``natural_gradient``: ``compute_loss_and_update()`` on cached samples minus
      ``local_energy``: the Jacobian (or NTK) of log ψ and the SR/minSR solve;
    - ``step``: a whole driver step (resample, local energies, Jacobian, solve, update).

    Also returns ``n_params``, ``n_samples``, ``method_used`` and ``sampler_used``.
    """
    parts = make_driver(system, **driver_options)
    driver, vstate, hamiltonian = parts["driver"], parts["vstate"], parts["hamiltonian"]
    if not isinstance(vstate, nk.vqs.MCState):
        raise ValueError("phase_timings needs a Monte Carlo state (full_sum=False)")

    def sample():
        vstate.reset()
        return vstate.samples

    seconds = {"sampling": _median_seconds(sample, n_repeats)}
    seconds["local_energy"] = _median_seconds(
        lambda: vstate.local_estimators(hamiltonian), n_repeats
    )
    seconds["energy_and_gradient"] = _median_seconds(
        lambda: vstate.expect_and_grad(hamiltonian)[1], n_repeats
    )
    loss_and_update = _median_seconds(lambda: driver.compute_loss_and_update()[1], n_repeats)
    seconds["natural_gradient"] = loss_and_update - seconds["local_energy"]
    seconds["step"] = _median_seconds(lambda: _step(driver).mean, n_repeats)
    return {
        "seconds": seconds,
        "n_params": int(vstate.n_parameters),
        "n_samples": int(vstate.n_samples),
        "method_used": parts["method_used"],
        "sampler_used": parts["sampler_used"],
    }


# ---------------------------------------------------------------------------------------------
# CLI


def _parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", choices=sorted(PRESETS), default="heisenberg_chain16")
    parser.add_argument("--n-iter", type=int, default=20)
    parser.add_argument("--budget-seconds", type=float, default=None)
    parser.add_argument("--d-model", type=int, default=16)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--patch-size", type=int, default=2)
    parser.add_argument("--n-samples", type=int, default=1024)
    parser.add_argument("--n-chains", type=int, default=None)
    parser.add_argument("--n-discard-per-chain", type=int, default=16)
    parser.add_argument("--final-n-samples", type=int, default=8192)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--diag-shift", type=float, default=1e-3)
    parser.add_argument("--method", choices=METHODS, default="auto")
    parser.add_argument("--full-sum", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--exact", action="store_true", help="ED reference via nk.exact")
    parser.add_argument("--phases", action="store_true", help="per-phase timings instead")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = _parse_args(argv)
    reason = netket_available()
    if reason is not None:
        print(json.dumps({"error": reason}))
        return 1
    system = PRESETS[args.system]
    model = {"d_model": args.d_model, "heads": args.heads, "layers": args.layers}
    sampling = {"n_samples": args.n_samples, "n_chains": args.n_chains}
    sampling["n_discard_per_chain"] = args.n_discard_per_chain
    optimizer = {"lr": args.lr, "diag_shift": args.diag_shift, "method": args.method}
    common = {**model, "patch_size": args.patch_size, **sampling, **optimizer, "seed": args.seed}
    if args.phases:
        result = phase_timings(system, **common)
    else:
        exact = None
        if args.exact:
            _, hamiltonian, _, _, factor = build_system(system)
            exact = float(nk.exact.lanczos_ed(hamiltonian)[0]) * factor
        result = run_netket_vit(
            system,
            **common,
            n_iter=args.n_iter,
            budget_seconds=args.budget_seconds,
            full_sum=args.full_sum,
            final_n_samples=args.final_n_samples,
            exact_energy=exact,
        )
        result["exact_energy"] = exact
    print(json.dumps({"system": args.system, "netket": nk.__version__, **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
