"""The exceptions the CLI turns into one line: a user's mistake (exit 2), a lost lease (exit 1)."""

from __future__ import annotations

import difflib


class UserError(Exception):
    """A problem with the user's input (file, key, value, URL); never a bug of ours."""


def closest(name: str, options) -> str:
    """' (did you mean 'x'?)' for the nearest known name, or ''."""
    match = difflib.get_close_matches(name, list(options), n=1)
    return f" (did you mean {match[0]!r}?)" if match else ""


class LeaseLost(Exception):
    """The driver no longer holds its study's lease (another driver took it, or it could not be
    renewed for a whole TTL): it stops asking and telling at once, and the CLI exits 1."""
