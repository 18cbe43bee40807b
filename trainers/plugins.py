"""Modules of a user's own that register pruning methods or model families, named in the
``HEADPRUNE_PLUGINS`` environment variable (comma-separated module names, importable where the
driver and the Ray workers run). The registries import them when they first list what they hold,
in every process, so a trial on a worker finds the method its driver chose."""

from __future__ import annotations

import importlib
import os

PLUGINS_ENV = "HEADPRUNE_PLUGINS"


class PluginError(ImportError):
    """A module ``HEADPRUNE_PLUGINS`` names that cannot be imported: a user's mistake, one line."""


def plugin_modules() -> list[str]:
    return [name.strip() for name in os.environ.get(PLUGINS_ENV, "").split(",") if name.strip()]


def import_plugins() -> None:
    """Import every module ``HEADPRUNE_PLUGINS`` names (each once: Python's import caches it)."""
    for name in plugin_modules():
        try:
            importlib.import_module(name)
        except Exception as err:  # its own error, whatever it is: the user's module, not ours
            reason = f"{type(err).__name__}: {err}"
            raise PluginError(f"{PLUGINS_ENV} names {name!r}, which cannot be imported ({reason})") from err
