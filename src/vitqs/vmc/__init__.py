"""Variational Monte Carlo: from a model and a Hamiltonian to optimised parameters.

`sampler` (the `Sampler` interface: Metropolis chains, and exact sums over a sector),
`estimators` (local energies, `Stats` with autocorrelation-aware error bars), `observables`
(sampled correlations, densities, the condensate fraction), `sr` (log-derivatives, SR and
minSR), `optimizers` (schedules), `driver` (the loop, which owns what changes between
its steps) and `callbacks` (what watches the physics of the loop: frozen chains).

May import: `vitqs.physics`, `vitqs.models`, and the base (`config`, `distributed`,
`errors`). No file, YAML or CLI: the shell drives the loop and writes what it yields.
"""
