"""The model seam: what every model family implements, and the registry that finds a family's
config and model classes by name.

The trial, the pruning methods, distillation and the export use a model only through
``PrunableModel``; the built-in families (``gpt``, ``all_attention``: trainers/model.py) and
Hugging Face causal LMs (``hf``: trainers/hf.py) implement it. A new family is one module with a
config dataclass and a model class, plus a line in ``FAMILIES`` and its test.
"""

from __future__ import annotations

import importlib
from typing import Protocol

import torch


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


# family name -> (module, config class, model class); modules are imported when first used, so
# a study of the built-in families never imports transformers.
FAMILIES: dict[str, tuple[str, str, str]] = {
    "gpt": ("trainers.model", "ModelConfig", "LanguageModel"),
    "all_attention": ("trainers.model", "ModelConfig", "LanguageModel"),
    "hf": ("trainers.hf", "HFModelConfig", "HFLanguageModel"),
}


def _classes(family: str) -> tuple[type, type]:
    if family not in FAMILIES:
        raise ValueError(f"model family must be one of {tuple(FAMILIES)}, got {family!r}")
    module, config_class, model_class = FAMILIES[family]
    loaded = importlib.import_module(module)
    return getattr(loaded, config_class), getattr(loaded, model_class)


def config_from_dict(data: dict) -> FamilyConfig:
    """A family's config from its ``to_dict()``."""
    config_class, _ = _classes(data.get("family", "gpt"))
    return config_class.from_dict(data)


def build_model(cfg: FamilyConfig) -> PrunableModel:
    """A model of ``cfg``'s shapes (weights initialised, or to be loaded with ``load_saved_state``)."""
    _, model_class = _classes(cfg.family)
    return model_class(cfg)
