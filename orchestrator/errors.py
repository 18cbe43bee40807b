"""The one exception a user's mistake becomes: the CLI prints its message on one line, exits 2."""

from __future__ import annotations

import difflib


class UserError(Exception):
    """A problem with the user's input (file, key, value, URL); never a bug of ours."""


def closest(name: str, options) -> str:
    """' (did you mean 'x'?)' for the nearest known name, or ''."""
    match = difflib.get_close_matches(name, list(options), n=1)
    return f" (did you mean {match[0]!r}?)" if match else ""
