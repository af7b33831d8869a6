"""Our exact ground-state energies on every lattice kind against NetKet's, each side on its own
lattice and operator.

NetKet builds the lattice in one line (``Triangular``, ``Honeycomb``, ``Kagome``, a ``Lattice``
with a square basis for the ladder), its Heisenberg operator on Pauli matrices (energies 4×
ours) and its Bose-Hubbard operator (the same as ours); ``nk.exact.lanczos_ed`` gives its
ground-state energy. A ladder with ``J_leg ≠ J_rung`` needs a graph whose edge colours say leg
or rung: it is built from NetKet's own ladder edges, coloured by their direction.

Usage::

    python scripts/lattice_ed_crosscheck.py            # the systems of issue 31, a table
    python scripts/lattice_ed_crosscheck.py --json     # one JSON line per system
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from vitqs.physics import exact
from vitqs.physics.lattice import Lattice
from vitqs.physics.operators import BoseHubbard, Heisenberg

PAULI_TO_SPIN = 0.25  # netket's Heisenberg uses σ·σ = 4 S·S

# (label, lattice kind, shape, Hamiltonian keyword arguments): the systems issue 31 names
SYSTEMS = [
    ("triangular 4x4 Heisenberg", "triangular", (4, 4), {"J1": 1.0}),
    ("triangular 6x3 Heisenberg", "triangular", (6, 3), {"J1": 1.0}),
    ("honeycomb 3x3 J1", "honeycomb", (3, 3), {"J1": 1.0}),
    ("honeycomb 3x3 J1-J2 (J2 = 0.2)", "honeycomb", (3, 3), {"J1": 1.0, "J2": 0.2}),
    ("kagome 2x2 Heisenberg", "kagome", (2, 2), {"J1": 1.0}),
    ("kagome 2x3 Heisenberg", "kagome", (2, 3), {"J1": 1.0}),
    ("ladder L = 10, J_rung = J_leg", "ladder", (10, 2), {"J1": 1.0}),
    ("Bose-Hubbard triangular 3x3, N = 9, U = 10", "triangular", (3, 3), {"U": 10.0, "n": 9}),
    # n_max = 3: NetKet cannot index the Fock space of 12 sites with up to 12 bosons each
    (
        "Bose-Hubbard honeycomb 2x3, N = 12, U = 10, n_max = 3",
        "honeycomb",
        (2, 3),
        {"U": 10.0, "n": 12, "n_max": 3},
    ),
]


def netket_graph(lattice: Lattice, max_neighbor_order: int = 2):
    """Returns NetKet's own lattice of the same kind, shape and boundaries (its site order)."""
    import netket as nk

    pbc = list(lattice.pbc)
    shape = list(lattice.shape)
    if lattice.kind == "chain":
        return nk.graph.Chain(shape[0], pbc=pbc[0], max_neighbor_order=max_neighbor_order)
    if lattice.kind in ("square", "ladder"):
        return nk.graph.Lattice(
            basis_vectors=np.eye(2), extent=shape, pbc=pbc, max_neighbor_order=max_neighbor_order
        )
    builder = {
        "triangular": nk.graph.Triangular,
        "honeycomb": nk.graph.Honeycomb,
        "kagome": nk.graph.Kagome,
    }[lattice.kind]
    return builder(shape, pbc=pbc, max_neighbor_order=max_neighbor_order)


def _ladder_graph(graph):
    """Returns NetKet's ladder edges recoloured: 0 along the legs, 1 across them (rungs)."""
    import netket as nk

    positions = np.asarray(graph.positions)
    edges = []
    for i, j in np.asarray(graph.edges(filter_color=0)).tolist():
        rung = abs(positions[i, 1] - positions[j, 1]) > 1e-9
        edges.append((i, j, int(rung)))
    return nk.graph.Graph(edges=edges, n_nodes=graph.n_nodes)


def netket_operator(hamiltonian):
    """Returns ``(operator, factor)``: NetKet's operator for one of ours and the factor that
    turns its energies into ours."""
    import netket as nk

    lattice = hamiltonian.lattice
    if isinstance(hamiltonian, BoseHubbard):
        graph = netket_graph(lattice, 1)
        hilbert = nk.hilbert.Fock(
            n_max=hamiltonian.n_max, N=graph.n_nodes, n_particles=hamiltonian.hilbert.n_particles
        )
        op = nk.operator.BoseHubbard(
            hilbert, graph, U=hamiltonian.U, J=hamiltonian.J, mu=hamiltonian.mu
        )
        return op, 1.0
    graph = netket_graph(lattice, 2 if hamiltonian.J2 else 1)
    couplings = [hamiltonian.J1, hamiltonian.J2] if hamiltonian.J2 else [hamiltonian.J1]
    if lattice.kind == "ladder" and (hamiltonian.J_leg, hamiltonian.J_rung) != (None, None):
        if hamiltonian.J2:
            raise ValueError("a ladder with J_leg/J_rung and J2 is not built for NetKet here")
        graph = _ladder_graph(graph)
        leg = hamiltonian.J1 if hamiltonian.J_leg is None else hamiltonian.J_leg
        rung = hamiltonian.J1 if hamiltonian.J_rung is None else hamiltonian.J_rung
        couplings = [leg, rung]
    hilbert = nk.hilbert.Spin(0.5, N=graph.n_nodes, total_sz=hamiltonian.hilbert.total_sz)
    signs = [False] * len(couplings)  # netket's default is the Marshall sign on bipartite graphs
    op = nk.operator.Heisenberg(hilbert, graph, J=couplings, sign_rule=signs)
    return op, PAULI_TO_SPIN


def netket_ground_energy(hamiltonian) -> float:
    """Returns NetKet's Lanczos ground-state energy of one of our Hamiltonians, in our units."""
    import netket as nk

    op, factor = netket_operator(hamiltonian)
    return factor * float(nk.exact.lanczos_ed(op, k=1)[0])


def build(kind, shape, arguments):
    lattice = Lattice(shape, True, kind=kind)
    if "U" in arguments:
        n = arguments["n"]
        n_max = arguments.get("n_max", n)
        return BoseHubbard(lattice, J=1.0, U=arguments["U"], n_particles=n, n_max=n_max)
    return Heisenberg(lattice, **arguments)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON line per system")
    parser.add_argument("--only", nargs="+", metavar="WORD", help="systems whose label has these")
    args = parser.parse_args(argv)
    if not args.json:
        print("| system | sites | dimension | ours E/N | netket E/N | abs. difference |")
        print("|---|---|---|---|---|---|")
    for label, kind, shape, arguments in SYSTEMS:
        if args.only and not all(word in label for word in args.only):
            continue
        hamiltonian = build(kind, shape, arguments)
        start = time.perf_counter()
        ours = exact.ground_state(hamiltonian, max_dim=10**7, use_cache=False)
        seconds_ours = time.perf_counter() - start
        start = time.perf_counter()
        theirs = netket_ground_energy(hamiltonian)
        seconds_theirs = time.perf_counter() - start
        n = hamiltonian.n_sites
        row = {
            "system": label,
            "n_sites": n,
            "dimension": ours.dimension,
            "energy": ours.energy,
            "netket_energy": theirs,
            "difference": abs(ours.energy - theirs),
            "seconds": seconds_ours,
            "netket_seconds": seconds_theirs,
        }
        if args.json:
            print(json.dumps(row))
        else:
            print(
                f"| {label} | {n} | {ours.dimension:,} | {ours.energy / n:.12f} | "
                f"{theirs / n:.12f} | {row['difference']:.1e} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
