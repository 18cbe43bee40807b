"""Inference speed of the physically pruned model against the dense one, next to the FLOPs ratio.

    python -m bench.speedup

For each family and 25/50/75% of heads removed (the same count in every layer), the median
forward time at batch 1 and batch 32 (block 128), the speed-up (dense time / pruned time) and the
FLOPs ratio (dense FLOPs / pruned FLOPs), the limit a perfect implementation reaches.
Targets (issue 7): all_attention at 50% removed >= 1.7x; gpt within 10% of its FLOPs ratio.
"""

from __future__ import annotations

from functools import partial

import torch

from bench.common import median_seconds, print_json, print_table
from trainers.model import LanguageModel, ModelConfig

VOCAB = 66


def forward_flops(cfg: ModelConfig, T: int) -> float:
    """Multiply-adds x 2 per sequence of T tokens (matrix products only; causal attention
    counts the full T x T scores, as the kernel computes them)."""
    d, dh = cfg.d_model, cfg.d_head
    flops = 0.0
    for h in cfg.layer_heads:
        inner = h * dh
        flops += 2 * T * d * 3 * inner + 2 * T * inner * d  # qkv and output projections
        keys = T + (cfg.n_persistent if cfg.family == "all_attention" else 0)
        flops += 2 * 2 * T * keys * inner  # scores and weighted values
        if cfg.family == "gpt":
            flops += 2 * T * d * 4 * d * 2  # MLP
    return flops + 2 * T * d * cfg.vocab_size  # output head


def main() -> None:
    torch.manual_seed(0)
    rows, results = [], []
    for family in ("gpt", "all_attention"):
        dense = LanguageModel(ModelConfig(vocab_size=VOCAB, family=family)).eval()
        n = dense.cfg.n_head
        for removed in (0.25, 0.5, 0.75):
            keep_per_layer = round(n * (1 - removed))
            pruned = dense.prune_heads([list(range(keep_per_layer))] * dense.cfg.n_layer).eval()
            flops_ratio = forward_flops(dense.cfg, 128) / forward_flops(pruned.cfg, 128)
            for batch in (1, 32):
                x = torch.randint(0, VOCAB, (batch, 128))
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
