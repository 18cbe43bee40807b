"""Llama: ``q_proj`` rows per query head, ``k_proj``/``v_proj`` rows per key/value head (grouped-
query attention: fewer of them), ``o_proj`` columns per query head."""

from __future__ import annotations

import torch
from torch import nn

from trainers.hf.architectures import Architecture
from trainers.hf.gpt_neox import SIZE_KEYS
from trainers.hf.slicing import pick, set_weights, units


def config_sizes(n_layer: int, n_head: int, d_model: int, block_size: int, n_kv_head: int, dropout: float):
    sizes = dict(zip(SIZE_KEYS, (n_layer, n_head, d_model, block_size), strict=True))
    return {
        **sizes,
        "intermediate_size": 4 * d_model,
        "attention_dropout": dropout,
        "num_key_value_heads": n_kv_head or n_head,
    }


@torch.no_grad()
def keep_heads(
    attention: nn.Module, d_head: int, heads: list[int], kv_heads: list[int], scale: float
) -> None:
    q_rows, kv_rows = units(heads, d_head), units(kv_heads, d_head)
    for proj, rows in ((attention.q_proj, q_rows), (attention.k_proj, kv_rows), (attention.v_proj, kv_rows)):
        set_weights(proj, pick(proj.weight, 0, rows), pick(proj.bias, 0, rows))
    set_weights(attention.o_proj, pick(attention.o_proj.weight, 1, q_rows) * scale, None)


ARCHITECTURE = Architecture(
    name="llama",
    size_keys=SIZE_KEYS,
    output_projection="o_proj",
    grouped_query=True,
    config_sizes=config_sizes,
    attention_modules=lambda hf: [layer.self_attn for layer in hf.model.layers],
    keep_heads=keep_heads,
)
