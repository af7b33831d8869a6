"""Times our exact diagonalization against netket's ``lanczos_ed`` on the same Hamiltonians.

Usage: python scripts/bench_exact.py [--rows heisenberg_4x4,heisenberg_6x4,bose_hubbard_chain12]

Each row builds the Hamiltonian in both codes, solves for the ground state without any cache,
checks that the energies agree (netket's Heisenberg is 4x ours: Pauli matrices), and prints
the wall seconds of each (matrix build + Lanczos) and the ratio ours/netket.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

from vitqs.physics import exact
from vitqs.physics.lattice import Lattice
from vitqs.physics.operators import BoseHubbard, Heisenberg

ROWS = {
    "heisenberg_4x4": {"shape": (4, 4), "kind": "heisenberg"},
    "heisenberg_6x4": {"shape": (6, 4), "kind": "heisenberg"},
    "bose_hubbard_chain12": {"shape": (12,), "kind": "bose_hubbard", "U": 3.3, "n_particles": 12},
    # netket cannot index the uncut sector above (13^12 codes); a cutoff both codes handle
    "bose_hubbard_chain12_nmax4": {
        "shape": (12,),
        "kind": "bose_hubbard",
        "U": 3.3,
        "n_particles": 12,
        "n_max": 4,
    },
}


def ours(row: dict) -> tuple[float, float, int]:
    """Returns (energy, seconds, dimension) of our ED, build and solve included."""
    start = time.perf_counter()
    lattice = Lattice(row["shape"], pbc=True)
    if row["kind"] == "heisenberg":
        ham = Heisenberg(lattice)
    else:
        ham = BoseHubbard(
            lattice, J=1.0, U=row["U"], n_particles=row["n_particles"], n_max=row.get("n_max")
        )
    result = exact.ground_state(ham, use_cache=False)
    return result.energy, time.perf_counter() - start, result.dimension


def theirs(row: dict) -> tuple[float, float]:
    """Returns (energy in our units, seconds) of netket's lanczos_ed, build and solve included."""
    import netket as nk

    start = time.perf_counter()
    graph = nk.graph.Grid(list(row["shape"]), pbc=True)
    if row["kind"] == "heisenberg":
        hilbert = nk.hilbert.Spin(0.5, N=graph.n_nodes, total_sz=0)
        operator, factor = nk.operator.Heisenberg(hilbert, graph), 0.25
    else:
        n = row["n_particles"]
        hilbert = nk.hilbert.Fock(n_max=row.get("n_max", n), N=graph.n_nodes, n_particles=n)
        operator, factor = nk.operator.BoseHubbard(hilbert, graph, U=row["U"], J=1.0), 1.0
    energy = nk.exact.lanczos_ed(operator)[0]
    return factor * float(energy), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=",".join(ROWS), help="comma-separated row names")
    parser.add_argument("--no-netket", action="store_true", help="time ours only")
    args = parser.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {platform.system()}")
    print(f"{'system':<22} {'dimension':>10} {'ours s':>8} {'netket s':>9} {'ratio':>6}  energy")
    for name in args.rows.split(","):
        energy, seconds, dim = ours(ROWS[name])
        line = {"system": name, "dimension": dim, "ours_s": seconds, "energy": energy}
        if not args.no_netket:
            try:
                nk_energy, nk_seconds = theirs(ROWS[name])
            except RuntimeError as err:  # netket refuses some sectors outright
                print(f"{name}: netket failed: {err}", flush=True)
                line["netket_error"] = str(err)
            else:
                if abs(nk_energy - energy) > 1e-8 * abs(energy):
                    raise SystemExit(f"{name}: energies differ: ours {energy} netket {nk_energy}")
                line.update(netket_s=nk_seconds, ratio=seconds / nk_seconds)
        nk_text = (
            f"{line.get('netket_s', float('nan')):>9.2f} {line.get('ratio', float('nan')):>6.2f}"
        )
        print(f"{name:<22} {dim:>10} {seconds:>8.2f} {nk_text}  {energy:.10f}", flush=True)
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
