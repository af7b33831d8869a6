"""The physics of a lattice model, without networks, sampling or files.

`lattice` (sites, bonds, translations, the space group), `hilbert` (fixed-Sz spins and
fixed-N bosons: states, ranking, enumeration), `operators` (Heisenberg J1-J2 and Bose-Hubbard
under the ``get_conn_padded`` contract, sparse matrices for ED), `symmetry` (orbits of a
sector under lattice symmetries and spin inversion), `exact` (ED with its cache), `bethe`
(the Heisenberg ring's Bethe-ansatz energy), `reference` (energies past ED: Bethe ansatz,
published) and `observables` (expectation values of a state vector over a sector).

May import: numpy, scipy, torch, and from vitqs only the base (`config` for the defaults
of its constructors, `errors`). Nothing of `models`, `vmc` or the shell.
"""
