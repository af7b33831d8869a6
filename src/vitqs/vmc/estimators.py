"""Local energies and Monte Carlo statistics.

Every mean over samples in vitqs goes through `sample_mean`, which sums through
`distributed.reduce_sum` across ``torch.distributed`` ranks (each rank holds its own chains).
Sums that stay inside one Markov chain (a chain lives on one rank) need no reduction; counts
of samples and chains are totals over ranks (`total_count`). Without an initialised process
group of more than one rank every collective here is the identity.

Samples come with chain structure ``(n_chains, n_per_chain, ...)``; the exact (full-sum)
sampler gives one "chain" holding the whole sector together with weights ``|ψ|²/Σ|ψ|²``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from vitqs.distributed import reduce_max, reduce_sum, total_count
from vitqs.models.symmetrize import invariances

# Sokal's window constant for the integrated autocorrelation time (Sokal 1997; emcee).
_SOKAL_WINDOW = 5.0


def sample_mean(values: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Returns the mean over the leading (sample) axis, or the weighted sum for exact weights.

    Args:
        values: ``(n, ...)``, any dtype that sums.
        weights: ``(n,)`` non-negative, summing to 1 over all samples (the exact sampler's
            ``|ψ|²/Σ|ψ|²``), or None for equal weights ``1/n``.
    """
    if weights is None:
        count = torch.tensor(float(values.shape[0]), dtype=torch.float64, device=values.device)
        return reduce_sum(values.sum(dim=0)) / reduce_sum(count)
    w = weights.reshape(weights.shape + (1,) * (values.ndim - 1))
    return reduce_sum((w * values).sum(dim=0))


# Configurations per forward pass when no chunk size is given. Without a bound, local
# energies of 8,192 final samples of the J1-J2 4x4 (65 connected states each) through a
# model averaged over 8 symmetry copies made one pass of 4.3M rows and ~11 GB.
DEFAULT_CHUNK_SIZE = 16384
# Connected configurations per chunk of local energies when no chunk size is given. All
# 32,768 final samples of the J1-J2 6x6 at once (145 connected states each, a model averaged
# over 8 copies) peaked at ~24 GB and were killed: the forward passes were bounded, but the
# heap kept every large block freed between them (8,192 samples: 8.9 GB, 3.0 GB with a fixed
# malloc mmap threshold). Chunks of equal size reuse their blocks. Connected configurations
# are evaluated once per orbit within a chunk (a training step's 1,024 samples are one).
DEFAULT_CONNECTED_PER_CHUNK = 2**18


@dataclass(frozen=True)
class DistinctRows:
    """The distinct configurations of a batch and where each row of the batch went.

    Attributes:
        x: distinct configurations ``(D, N)``.
        inverse: ``(B,)`` index into ``x`` of each row of the batch: ``batch = x[inverse]``.
        first: ``(D,)`` index of the first row of the batch equal to each distinct one.
        counts: ``(D,)`` rows of the batch equal to each distinct one.
    """

    x: torch.Tensor
    inverse: torch.Tensor
    first: torch.Tensor
    counts: torch.Tensor

    @property
    def n_distinct(self) -> int:
        return self.x.shape[0]


# the largest number of distinct configurations that one int64 code per row tells apart
_MAX_CODES = 2**62


def distinct_rows(x: torch.Tensor) -> DistinctRows:
    """Returns the distinct rows of configurations ``x`` ``(B, N)`` (integer-valued entries).

    A sampled distribution concentrated on few configurations (a Mott insulator: the
    sampler sits on the uniform filling most of the time) repeats rows; whatever is a
    function of the configuration alone (log ψ, local energies, log-derivatives) needs
    computing once per distinct row. Rows are packed into one int64 code each,
    ``Σ_i (x_i − min) b^i`` with ``b`` the range of values + 1, when ``b^N`` fits: a 1-d
    unique is ~10x faster than ``torch.unique(dim=0)``, which is the fallback.
    """
    if x.shape[0] == 0:
        empty = torch.zeros(0, dtype=torch.long, device=x.device)
        return DistinctRows(x, empty, empty, empty)
    codes = _row_codes(x)
    if codes is not None:
        _, inverse, counts = torch.unique(codes, return_inverse=True, return_counts=True)
    else:
        _, inverse, counts = torch.unique(x, dim=0, return_inverse=True, return_counts=True)
    first = _first_of_each(inverse, len(counts))
    return DistinctRows(x[first], inverse, first, counts)


