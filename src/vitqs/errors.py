"""The errors every vitqs command ends with, in one line.

`ConfigError` is the one for bad input; the CLI turns it into exit code 2. It lives here,
below every other module, so that `distributed` (which raises it on every rank) needs
nothing but torch.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value is missing, unknown, of the wrong type or out of range."""


def first_line(err: BaseException, limit: int = 300) -> str:
    """Returns the first non-blank line of ``err``'s message (at most ``limit`` characters),
    or its type's name: library errors (h5py, torch, gloo) often span many lines."""
    for line in str(err).splitlines():
        if line.strip():
            return line.strip()[:limit]
    return type(err).__name__


def describe(value) -> str:
    """Returns ``value`` as a message shows a wrong one: its repr and its type."""
    return f"{value!r} ({type(value).__name__})"
