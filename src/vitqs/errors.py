"""Helpers for the one-line errors every vitqs command ends with."""

from __future__ import annotations


def first_line(err: BaseException, limit: int = 300) -> str:
    """Returns the first non-blank line of ``err``'s message (at most ``limit`` characters),
    or its type's name: library errors (h5py, torch, gloo) often span many lines."""
    for line in str(err).splitlines():
        if line.strip():
            return line.strip()[:limit]
    return type(err).__name__
