"""vitqs: ground states of quantum lattice models with Vision-Transformer wave functions.

Layers, each importing only from those above it (ARCHITECTURE.md draws one step):

- the base: `config` (the schema of every option), `errors`, `distributed` (every
  collective), `h5tree`, `yamlfile`;
- `physics/`: lattices, Hilbert sectors, Hamiltonians, symmetry orbits, ED;
- `models/`: the wave functions;
- `vmc/`: samplers, estimators, SR, the loop;
- the shell: `build`, `run`, `checkpoint`, `workfile`, `results`, `sweep`, `report`,
  `plots`, `benchmark`, `cli`, and `api` (the Python entry points below).

From Python (`vitqs.api`; the same code path as ``vitqs run``)::

    import vitqs
    r = vitqs.run("configs/quickstart.yaml", optimizer={"n_iter": 5})
    print(r.energy, r.energy_error, r.relative_error, r.history["energy"][-1])
    again = vitqs.load(r.path)
"""

__version__ = "0.1.0"

_API = ("run", "load", "Result")


def __getattr__(name: str):
    # torch loads with the API: `import vitqs` (and the CLI's --help) stays quick without it
    if name in _API:
        from vitqs import api

        return getattr(api, name)
    raise AttributeError(f"module 'vitqs' has no attribute {name!r}")
