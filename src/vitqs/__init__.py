"""vitqs: ground states of quantum lattice models with Vision-Transformer wave functions."""

__version__ = "0.1.0"
