"""GPT-NeoX (Pythia): ``query_key_value`` rows per head [q_h | k_h | v_h], ``dense`` columns per
head; one key/value head per query head."""

from __future__ import annotations

import torch
from torch import nn

from trainers.hf.architectures import Architecture
from trainers.hf.slicing import pick, set_weights, units

SIZE_KEYS = ("num_hidden_layers", "num_attention_heads", "hidden_size", "max_position_embeddings")


def config_sizes(n_layer: int, n_head: int, d_model: int, block_size: int, n_kv_head: int, dropout: float):
    sizes = dict(zip(SIZE_KEYS, (n_layer, n_head, d_model, block_size), strict=True))
    return {
        **sizes,
        "intermediate_size": 4 * d_model,
        "hidden_dropout": dropout,
        "attention_dropout": dropout,
    }


@torch.no_grad()
def keep_heads(
    attention: nn.Module, d_head: int, heads: list[int], kv_heads: list[int], scale: float
) -> None:
    if heads != kv_heads:
        raise ValueError("gpt_neox has one key/value head per query head")
    qkv = attention.query_key_value
    rows = units(heads, 3 * d_head)
    set_weights(qkv, pick(qkv.weight, 0, rows), pick(qkv.bias, 0, rows))
    cols = units(heads, d_head)
    set_weights(attention.dense, pick(attention.dense.weight, 1, cols) * scale, None)


ARCHITECTURE = Architecture(
    name="gpt_neox",
    size_keys=SIZE_KEYS,
    output_projection="dense",
    grouped_query=False,
    config_sizes=config_sizes,
    attention_modules=lambda hf: [layer.attention for layer in hf.gpt_neox.layers],
    keep_heads=keep_heads,
)
