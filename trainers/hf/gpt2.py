"""GPT-2: one ``Conv1D`` ``c_attn`` whose columns are [query heads | key heads | value heads],
``c_proj`` rows per head, learned position embeddings."""

from __future__ import annotations

import torch
from torch import nn

from trainers.hf.architectures import Architecture
from trainers.hf.slicing import pick, set_weights, units


def config_sizes(n_layer: int, n_head: int, d_model: int, block_size: int, n_kv_head: int, dropout: float):
    return {
        "n_layer": n_layer,
        "n_head": n_head,
        "n_embd": d_model,
        "n_positions": block_size,
        "n_inner": 4 * d_model,
        "resid_pdrop": dropout,
        "embd_pdrop": dropout,
        "attn_pdrop": dropout,
    }


@torch.no_grad()
def keep_heads(
    attention: nn.Module, d_head: int, heads: list[int], kv_heads: list[int], scale: float
) -> None:
    inner = attention.c_attn.weight.shape[1] // 3
    cols = torch.cat(
        [units(heads, d_head), units(kv_heads, d_head, inner), units(kv_heads, d_head, 2 * inner)]
    )
    set_weights(
        attention.c_attn, pick(attention.c_attn.weight, 1, cols), pick(attention.c_attn.bias, 0, cols)
    )
    rows = units(heads, d_head)
    set_weights(attention.c_proj, pick(attention.c_proj.weight, 0, rows) * scale, None)
    attention.split_size = len(heads) * d_head
    attention.num_heads = len(heads)


ARCHITECTURE = Architecture(
    name="gpt2",
    size_keys=("n_layer", "n_head", "n_embd", "n_positions"),
    output_projection="c_proj",
    grouped_query=False,
    config_sizes=config_sizes,
    attention_modules=lambda hf: [block.attn for block in hf.transformer.h],
    keep_heads=keep_heads,
    extra_embeddings=lambda hf: [hf.transformer.wpe.weight],
)
