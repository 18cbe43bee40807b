"""How a setting is declared: a dataclass field carrying the bounds or choices a study file's
value is checked against, and a one-line doc (the generated study-file reference reads it).

The orchestrator validates a study through these specs (``field_specs``) without knowing what
the numbers mean; a pruning method declares its own knobs with them, beside its code
(``trainers/pruning/``).
"""

from __future__ import annotations

from dataclasses import Field, field, fields


def bounded(
    default, low=None, high=None, *, low_open=False, high_open=False, kind=None, methods=None, doc=""
) -> Field:
    """A dataclass field with the numeric bounds a config value is checked against (``low_open``:
    the low bound itself refused, as for a value something is divided by); ``methods`` names the
    pruning methods it applies to (None: all), so a search suggests it only for them."""
    bounds = {"low": low, "high": high, "low_open": low_open, "high_open": high_open}
    meta = {**bounds, "methods": methods, "doc": doc, "type": kind or type(default)}
    return field(default=default, metadata=meta)


def choice(default, choices, *, methods=None, doc="") -> Field:
    """A dataclass field whose value must be one of ``choices``."""
    meta = {"choices": tuple(choices), "type": type(default), "methods": methods, "doc": doc}
    return field(default=default, metadata=meta)


def field_specs(cls) -> dict[str, dict]:
    """{name: {type, default, low, high, choices, ...}} for validating a config table."""
    return {f.name: {"default": f.default, **dict(f.metadata)} for f in fields(cls)}
