"""Exact sums over a sector: every state with weight ``|ψ(x)|²/Σ|ψ|²``, for full-sum
expectation values on small sectors. The local energies come from one sparse matrix-vector
product ``(Hψ)(x)/ψ(x)`` over the sector, with no further network evaluation. For a model
with symmetries the sums run over one state per orbit (`physics.symmetry.sector_orbits`). The
sum over the whole sector belongs to one process (not across ``torch.distributed`` ranks).
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse as sp
import torch

from vitqs.config import SamplerConfig
from vitqs.distributed import world_size
from vitqs.physics.hilbert import Bosons, SpinHalf
from vitqs.physics.symmetry import sector_orbits
from vitqs.vmc.estimators import evaluate_log_psi
from vitqs.vmc.samples import Sampler, Samples, model_device_dtype


class ExactSampler(Sampler):
    """Full enumeration of the sector: every state with weight ``|ψ(x)|² / Σ_x |ψ(x)|²``.

    With ``symmetry``, the model's symmetry group, a sum over the sector is a sum over its
    orbits: ψ, the local energy and the log-derivatives are the same on every state of an
    orbit (up to the character, which cancels in all three), so one representative per
    orbit with weight ``size · |ψ|²`` gives the same sums, the natural gradient included,
    at a fraction of the cost (32× fewer states for translations and spin inversion on
    4×4). Quantities that are not invariant (site-resolved observables) need the whole
    sector: `unreduced`.

    Args:
        hilbert: a Hilbert space with ``all_states()``.
        chunk_size: states per forward pass; None for one pass.
        symmetry: ``(permutations, spin_flip)`` under which ψ is invariant for every
            parameter value (`models.symmetrize.invariances`), or None: every state.
    """

    def __init__(
        self,
        hilbert: SpinHalf | Bosons,
        chunk_size: int | None = SamplerConfig.chunk_size,
        symmetry=None,
    ):
        if world_size() > 1:  # every rank would sum the whole sector, and reductions add them
            raise ValueError(
                f"sampler.kind=full_sum sums the whole sector in one process; it does not run "
                f"across {world_size()} torch.distributed ranks (start it without torchrun)"
            )
        self.hilbert = hilbert
        self.n_sites = hilbert.n_sites
        self.n_chains, self.n_discard = 1, 0
        self.chunk_size = chunk_size
        self.symmetry = symmetry
        states = hilbert.all_states()
        self.orbits = None if symmetry is None else sector_orbits(hilbert, *symmetry)
        if self.orbits is not None:
            states = states[self.orbits.representatives]
            self._log_sizes = torch.as_tensor(np.log(self.orbits.sizes), dtype=torch.float64)
        self.n_samples = self.n_per_chain = len(states)  # the states each sum runs over
        self._states_np = states
        self._states: torch.Tensor | None = None
        self._matrix, self._matrix_of = None, None

    exact = True

    @property
    def reduced(self) -> bool:
        return self.orbits is not None

    def n_batches(self, n_samples: int) -> int:
        return 1  # every call is the whole sector

    def discard_before(self, n_samples: int, n_discard: int | None = None) -> int:
        return 0  # no chain to thermalise

    def measuring(self) -> ExactSampler:
        return self.unreduced()

    def amplitudes(self, samples: Samples) -> np.ndarray | None:
        if self.reduced:
            return None
        log_psi = samples.log_psi.reshape(-1).cpu().numpy().astype(np.complex128)
        return np.exp(log_psi - log_psi.real.max())

    def local_energy(self, hamiltonian, network, samples: Samples, chunk_size=None):
        """Returns the local energies from one sparse product over the sector
        (`sector_local_energy`): no ``network`` is needed, every amplitude is known already."""
        return self.sector_local_energy(hamiltonian, samples.log_psi)

    def unreduced(self) -> ExactSampler:
        """Returns the sampler of every state of the sector (itself when not reduced)."""
        return ExactSampler(self.hilbert, self.chunk_size) if self.reduced else self

    def check_symmetry(self, model, n_states: int = 8, tolerance: float = 1e-8) -> None:
        """Raises ValueError unless ``ψ(g x) = χ(g) ψ(x)`` holds (to ``tolerance`` of the
        largest amplitude) for the group of ``symmetry`` on ``n_states`` states of the sector:
        a sum over orbits is wrong otherwise."""
        if not self.reduced:
            return
        permutations, spin_flip = self.symmetry
        device, dtype = model_device_dtype(model)
        states = self._states_np  # one per orbit: any states will do for the check
        pick = np.linspace(0, len(states) - 1, min(n_states, len(states))).astype(np.int64)
        x = torch.as_tensor(states[pick], dtype=dtype, device=device)
        images = [(x[:, perm], 1) for perm in torch.as_tensor(np.asarray(permutations))]
        if spin_flip:
            images.append((-x, spin_flip))
        with torch.no_grad():
            log_psi = evaluate_log_psi(model, x, self.chunk_size)
            shift = log_psi.real.max()  # compare amplitudes relative to the largest: where
            psi = torch.exp(log_psi - shift)  # the symmetry forces ψ = 0, ratios are noise
            for x_g, character in images:
                psi_g = torch.exp(evaluate_log_psi(model, x_g, self.chunk_size) - shift)
                if float((psi_g - character * psi).abs().max()) > tolerance:
                    raise ValueError(
                        "a full sum over orbits: the model is not invariant under the "
                        "symmetry group it claims (lattice symmetries, spin inversion)"
                    )

    @torch.no_grad()
    def sample(self, model, n_discard: int | None = None) -> Samples:
        """Returns all states (or one per orbit) ``(1, D, N)``, log ψ, and weights ``(1, D)``."""
        device, dtype = model_device_dtype(model)
        if self._states is None or self._states.device != device or self._states.dtype != dtype:
            self._states = torch.as_tensor(self._states_np, dtype=dtype, device=device)
        log_psi = evaluate_log_psi(model, self._states, self.chunk_size)
        log_weights = 2 * log_psi.real.to(torch.float64)
        if self.reduced:
            log_weights = log_weights + self._log_sizes.to(log_weights.device)
        weights = torch.softmax(log_weights, dim=0)
        return Samples(self._states[None], log_psi[None], weights[None], math.nan)

    def sector_local_energy(self, hamiltonian, log_psi: torch.Tensor) -> torch.Tensor:
        """Returns ``E_loc(x) = (Hψ)(x) / ψ(x)`` for every state, shaped like ``log_psi``.

        ``log_psi`` holds log ψ over the whole sector in ``all_states()`` order (as `sample`
        returns it), so the amplitudes of all connected states are already known: one CSR
        matvec replaces the ``max_conn`` network evaluations per state of `local_energy`.
        Over orbits, the matrix is ``H`` folded onto the representatives (`_folded`).
        States whose weight underflows (``|ψ(x)|² / max|ψ|² < e^-600``) get ``H_xx``; their
        weight is zero to double precision, and ``Hψ/ψ`` there is not representable.
        """
        if hamiltonian.hilbert.dimension != self.hilbert.dimension:
            raise ValueError(
                f"the hamiltonian's sector has {hamiltonian.hilbert.dimension} states, "
                f"the sampler's {self.hilbert.dimension}"
            )
        if self._matrix_of is not hamiltonian:
            matrix = hamiltonian.to_sparse()
            self._matrix = self._folded(matrix) if self.reduced else matrix
            self._matrix_of = hamiltonian
        log_amp = log_psi.detach().reshape(-1).cpu().numpy().astype(np.complex128)
        log_amp = log_amp - log_amp.real.max()
        negligible = log_amp.real < -300.0
        psi = np.exp(np.where(negligible, 0.0, log_amp))
        psi[negligible] = 0.0
        e_loc = self._matrix @ psi
        e_loc[~negligible] /= psi[~negligible]
        e_loc[negligible] = self._matrix.diagonal()[negligible]
        return (
            torch.as_tensor(e_loc, device=log_psi.device).to(log_psi.dtype).reshape(log_psi.shape)
        )

    def _folded(self, matrix: sp.csr_matrix) -> sp.csr_matrix:
        """Returns ``H̃ (R, R)`` with ``(Hψ)(r) = Σ_s H̃[r, s] ψ(s)`` over representatives:
        ``H̃ = (H C)[representatives]``, ``C[x, o(x)] = character[x]`` spreads ψ onto the sector."""
        orbits = self.orbits
        on = orbits.orbit >= 0
        spread = sp.csr_matrix(
            (orbits.character[on].astype(np.float64), (np.flatnonzero(on), orbits.orbit[on])),
            shape=(self.hilbert.dimension, len(orbits.representatives)),
        )
        return (matrix[orbits.representatives] @ spread).tocsr()
