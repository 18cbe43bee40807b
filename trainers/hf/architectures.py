"""What differs between the transformers architectures the ``hf`` family prunes: one module per
architecture (``gpt2.py``, ``gpt_neox.py``, ``llama.py``, as transformers keeps one modelling
file per architecture), each an ``Architecture`` registered here. A new architecture is one such
module, listed in ``MODULES``, plus its test."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the architectures' modules import transformers; this one is read without it
    import torch
    from torch import nn
    from transformers import PreTrainedModel


@dataclass(frozen=True)
class Architecture:
    name: str  # transformers' model_type
    # The config keys of its sizes: layers, query heads, width, positions.
    size_keys: tuple[str, str, str, str]
    output_projection: str  # the attention module's attribute of its output projection
    grouped_query: bool  # key/value heads may be fewer than query heads
    # The config keys of a fresh small model: (n_layer, n_head, d_model, block_size, n_kv_head,
    # dropout) -> sizes, MLP width and dropouts (architecture_config adds the rest).
    config_sizes: Callable[[int, int, int, int, int, float], dict]
    attention_modules: Callable[[PreTrainedModel], list[nn.Module]]  # one per layer
    # Slice one attention module down to query ``heads`` and key/value ``kv_heads`` (indices in
    # its current numbering, sorted), ``scale`` folded into the output projection: (attention,
    # d_head, heads, kv_heads, scale).
    keep_heads: Callable[[nn.Module, int, list[int], list[int], float], None]
    # Embeddings besides the input one (GPT-2's learned positions): not counted as non-embedding.
    extra_embeddings: Callable[[PreTrainedModel], list[torch.Tensor]] = lambda hf: []


MODULES = ("gpt2", "gpt_neox", "llama")  # each named after its model_type
_REGISTRY: dict[str, Architecture] = {}


def architectures() -> dict[str, Architecture]:
    if not _REGISTRY:
        for name in MODULES:
            found = importlib.import_module(f"trainers.hf.{name}").ARCHITECTURE
            _REGISTRY[found.name] = found
    return _REGISTRY


def grouped_query() -> list[str]:
    """The architectures whose key/value heads may be fewer than their query heads."""
    return [name for name, found in architectures().items() if found.grouped_query]


def architecture(name: str) -> Architecture:
    found = architectures().get(name)
    if found is None:
        raise ValueError(
            f"model_type {name!r} is not supported; the hf family supports {tuple(architectures())}"
        )
    return found
