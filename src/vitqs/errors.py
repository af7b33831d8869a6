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


def shown(value, limit: int = 80) -> str:
    """Returns the repr of ``value`` cut at ``limit`` characters: a message that quotes a
    wrong value stays one readable line, however large the value."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def describe(value, limit: int = 80) -> str:
    """Returns ``value`` as a message shows a wrong one: its repr (cut at ``limit``
    characters) and its type."""
    return f"{shown(value, limit)} ({type(value).__name__})"
