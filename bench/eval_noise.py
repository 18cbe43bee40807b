"""How stable is a trial's perplexity to the choice of validation tokens?

    python -m bench.eval_noise [--study studies/tinyshakespeare.toml]

The default study's dense checkpoint (trained first if it is not cached) scored on disjoint
slices of the validation split at several sizes: the spread between slices of one size is the
noise a single slice of that size carries. For the whole split, which cannot be cut into
disjoint copies of itself, the standard error of the mean loss over its windows (windows of
``block_size`` characters, nearly independent) gives the same figure: perplexity is exp(mean
loss), so an error of e in the mean loss is a relative error of about e in the perplexity.

A study compares trials scored on the same tokens, so what decides a comparison is the paired
noise: the ratio of two models' perplexities on one slice against another. The second table
scores the checkpoint with a quarter of its heads removed at random (no fine-tuning) beside it
and reports the spread of that ratio over the same slices. Target (issue 11): the study's
evaluation stable to 0.2%.

Early stopping's rungs score a subset of the windows (``[early_stopping] eval_tokens``), evenly
spaced so that the subset samples the whole text. The third table is the same spread over
interleaved subsets (window i in subset i mod k: evenly spaced too), and the CPU seconds of one
evaluation of the study's rung subset beside the whole split's (medians of 3, measured
alternately).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

import torch

from bench.common import print_json, print_table
from orchestrator.config import load_study_config
from orchestrator.runner import prepare_inputs, study_dense_checkpoint
from trainers.data import eval_windows, rung_windows
from trainers.pretrain import load_dense
from trainers.training import mean_loss

REPO = Path(__file__).resolve().parent.parent


@torch.no_grad()
def window_losses(model, tokens: torch.Tensor, block_size: int) -> torch.Tensor:
    """Mean next-token loss of every non-overlapping window of the split."""
    n = (len(tokens) - 1) // block_size
    x = tokens[: n * block_size].view(n, block_size)
    y = tokens[1 : n * block_size + 1].view(n, block_size)
    model.eval()
    losses = []
    for i in range(0, n, 64):
        logits, _ = model(x[i : i + 64])
        loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), y[i : i + 64], reduction="none")
        losses.append(loss.mean(dim=1))
    return torch.cat(losses)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", type=Path, default=REPO / "studies" / "tinyshakespeare.toml")
    parser.add_argument("--artifacts", type=Path, default=REPO / "runs" / "artifacts")
    args = parser.parse_args()
    cfg = load_study_config(args.study)
    corpus, model_cfg = prepare_inputs(cfg)
    dense = study_dense_checkpoint(cfg, corpus, model_cfg, args.artifacts)
    model = load_dense(dense, torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    keep = [
        sorted(torch.randperm(n, generator=generator)[: n - n // 4].tolist()) for n in model_cfg.layer_heads
    ]
    pruned = model.prune_heads(keep)
    block = model_cfg.block_size
    dense_losses = window_losses(model, corpus.val, block)
    differences = window_losses(pruned, corpus.val, block) - dense_losses
    n_windows = len(dense_losses)
    report: dict = {"windows": n_windows, "block_size": block, "study_eval_tokens": cfg.budget.eval_tokens}
    for name, losses, title in (
        ("level", dense_losses, f"perplexity of the dense checkpoint ({dense.val_perplexity:.3f})"),
        ("ratio", differences, "ratio of perplexities, 25% of heads removed / dense, on the same tokens"),
    ):
        rows, report[name] = [], {}
        for parts in (16, 8, 4, 2):
            size = n_windows // parts
            values = [math.exp(losses[k * size : (k + 1) * size].mean().item()) for k in range(parts)]
            sd = statistics.stdev(values) / statistics.mean(values)
            spread = (max(values) - min(values)) / statistics.mean(values)
            rows.append([f"{size * block:,}", str(parts), f"{sd:.2%}", f"{spread:.2%}"])
            report[name][size * block] = {"values": values, "relative_sd": sd}
        whole_se = (losses.std() / math.sqrt(n_windows)).item()
        rows.append([f"{n_windows * block:,} (whole split)", "1", f"{whole_se:.2%} (s.e.)", "-"])
        report[name]["whole_split_relative_se"] = whole_se
        print_table(
            f"{title}, on disjoint validation slices",
            ["tokens per slice", "slices", "relative sd", "(max - min) / mean"],
            rows,
        )
    rows, report["interleaved"] = [], {}
    for parts in (8, 4, 2):
        row = [f"{n_windows // parts * block:,}", str(parts)]
        for name, losses in (("level", dense_losses), ("ratio", differences)):
            values = [math.exp(losses[k::parts].mean().item()) for k in range(parts)]
            sd = statistics.stdev(values) / statistics.mean(values)
            row.append(f"{sd:.2%}")
            report["interleaved"].setdefault(parts, {})[name] = {"values": values, "relative_sd": sd}
        rows.append(row)
    print_table(
        "interleaved subsets (every k-th window), as a rung scores them",
        ["tokens per subset", "subsets (k)", "relative sd of perplexity", "of the ratio"],
        rows,
    )
    windows = eval_windows(corpus.val, block, cfg.budget.eval_tokens)
    subset = rung_windows(windows, cfg.early_stopping.eval_tokens)
    times: dict[str, list[float]] = {"whole": [], "subset": []}
    for _ in range(3):
        for name, scored in (("whole", windows), ("subset", subset)):
            start = time.process_time()
            mean_loss(pruned, scored)
            times[name].append(time.process_time() - start)
    whole_s, subset_s = (statistics.median(times[k]) for k in ("whole", "subset"))
    print(
        f"one evaluation, CPU seconds: the study's slice ({windows[0].numel():,} tokens) {whole_s:.2f}, "
        f"a rung's subset ({subset[0].numel():,} tokens) {subset_s:.2f}: {subset_s / whole_s:.2f}x"
    )
    report["evaluation_cpu_seconds"] = {
        "whole": whole_s,
        "subset": subset_s,
        "subset_tokens": subset[0].numel(),
        "threads": torch.get_num_threads(),
    }
    level, ratio = report["level"]["whole_split_relative_se"], report["ratio"]["whole_split_relative_se"]
    print(
        f"target: stable to 0.2% at the whole split: the level {'met' if level <= 0.002 else 'not met'} "
        f"({level:.2%}), the ratio between two models {'met' if ratio <= 0.002 else 'not met'} ({ratio:.2%})"
    )
    print_json("eval_noise", report)


if __name__ == "__main__":
    main()