def _first_of_each(inverse: torch.Tensor, n_groups: int) -> torch.Tensor:
    """Returns ``(n_groups,)`` the index of the first row in each group, for rows labelled
    ``inverse`` ``(B,)`` with every label in ``[0, n_groups)`` used."""
    rows = torch.arange(len(inverse), device=inverse.device)
    first = torch.full((n_groups,), len(inverse), device=inverse.device, dtype=rows.dtype)
    return first.scatter_reduce(0, inverse, rows, reduce="amin")


def _row_codes(x: torch.Tensor) -> torch.Tensor | None:
    """Returns one int64 code per row of ``x`` ``(B, N)`` (B ≥ 1), equal for equal rows and
    only for them, or None when ``b^N`` (``b`` the range of values + 1) does not fit."""
    coded = _row_digits(x, symmetric=False)
    if coded is None:
        return None
    digits, base = coded
    powers = base ** torch.arange(x.shape[1], device=x.device, dtype=torch.int64)
    return (digits * powers).sum(dim=1)  # (B,)


def _row_digits(x: torch.Tensor, symmetric: bool) -> tuple[torch.Tensor, int] | None:
    """Returns ``(digits, b)``: ``x − low`` as int64 ``(B, N)`` in ``[0, b)`` (halved when all
    even, as for spins ±1), or None when ``b^N`` does not fit one code. ``symmetric``: the
    range also holds ``−x``, so that ``b − 1 − digits`` are the digits of the spin-inverted
    rows."""
    low, high = float(x.min()), float(x.max())
    if symmetric:
        low, high = min(low, -high), max(high, -low)
    base = int(high - low) + 1
    digits = (x - low).round().to(torch.int64)
    if base > 2 and not (digits % 2).any():  # spins ±1: digits 0, 2 become 0, 1 (base 2)
        digits, base = digits // 2, (base - 1) // 2 + 1
    if base ** x.shape[1] > _MAX_CODES:
        return None
    return digits, base


# digits of the images coded at once (rows × images × sites int64: 32 MiB): a 6×6 lattice's
# 288 space-group images and their inversions are 20,736 digits a row
_ORBIT_DIGITS_PER_CHUNK = 2**22
# codes below this are sums of integers exact in float64, whatever order BLAS adds them in
_EXACT_IN_FLOAT64 = 2**53
# image codes formed at once by one product (rows × images float64: 32 MiB)
_ORBIT_CODES_PER_CHUNK = 2**22


