"""The model seam: what every model family implements, and the registry that finds a family by
name.

The trial, the pruning methods, distillation and the export use a model only through
``PrunableModel``. A family (``ModelFamily``) declares the rest end to end: its ``[model]`` keys
besides the shared ones, how a study's ``[model]`` table becomes its config, whether a study
starts from a model of the user's (and how that is checked, read and named), how a trained
model is exported and read back. The built-in families (``gpt``, ``all_attention``:
trainers/model.py) and Hugging Face causal LMs (``hf``: trainers/hf/family.py) register here; a
new family is one module that calls ``register_family`` (listed in ``BUILT_IN_MODULES``, or a
module of your own named in ``HEADPRUNE_PLUGINS``: trainers/plugins.py), plus its test.
"""

from __future__ import annotations

import importlib
import json
import shutil
from collections.abc import Collection
from pathlib import Path
from typing import Any, Protocol

import torch

from trainers.plugins import import_plugins

# The [model] keys every family takes (specs as trainers.knobs.field_specs gives them): what a
# model built from sizes is, and the window it trains on.
SHARED_MODEL_KEYS: dict[str, dict] = {
    "n_layer": {"type": int, "default": 4, "low": 1, "doc": "Transformer layers"},
    "n_head": {"type": int, "default": 8, "low": 1, "doc": "attention (query) heads per layer"},
    "d_model": {"type": int, "default": 128, "low": 1, "doc": "model width; a multiple of n_head"},
    "block_size": {"type": int, "default": 128, "low": 1, "doc": "tokens per training and evaluation window"},
    "dropout": {
        "type": float,
        "default": 0.0,
        "low": 0.0,
        "high": 1.0,
        "high_open": True,
        "doc": "dropout probability while training (not with hf path)",
    },
}


class FamilyConfig(Protocol):
    family: str

    @property
    def layer_heads(self) -> tuple[int, ...]: ...  # (query) heads per layer, now

    @property
    def block_size(self) -> int: ...  # the training and evaluation window

    @property
    def vocab_size(self) -> int: ...

    def to_dict(self) -> dict: ...  # JSON; ``from_dict`` of the config class reads it back


class PrunableModel(Protocol):
    cfg: FamilyConfig

    def __call__(
        self, idx: torch.Tensor, head_gates: list[torch.Tensor] | None = None, return_attn: bool = False
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Logits (B, T, vocab); each head's output multiplied by its gate (one tensor per
        layer) before the output projection; with ``return_attn`` each layer's attention output
        after the projection (what peer distillation matches)."""

    def loss(self, idx: torch.Tensor, targets: torch.Tensor, head_gates=None) -> torch.Tensor: ...

    def prune_heads(self, keep: list[list[int]], head_scale: list[float] | None = None) -> PrunableModel:
        """A new, smaller model with only the heads in ``keep`` (per layer), computing what the
        masked model computes."""

    def count_parameters(self) -> tuple[int, int]: ...  # (total, non-embedding), tied weights once

    def saved_state(self) -> dict[str, torch.Tensor]: ...  # weights for safetensors, ties dropped

    def load_saved_state(self, state: dict[str, torch.Tensor]) -> None: ...


class ModelFamily:
    """A model family, as the orchestrator and the export see it: a family subclasses this and
    overrides what it has (the defaults are a family built from sizes, exported in the project's
    own format, trainers/export.py). Errors a user can cause are ``ValueError`` with a message
    naming the key; the caller adds the file."""

    name: str
    keys: dict[str, dict] = {}  # its [model] keys besides SHARED_MODEL_KEYS: specs with type, default, doc
    min_heads_per_layer = 0  # heads a layer must keep (a transformers layer cannot have none)

    def check_table(self, model: dict[str, Any], given: Collection[str]) -> None:
        """Rules between ``[model]``'s values (defaults filled in; ``given``: the keys written)."""

    def user_model(self, model: dict[str, Any], base: Path) -> str | None:
        """The model of the user's a study starts from (``base``: the study file's folder), or
        None for a model built from the sizes."""
        return None

    def check_user_model(self, path: str, block_size: int) -> None:
        """Cheap checks of a user's model before anything is tokenized (config, weight files)."""

    def model_config(self, model: dict[str, Any], vocab_size: int, user_model: str | None) -> FamilyConfig:
        """The config of the study's dense model."""
        raise NotImplementedError

    def config_from_dict(self, data: dict) -> FamilyConfig:
        raise NotImplementedError

    def build_model(self, cfg: FamilyConfig) -> PrunableModel:
        """A model of ``cfg``'s shapes (weights initialised, or to be loaded)."""
        raise NotImplementedError

    def load_user_model(self, path: str, block_size: int) -> PrunableModel:
        raise ValueError(f"family {self.name!r} does not start from a model of yours")

    def user_model_digest(self, path: str) -> str:
        """Names the user's weights: a cached dense checkpoint is reused for the same ones only."""
        raise ValueError(f"family {self.name!r} does not start from a model of yours")

    def export(self, model: PrunableModel, tokenizer: Any, source: Path, target: Path) -> None:
        """Write a trial's model (as the trial saved it in ``source``, trainers/export.py) to the
        new folder ``target``: by default that folder as it is."""
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("after_prune", ".*"))

    def reads_export(self, config: dict) -> bool:
        """Whether an exported folder whose config.json holds ``config`` is in a format of this
        family's own (not the project's, which ``trainers.export.load_model`` reads)."""
        return False

    def load_export(self, folder: Path, device: str) -> tuple[Any, Any]:
        """(model, tokenizer) of such a folder, ready to generate."""
        raise NotImplementedError


# Modules that register the built-in families, imported when the registry is first read: a
# study of the built-in families never imports transformers (trainers/hf/family.py imports it
# when the family is used).
BUILT_IN_MODULES = ("trainers.model", "trainers.hf.family")
_REGISTRY: dict[str, ModelFamily] = {}
_discovered = False


def register_family(family: ModelFamily) -> ModelFamily:
    if family.name in _REGISTRY:
        raise ValueError(f"model family {family.name!r} is registered twice")
    clash = set(family.keys) & set(SHARED_MODEL_KEYS)
    if clash:
        raise ValueError(f"model family {family.name!r}: {sorted(clash)} are every family's keys")
    _REGISTRY[family.name] = family
    return family


def families() -> dict[str, ModelFamily]:
    global _discovered
    if not _discovered:
        _discovered = True  # before the imports: a module being imported may ask for the families
        try:
            for module in BUILT_IN_MODULES:
                importlib.import_module(module)
            import_plugins()
        except BaseException:
            _discovered = False  # asked again, the imports are tried again
            raise
    return dict(_REGISTRY)


def family(name: str) -> ModelFamily:
    found = families().get(name)
    if found is None:
        raise ValueError(f"model family must be one of {tuple(families())}, got {name!r}")
    return found


def config_from_dict(data: dict) -> FamilyConfig:
    """A family's config from its ``to_dict()``."""
    return family(data.get("family", "gpt")).config_from_dict(data)


def build_model(cfg: FamilyConfig) -> PrunableModel:
    """A model of ``cfg``'s shapes (weights initialised, or to be loaded with ``load_saved_state``)."""
    return family(cfg.family).build_model(cfg)


def export_family(folder: Path) -> ModelFamily | None:
    """The family whose own format an exported folder is in (None: the project's format, or no
    readable config.json, which ``trainers.export.load_model`` then reports)."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return next((f for f in families().values() if isinstance(config, dict) and f.reads_export(config)), None)
