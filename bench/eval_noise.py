"""How stable is a trial's perplexity to the choice of validation tokens?

    python -m bench.eval_noise [--study studies/tinyshakespeare.toml] [--neighbours]

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

The damaged model of the second table differs from the dense one far more than two points of a
front differ from each other. ``--neighbours`` (the last table) trains what a front holds at one
size: two methods at 50% of the heads removed, and the first of them again on another seed's
batches, with the benchmark's trial budget, and gives the paired noise of the ratio between
them: the standard error over the whole split's windows, and the spread over interleaved and
contiguous halves. Beside it, how far the two methods and the two seeds actually differ: an
evaluation noise well under the seed-to-seed difference means that the front's comparisons are
decided by training noise (``launch-study replicate``), not by the choice of validation tokens.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bench.common import print_json, print_table
from orchestrator.config import load_study_config
from orchestrator.inputs import prepare_inputs, study_dense_checkpoint
from trainers.data import eval_windows, rung_windows
from trainers.export import load_model
from trainers.hparams import TrialBudget, TrialHParams
from trainers.pretrain import load_dense
from trainers.training import mean_loss
from trainers.trial import TrialIO, TrialSetup, run_trial

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
    parser.add_argument(
        "--neighbours",
        action="store_true",
        help="also train two methods at 50%% removed and one of them on another seed (three "
        "150-step trials, a few CPU-minutes) and give the noise of the ratios between them",
    )
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
    if args.neighbours:
        report["neighbours"] = neighbours_noise(corpus, dense, block, cfg.budget.eval_tokens)
    print_json("eval_noise", report)


# What a front holds at one size in bench.frontier's runs: the default study's start-up method and
# its most frequent rival there, at the start-up's settings, with the benchmark's trial budget.
NEIGHBOURS = {
    "importance": TrialHParams(method="importance", sparsity=0.5, lr=3e-3, distill=True),
    "topk": TrialHParams(method="topk", sparsity=0.5, lr=3e-3, distill=True),
}


def neighbours_noise(corpus, dense, block: int, eval_tokens: int) -> dict:
    """The evaluation noise of the ratio between two fine-tuned models of one size, beside how
    far they differ: two methods on seed 0's batches, and the first method on seed 1's."""
    budget = TrialBudget(prune_steps=50, finetune_steps=100, batch_size=32, eval_tokens=eval_tokens)
    models = {}
    for label, hp, seed in (
        ("importance", NEIGHBOURS["importance"], 0),
        ("topk", NEIGHBOURS["topk"], 0),
        ("importance, seed 1", NEIGHBOURS["importance"], 1),
    ):
        with tempfile.TemporaryDirectory(prefix="eval_noise_") as folder:
            result = run_trial(
                TrialSetup(corpus, dense, budget, seed=seed), hp, TrialIO(save_dir=Path(folder))
            )
            model, _ = load_model(Path(folder), device="cpu")
        models[label] = window_losses(model, corpus.val, block)
        print(f"  trained {label}: {result.val_perplexity:.4f}, {result.heads_per_layer} heads", flush=True)
    rows, report = [], {}
    for pair in (("topk", "importance"), ("importance, seed 1", "importance")):
        differences = models[pair[0]] - models[pair[1]]
        n = len(differences)
        ratio = math.exp(differences.mean().item())
        se = (differences.std() / math.sqrt(n)).item()
        half = n // 2
        halves = {
            "interleaved": [math.exp(differences[k::2].mean().item()) for k in range(2)],
            "contiguous": [math.exp(differences[k * half : (k + 1) * half].mean().item()) for k in range(2)],
        }
        name = f"{pair[0]} / {pair[1]}"
        report[name] = {"ratio": ratio, "relative_se": se, "halves": halves}
        rows.append(
            [
                name,
                f"{ratio - 1:+.2%}",
                f"{se:.2%}",
                *(f"{abs(h[0] - h[1]) / ratio:.2%}" for h in halves.values()),
            ]
        )
    print_table(
        "two fine-tuned models at 50% of the heads removed, on the same tokens (150-step trials)",
        ["pair", "ratio - 1", "s.e. (whole split)", "interleaved halves differ", "contiguous halves"],
        rows,
    )
    return report


if __name__ == "__main__":
    main()
