"""Validation helpers shared by the model constructors; messages name the ``model.<key>``."""

from __future__ import annotations


def check_choice(key: str, value, allowed: tuple):
    """Returns ``value`` if it is one of ``allowed``; raises ValueError naming ``model.<key>``."""
    if value not in allowed:
        raise ValueError(f"model.{key}={value!r} is not one of the allowed values {list(allowed)}")
    return value


def check_positive_int(key: str, value) -> int:
    """Returns ``value`` as int if it is a positive integer; raises ValueError otherwise."""
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise ValueError(f"model.{key}={value!r} must be a positive integer")
    return int(value)


def check_heads_divide(d_model: int, heads: int) -> None:
    """Raises ValueError unless ``heads`` divides ``d_model`` (each head gets d_model/heads)."""
    if d_model % heads:
        raise ValueError(f"model.heads={heads} must divide model.d_model={d_model}")