def _orbit_codes(
    x: torch.Tensor, group: torch.Tensor, spin_flip: int
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Returns, per row of ``x`` ``(B, N)``, the smallest code over its images ``g x`` (and
    ``−g x`` with ``spin_flip``) under the permutations ``group`` ``(G, N)``, and whether that
    smallest image is a spin-inverted one; None when the rows do not fit one code each.

    Rows with equal smallest codes lie on one orbit of the group; a ψ with ``ψ(g x) = ψ(x)``
    and ``ψ(−x) = s ψ(x)`` takes the same value on all of them up to the sign ``s`` per
    inversion."""
    coded = _row_digits(x, symmetric=bool(spin_flip))
    if coded is None:
        return None
    digits, base = coded
    n_sites = x.shape[1]
    powers = base ** torch.arange(n_sites, device=x.device, dtype=torch.int64)
    if base**n_sites <= _EXACT_IN_FLOAT64:
        codes = _image_codes_by_product(digits, group, powers)
    else:
        codes = _image_codes_by_gather(digits, group, powers)
    if spin_flip:  # the digits of −x are b − 1 − digits: its code is (b − 1) Σ powers − code
        codes = torch.cat([codes, (base - 1) * powers.sum() - codes], dim=1)
    smallest, index = codes.min(dim=1)
    return smallest, index >= group.shape[0]


def _image_codes_by_product(digits, group, powers) -> torch.Tensor:
    """Returns the codes ``(B, G)`` of the images ``g x``: ``Σ_n x_{g(n)} bⁿ = Σ_m x_m b^{g⁻¹(m)}``,
    one float64 product of the digits with the powers permuted by each ``g⁻¹`` instead of
    ``B · G · N`` gathered digits. With the spins' digits halved to base 2, the orbits of
    72,000 rows of a 6×6 lattice under its 36 translations and inversion took 0.11-0.14 s on
    one core, against 1.2-2.7 s gathered in base 3."""
    weights = powers[torch.argsort(group, dim=1)].T.to(torch.float64)  # (N, G)
    step = max(1, _ORBIT_CODES_PER_CHUNK // group.shape[0])
    parts = [(part.to(torch.float64) @ weights).to(torch.int64) for part in digits.split(step)]
    return torch.cat(parts)


def _image_codes_by_gather(digits, group, powers) -> torch.Tensor:
    """`_image_codes_by_product` for codes past float64's exact integers: in int64."""
    step = max(1, _ORBIT_DIGITS_PER_CHUNK // (group.shape[0] * digits.shape[1]))
    parts = [(part[:, group] * powers).sum(dim=2) for part in digits.split(step)]
    return torch.cat(parts)


def evaluate_log_psi(model, x: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
    """Returns the complex ``log ψ(x)`` ``(B,)`` of configurations ``(B, N)``, in chunks of
    ``chunk_size`` (None: ``DEFAULT_CHUNK_SIZE``) configurations per forward pass.

    A model with real output is read as ``log ψ`` real (positive ψ).
    """
    if x.shape[0] == 0:
        return torch.zeros(0, dtype=_complex_dtype(model), device=x.device)
    step = DEFAULT_CHUNK_SIZE if chunk_size is None else chunk_size
    parts = [model(x[start : start + step]) for start in range(0, x.shape[0], step)]
    out = parts[0] if len(parts) == 1 else torch.cat(parts)  # one chunk: no copy
    return out if out.is_complex() else out.to(_complex_dtype(model))


def _complex_dtype(model) -> torch.dtype:
    param = next(model.parameters(), None)
    real = torch.float64 if param is None else param.dtype
    return torch.complex64 if real == torch.float32 else torch.complex128


@torch.no_grad()
def amplitude_ratios(
    model,
    x_conn: torch.Tensor,
    active: torch.Tensor,
    log_psi: torch.Tensor,
    chunk_size: int | None = None,
    symmetries: tuple[torch.Tensor, int] | None = None,
) -> torch.Tensor:
    """Returns ``ψ(x'_k)/ψ(x)`` ``(B, K)`` where ``active``, else 0; log ψ only on active ``x'``.

    The active connected configurations are gathered into one batch, evaluated, and
    scattered back, so inactive (padding, zero-element) entries cost nothing. A configuration
    reached from several samples (two samples one exchange apart share connected states; on
    a lattice of a few thousand states most of them repeat) is evaluated once.

    Args:
        model: ``(B, N) -> log ψ (B,)``.
        x_conn: connected configurations ``(B, K, N)``.
        active: ``(B, K)`` bool.
        log_psi: ``log ψ(x)`` of the rows ``(B,)``, complex.
        chunk_size: configurations per forward pass; None for ``DEFAULT_CHUNK_SIZE``.
        symmetries: ``(group (G, N), s)`` with ``ψ(g x) = ψ(x)`` for every permutation of
            ``group`` and ``ψ(−x) = s ψ(x)`` (s = 0: no such symmetry), as `invariances`
            finds them: then one configuration per orbit is evaluated.
    """
    rows, cols = active.nonzero(as_tuple=True)  # (M,) each
    x_active = x_conn[rows, cols]
    log_psi_conn = _log_psi_once_per_orbit(model, x_active, chunk_size, symmetries)  # (M,)
    ratios = torch.zeros(active.shape, dtype=log_psi.dtype, device=x_conn.device)
    ratios[rows, cols] = torch.exp(log_psi_conn.to(log_psi.dtype) - log_psi[rows])
    return ratios


def _log_psi_once_per_orbit(
    model, x: torch.Tensor, chunk_size: int | None, symmetries: tuple[torch.Tensor, int] | None
) -> torch.Tensor:
    """Returns ``log ψ(x)`` ``(M,)`` with one row of each orbit of ``symmetries`` evaluated
    (`_orbit_codes`), the others by symmetry: a ψ averaged over the 16 translations and the
    spin inversion of a 4×4 lattice takes one forward pass of its copies per ~32 connected
    configurations, not per one. Without symmetries, or rows that do not fit one code, as
    `_log_psi_once_per_row`."""
    orbits = None
    if symmetries is not None and x.shape[0]:
        orbits = _orbit_codes(x, *symmetries)
    if orbits is None:
        return _log_psi_once_per_row(model, x, chunk_size)
    codes, inverted = orbits
    orbit_codes, inverse = torch.unique(codes, return_inverse=True)
    first = _first_of_each(inverse, len(orbit_codes))
    log_psi = evaluate_log_psi(model, x[first], chunk_size)[inverse]
    if symmetries[1] < 0:  # ψ(x) = −ψ(y) where one of x, y reaches the orbit's least image inverted
        odd = inverted ^ inverted[first][inverse]
        log_psi = log_psi + 1j * math.pi * odd.to(log_psi.real.dtype)
    return log_psi


def model_symmetries(model, hamiltonian) -> tuple[torch.Tensor, int] | None:
    """Returns ``(group, s)``, the permutations and spin-inversion eigenvalue ``model`` is
    invariant under for any parameters (`invariances`), as `amplitude_ratios` takes them;
    None when that is the identity alone or the operator has no lattice."""
    lattice = getattr(hamiltonian, "lattice", None)
    if lattice is None:
        return None
    group, spin_flip = invariances(model, lattice)
    if len(group) == 1 and not spin_flip:
        return None
    param = next(model.parameters(), None)
    device = None if param is None else param.device
    return torch.as_tensor(np.asarray(group), dtype=torch.long, device=device), int(spin_flip)


def _log_psi_once_per_row(model, x: torch.Tensor, chunk_size: int | None) -> torch.Tensor:
    """Returns ``log ψ(x)`` ``(M,)`` with each distinct row evaluated once, where rows pack
    into one code each (``_row_codes``: up to 62 spins, or 31 sites of 0–3 bosons). Past
    that the Hilbert space is too large for connected configurations to repeat much, and
    a row-wise unique costs more than it saves: every row is evaluated."""
    codes = _row_codes(x) if x.shape[0] else None
    if codes is None:
        return evaluate_log_psi(model, x, chunk_size)
    distinct_codes, inverse = torch.unique(codes, return_inverse=True)
    first = _first_of_each(inverse, len(distinct_codes))
    return evaluate_log_psi(model, x[first], chunk_size)[inverse]


@torch.no_grad()
def local_energy(
    hamiltonian,
    model,
    x: torch.Tensor,
    log_psi: torch.Tensor | None = None,
    chunk_size: int | None = None,
) -> torch.Tensor:
    """Returns the local energies ``E_loc(x)`` of configurations ``(..., N)`` as complex ``(...)``.

    ``E_loc(x) = Σ_x' H_{xx'} exp(log ψ(x') − log ψ(x))`` over the connected configurations of
    ``hamiltonian.get_conn_padded``. The diagonal needs no network; log ψ is evaluated only
    on off-diagonal configurations with a non-zero element, in one batch per chunk, and
    only once for configurations that occur several times in ``x`` (`distinct_rows`).

    Args:
        hamiltonian: follows the operator contract (``get_conn_padded``).
        model: ``(B, N) -> log ψ (B,)``.
        x: configurations ``(..., N)``, the model's floating dtype.
        log_psi: ``log ψ(x)`` ``(...)`` when already known (e.g. from the sampler).
        chunk_size: sample configurations handled at once (bounds memory to
            ``chunk_size · max_conn`` configurations); None for as many as have
            ``DEFAULT_CONNECTED_PER_CHUNK`` connected configurations.
    """
    batch_shape, n_sites = x.shape[:-1], x.shape[-1]
    x = x.reshape(-1, n_sites)
    log_psi = None if log_psi is None else log_psi.reshape(-1)
    rows = distinct_rows(x)
    symmetries = model_symmetries(model, hamiltonian)
    if rows.n_distinct == x.shape[0]:
        e_loc = _local_energy_of_rows(hamiltonian, model, x, log_psi, chunk_size, symmetries)
        return e_loc.reshape(batch_shape)
    log_psi = None if log_psi is None else log_psi[rows.first]  # each distinct one once
    e_loc = _local_energy_of_rows(hamiltonian, model, rows.x, log_psi, chunk_size, symmetries)
    return e_loc[rows.inverse].reshape(batch_shape)


def _local_energy_of_rows(hamiltonian, model, x, log_psi, chunk_size, symmetries):
    log_psi = evaluate_log_psi(model, x, chunk_size) if log_psi is None else log_psi
    step = chunk_size
    if step is None:
        step = max(1, DEFAULT_CONNECTED_PER_CHUNK // hamiltonian.max_conn)
    parts = [
        _local_energy_chunk(hamiltonian, model, x[s : s + step], log_psi[s : s + step], symmetries)
        for s in range(0, x.shape[0], step)
    ]
    return torch.cat(parts)


def _local_energy_chunk(hamiltonian, model, x, log_psi, symmetries):
    x_conn, mels = hamiltonian.get_conn_padded(x)  # (B, K, N), (B, K)
    mels_off = mels[:, 1:]
    active = mels_off != 0
    ratios = amplitude_ratios(model, x_conn[:, 1:], active, log_psi, symmetries=symmetries)
    return mels[:, 0].to(log_psi.dtype) + (mels_off * ratios).sum(dim=1)


@dataclass(frozen=True)
class Stats:
    """Monte Carlo estimate of a mean with its uncertainty.

    Attributes:
        mean: sample mean (complex for local energies; take ``.real`` for a Hermitian H).
        error_of_mean: standard error of the mean, from the chain structure.
        variance: ``⟨|x − mean|²⟩``.
        tau_corr: integrated autocorrelation time in samples, ``Σ_{t≥1} ρ(t)`` (0: none).
        r_hat: split-chain Gelman-Rubin diagnostic (≈1 when chains agree; NaN if undefined).
        n_samples: number of samples (states of the sector for exact weights).
    """

    mean: complex
    error_of_mean: float
    variance: float
    tau_corr: float
    r_hat: float
    n_samples: int

    def __str__(self) -> str:
        return (
            f"{self.mean.real:.8f} ± {self.error_of_mean:.2e} [σ²={self.variance:.3e}, "
            f"τ={self.tau_corr:.2f}, R̂={self.r_hat:.4f}]"
        )


def statistics(values: torch.Tensor, weights: torch.Tensor | None = None) -> Stats:
    """Returns the `Stats` of samples ``(n_chains, n_per_chain)`` (or ``(n,)``: one chain).

    With ``weights`` (exact sampler) the mean and variance are exact weighted sums and the
    error is 0. Otherwise the error of the mean is ``sqrt(Var(chain means) / n_chains)``
    from two or more independent chains (the batch-means estimator, valid whatever the
    autocorrelation), and `single_chain_variance_of_mean` of ``v − mean`` from a single
    chain. ``τ`` is estimated from the chains' autocorrelation with Sokal's automatic window.
    """
    values = values.reshape(1, -1) if values.ndim == 1 else values
    flat = values.reshape(-1)
    flat_weights = None if weights is None else weights.reshape(-1)
    mean = sample_mean(flat, flat_weights)
    variance = float(sample_mean((flat - mean).abs() ** 2, flat_weights))
    n = total_count(flat.shape[0], flat.device)
    if weights is not None:
        return Stats(complex(mean), 0.0, variance, 0.0, 1.0, n)
    tau = integrated_time(values, mean, variance)
    if total_count(values.shape[0], values.device) >= 2:
        error = float(chain_error(values.mean(dim=1), mean))
    else:
        error = math.sqrt(single_chain_variance_of_mean(values - mean))
    return Stats(complex(mean), error, variance, tau, split_r_hat(values), n)


def importance_weights(log_importance: torch.Tensor) -> torch.Tensor:
    """Returns the normalised weights ``r / Σ r`` of samples with ``log r = log_importance``
    (any shape; summing to 1 over all samples of all ranks), shifted by the largest ``log r``
    so that no weight overflows."""
    log_r = log_importance.to(torch.float64)
    r = torch.exp(log_r - reduce_max(log_r.max()))
    return r / reduce_sum(r.sum())


def importance_statistics(values: torch.Tensor, weights: torch.Tensor) -> Stats:
    """Returns the `Stats` of Monte Carlo samples ``(n_chains, n_per_chain)`` of another
    distribution than the target, with normalised importance weights of the same shape.

    The mean is the self-normalised estimate ``Σ w v``, the variance ``Σ w |v − mean|²`` (both
    of the target distribution). The error of the mean is that of a ratio estimate by the
    delta method, with chains as independent units: ``sqrt(C/(C−1) Σ_c |Σ_s w_cs (v_cs −
    mean)|²)``, which is `chain_error` for equal weights. One chain uses the same linearisation
    along the chain: ``mean − μ ≈ (1/n) Σ_s u_s`` with ``u_s = n w_s (v_s − mean)``, whose
    variance is `single_chain_variance_of_mean` of the series ``u`` (its own autocorrelation:
    slowly varying weights correlate ``u`` longer than ``v``). τ and R̂ describe the chains of
    the sampled distribution (the unweighted series).
    """
    values = values.reshape(1, -1) if values.ndim == 1 else values
    weights = weights.reshape(values.shape).to(torch.float64)
    mean = reduce_sum((weights * values).sum())
    deviation = values - mean
    variance = float(reduce_sum((weights * deviation.abs() ** 2).sum()))
    plain_mean = sample_mean(values.reshape(-1))
    plain_variance = float(sample_mean((values.reshape(-1) - plain_mean).abs() ** 2))
    tau = integrated_time(values, plain_mean, plain_variance)
    n_chains = total_count(values.shape[0], values.device)
    n = total_count(values.numel(), values.device)
    if n_chains >= 2:
        per_chain = (weights * deviation).sum(dim=1).abs() ** 2
        spread = float(reduce_sum(per_chain.sum())) * n_chains / (n_chains - 1)
    else:
        spread = single_chain_variance_of_mean(n * weights * deviation)
    return Stats(complex(mean), math.sqrt(spread), variance, tau, split_r_hat(values), n)


def chain_error(chain_means: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
    """Returns the error of the mean from independent chain means ``(n_chains, ...)``.

    ``sqrt(Σ_c |m_c − mean|² / (n_chains (n_chains − 1)))``, elementwise over trailing axes;
    ``n_chains`` counts the chains of every rank.
    """
    n_chains = total_count(chain_means.shape[0], chain_means.device)
    spread = sample_mean((chain_means - mean).abs() ** 2)
    return torch.sqrt(spread / max(n_chains - 1, 1))


def integrated_time(values: torch.Tensor, mean, variance: float) -> float:
    """Returns the integrated autocorrelation time ``τ = Σ_{t=1}^{W} ρ(t)`` of chains ``(C, S)``.

    ``ρ(t)`` is the autocorrelation averaged over chains (via FFT), and ``W`` the smallest
    window with ``W ≥ 5 (1 + 2 τ(W))`` (Sokal 1997). τ = 0 for uncorrelated samples.
    """
    return _windowed_time(values, mean, variance)[0]


def single_chain_variance_of_mean(series: torch.Tensor) -> float:
    """Returns the variance of the mean of one chain's centred ``series`` ``(1, S)`` (a chain
    lives on one rank: the others hold ``(0, S)`` and get the same figure).

    ``Var(mean) = σ² (1 + 2τ) (1 + (2W + 1)/S) / S``: τ summed over Sokal's window ``W``
    (`integrated_time`), times the bias correction of U. Wolff, "Monte Carlo errors with
    less errors", Comput. Phys. Commun. 156, 143 (2004): about the chain's own mean every
    autocovariance falls short by ``≈ Var(mean)``, the window's sum by ``(2W + 1) Var(mean)``.
    Measured over repeated chains (tests/test_error_bars.py), error bar / spread of means:
    Metropolis chains of 500 steps (30 exponential times) 0.79 without it, 0.94–0.99 with
    it; importance-weighted ones 1.01–1.09 (conservative). A wider window (8 or 12 in place
    of Sokal's 5) measured lower, not higher: more lags, more of the bias the first-order
    correction leaves. Heavy, slowly varying weights (a few tens of effective samples)
    still give 0.8–0.9.
    """
    n = series.shape[1]
    variance = float(sample_mean(series.reshape(-1).abs() ** 2))
    tau, window = _windowed_time(series, 0.0, variance)
    return variance * (1 + 2 * tau) * (1 + (2 * window + 1) / n) / n


def _windowed_time(values: torch.Tensor, mean, variance: float) -> tuple[float, int]:
    """Returns `integrated_time` τ of chains ``(C, S)`` and its window ``W`` (0: none)."""
    n_per_chain = values.shape[1]
    if variance <= 0 or n_per_chain < 2:
        return 0.0, 0
    rho = sample_mean(_autocovariance(values - mean)) / variance  # (S,)
    taus = torch.cumsum(rho[1:], dim=0)  # τ(W) for W = 1 .. S-1
    windows = torch.arange(1, n_per_chain, device=values.device)
    inside = (windows >= _SOKAL_WINDOW * (1 + 2 * taus)).nonzero()
    window = int(inside[0]) if len(inside) else n_per_chain - 2
    return max(float(taus[window]), 0.0), window + 1


def _autocovariance(centred: torch.Tensor) -> torch.Tensor:
    """Returns each chain's autocovariance ``(C, S)`` at lags ``0 .. S−1`` (FFT, over ``S``)."""
    n = centred.shape[1]
    if centred.shape[0] == 0:  # a rank without chains; MKL refuses an empty transform
        return torch.zeros(centred.shape, dtype=centred.real.dtype, device=centred.device)
    spectrum = torch.fft.fft(centred, n=2 * n, dim=1)
    return torch.fft.ifft(spectrum.abs() ** 2, dim=1)[:, :n].real / n


def split_r_hat(values: torch.Tensor) -> float:
    """Returns the split-chain R̂ (Gelman et al., Bayesian Data Analysis) of chains ``(C, S)``.

    Each chain is split in halves; with ``n`` samples per half, ``W`` the mean within-half
    variance and ``B/n`` the variance of half means, ``R̂ = sqrt(((n−1)/n W + B/n) / W)``.
    NaN when halves hold fewer than 2 samples.
    """
    half = values.shape[1] // 2
    if half < 2:
        return float("nan")
    halves = torch.cat([values[:, :half], values[:, half : 2 * half]])  # (2C, n)
    half_means = halves.mean(dim=1)
    within = sample_mean(((halves - half_means[:, None]).abs() ** 2).sum(dim=1) / (half - 1))
    between = sample_mean((half_means - sample_mean(half_means)).abs() ** 2)
    n_halves = total_count(halves.shape[0], halves.device)
    between = between * n_halves / max(n_halves - 1, 1)
    if float(within) <= 0:
        return 1.0
    return math.sqrt(float(((half - 1) / half * within + between) / within))


def sample_statistics(e_loc: torch.Tensor, samples) -> Stats:
    """Returns the `Stats` of the local energies of `sampler.Samples`: exact sums for the
    full sum, importance-weighted for samples of ``|ψ|^p`` (p ≠ 2), plain Monte Carlo
    otherwise."""
    if samples.log_importance is not None:
        return importance_statistics(e_loc, importance_weights(samples.log_importance))
    return statistics(e_loc, samples.weights)
