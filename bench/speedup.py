"""Inference speed of the physically pruned model against the dense one, next to the FLOPs ratio.

    python -m bench.speedup

For each family and 25/50/75% of heads removed (the same count in every layer), the median
forward time at batch 1 and batch 32 (block 128), the speed-up (dense time / pruned time) and the
FLOPs ratio (dense FLOPs / pruned FLOPs), the limit a perfect implementation reaches. The
families: the built-in ``gpt`` and ``all_attention`` (default study sizes, a character
vocabulary), and Hugging Face GPT-2, GPT-NeoX and Llama with grouped-query attention (8 query
heads sharing 4 key/value heads) at the same sizes with a 1,024-token BPE vocabulary.
Targets (issue 7): all_attention at 50% removed >= 1.7x; gpt within 10% of its FLOPs ratio.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from bench.common import median_seconds, print_json, print_table
from trainers.hf import HFLanguageModel
from trainers.model import LanguageModel, ModelConfig

CHAR_VOCAB, BPE_VOCAB = 66, 1024
SIZES = {"n_layer": 4, "n_head": 8, "d_model": 128, "block_size": 128}


def dense_models():
    """(name, model) for every family at the default study's sizes."""
    for family in ("gpt", "all_attention"):
        yield family, LanguageModel(ModelConfig(vocab_size=CHAR_VOCAB, family=family))
    for architecture, extra in (("gpt2", {}), ("gpt_neox", {}), ("llama", {"n_kv_head": 4})):
        model = HFLanguageModel.from_architecture(architecture, vocab_size=BPE_VOCAB, **SIZES, **extra)
        yield f"hf {architecture}", model


def forward_flops(model, T: int) -> float:
    """Multiply-adds x 2 per sequence of T tokens, any family: every linear layer's weights
    (the output head included; embeddings are lookups) and the attention's scores and weighted
    values over the full T x T (as the kernel computes them; all_attention adds its persistent
    keys). Grouped key/value projections count as the layers they are."""
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, (nn.Linear, Conv1D)))
    cfg = model.cfg
    keys = T + (cfg.n_persistent if cfg.family == "all_attention" else 0)
    d_head = cfg.d_model // cfg.n_head
    return 2 * T * linear + 2 * 2 * T * keys * sum(cfg.layer_heads) * d_head


def main() -> None:
    torch.manual_seed(0)
    rows, results = [], []
    for family, dense in dense_models():
        dense.eval()
        n = dense.cfg.n_head
        for removed in (0.25, 0.5, 0.75):
            keep_per_layer = round(n * (1 - removed))
            pruned = dense.prune_heads([list(range(keep_per_layer))] * dense.cfg.n_layer).eval()
            flops_ratio = forward_flops(dense, 128) / forward_flops(pruned, 128)
            for batch in (1, 32):
                x = torch.randint(0, dense.cfg.vocab_size, (batch, 128))
                repeats = 30 if batch == 1 else 10
                with torch.no_grad():
                    # Interleave dense and pruned so both see the same machine noise.
                    t_dense, t_pruned = [], []
                    for _ in range(3):
                        t_dense.append(median_seconds(partial(dense, x), repeats))
                        t_pruned.append(median_seconds(partial(pruned, x), repeats))
                speedup = sorted(t_dense)[1] / sorted(t_pruned)[1]
                results.append(
                    {
                        "family": family,
                        "removed": removed,
                        "batch": batch,
                        "speedup": speedup,
                        "flops_ratio": flops_ratio,
                        "dense_tokens_per_s": batch * 128 / sorted(t_dense)[1],
                        "pruned_tokens_per_s": batch * 128 / sorted(t_pruned)[1],
                    }
                )
                rows.append(
                    [
                        family,
                        f"{removed:.2f}",
                        str(batch),
                        f"{batch * 128 / sorted(t_dense)[1]:,.0f}",
                        f"{batch * 128 / sorted(t_pruned)[1]:,.0f}",
                        f"{speedup:.2f}x",
                        f"{flops_ratio:.2f}x",
                        f"{speedup / flops_ratio:.2f}",
                    ]
                )
    print_table(
        f"inference speed, torch threads {torch.get_num_threads()}",
        [
            "family",
            "removed",
            "batch",
            "dense tok/s",
            "pruned tok/s",
            "speed-up",
            "FLOPs ratio",
            "speed-up / FLOPs ratio",
        ],
        rows,
    )
    print_json("speedup", {"threads": torch.get_num_threads(), "results": results})


if __name__ == "__main__":
    main()
