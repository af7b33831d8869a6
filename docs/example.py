"""vitqs from Python: a Heisenberg ring against its exact energy, then two points of a
Bose-Hubbard scan read back from their files. Run from anywhere: ``python docs/example.py``
(about half a minute on one CPU core; the results go to ``example_runs/`` in the working
folder).

Everything here is what ``vitqs run`` does: the config is checked as a config file is, each
run writes its results file, and the numbers come back from that file.
"""

import vitqs

OUT = {"dir": "example_runs"}

# The spin-1/2 Heisenberg ring of 8 sites: its exact energy (ED) comes with the result.
ring = {
    "name": "ring8",
    "seed": 1,
    "threads": 1,
    "lattice": {"shape": [8], "pbc": True},
    "hamiltonian": {"kind": "heisenberg", "J1": 1.0, "sign_rule": True},
    "model": {"patch_size": 2, "d_model": 8, "heads": 2, "layers": 1},
    "sampler": {"n_samples": 256, "n_chains": 32},
    "optimizer": {"lr": 0.05, "n_iter": 60},
    "final": {"n_samples": 4096},
    "output": OUT,
}
r = vitqs.run(ring, overwrite=True)
print(r)
print(f"E = {r.energy:.6f} ± {r.energy_error:.1e}, exact {r.exact_energy:.6f} ({r.reference})")
print(f"relative error {r.relative_error:+.2e}, V-score {r.v_score:.2e}")
print(f"first and last step: {r.history['energy'][0]:.4f} -> {r.history['energy'][-1]:.4f}")
print("S(q):", r.observables["structure_factor"].round(3))

# The same run read back from its file; the trained network rebuilt from its checkpoint.
again = vitqs.load(r.path)
assert again.energy == r.energy and (again.history["energy"] == r.history["energy"]).all()
n_params = sum(p.numel() for p in again.model.parameters())
print(f"{again.path}: {n_params} parameters, {again.n_iter} steps, {again.seconds:.1f} s")

# Two points of a Bose-Hubbard chain (N = L = 4) across the Mott transition, one run each:
# overrides by section, as --set does key by key.
boson = {
    **ring,
    "name": None,
    "lattice": {"shape": [4], "pbc": True},
    "hamiltonian": {"kind": "bose_hubbard", "J": 1.0, "U": 2.0, "n_particles": 4},
    "model": {**ring["model"], "embedding": "onehot"},
}
for U in (2.0, 16.0):
    point = vitqs.run(boson, overwrite=True, name=f"bh_U{U:g}", hamiltonian={"U": U})
    condensate = float(point.observables["condensate_fraction"].real)
    print(
        f"U = {U:4g}: E = {point.energy:.5f} (exact {point.exact_energy:.5f}), "
        f"condensate fraction {condensate:.3f}"
    )
