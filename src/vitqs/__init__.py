"""vitqs: ground states of quantum lattice models with Vision-Transformer wave functions.

Layers, each importing only from those above it (ARCHITECTURE.md draws one step):

- the base: `config` (the schema of every option), `errors`, `distributed` (every
  collective), `h5tree`, `yamlfile`;
- `physics/`: lattices, Hilbert sectors, Hamiltonians, symmetry orbits, ED;
- `models/`: the wave functions;
- `vmc/`: samplers, estimators, SR, the loop;
- the shell: `build`, `run`, `checkpoint`, `workfile`, `results`, `sweep`, `report`,
  `plots`, `benchmark`, `cli`.
"""

__version__ = "0.1.0"
