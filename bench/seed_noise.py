"""How much of the difference between two methods at one size is the seed's: from saved runs.

    python -m bench.seed_noise RUN.json ... --arms importance:distilled,topk:distilled
    python -m bench.seed_noise RUN.json ... --arms importance:distilled     # one arm's own noise

Reads ``bench.frontier`` runs (``--save``) and, for two of their sweep arms, pairs the points
that keep the same number of heads in the same seed (a seed is a trial's batches: every trial of
one seed draws the same ones, so the pair differs by its method only). Per head count it prints
the difference of log(perplexity / dense) by seed, in percent, and its mean; then

- the seed noise: the pooled standard deviation of the difference between seeds at one size,
  and of one arm's own log ratio (how much one trial's perplexity moves with its batches);
- whether the sizes differ more than that noise explains: the variance of the per-size means
  against noise / seeds, as an F ratio, with how often pure noise gives one as large
  (simulated: normal noise, the same sizes and seeds).

A method "better at some sizes and worse at others" is a real pattern only where that ratio is
well above 1; near 1 the pattern is the seeds'.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

import torch

from bench.frontier import merge_seeds
from trainers.gates import heads_to_keep


def log_ratios(per_seed: list[dict], arm: str, total_heads: int) -> dict[int, dict[int, float]]:
    """heads kept -> seed -> log(ppl / the seed's dense control), the arm's first point of each size."""
    found: dict[int, dict[int, float]] = {}
    for seed in per_seed:
        dense = seed["dense"]["ppl"]
        for p in seed["arms"][arm][1:]:  # the first point is the dense control
            if "ppl" in p:
                kept = heads_to_keep(total_heads, p["hparams"]["sparsity"])
                found.setdefault(kept, {}).setdefault(seed["seed"], math.log(p["ppl"] / dense))
    return found


def pooled_sd(groups: list[list[float]]) -> float:
    """The standard deviation within groups, pooled over them (each group's own mean removed)."""
    squares = sum(sum((x - statistics.fmean(g)) ** 2 for x in g) for g in groups)
    return math.sqrt(squares / sum(len(g) - 1 for g in groups))


def f_ratio(groups: list[list[float]]) -> float:
    """Variance of the group means over the variance that noise alone gives them (equal sizes)."""
    n = len(groups[0])
    return statistics.variance([statistics.fmean(g) for g in groups]) / (pooled_sd(groups) ** 2 / n)


def noise_only_share(k: int, n: int, observed: float, draws: int = 20000, seed: int = 0) -> float:
    """How often k groups of n normal draws with one mean give an F ratio >= ``observed``."""
    x = torch.randn(draws, k, n, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    within = x.var(dim=2).mean(dim=1)  # pooled variance, equal sizes
    between = x.mean(dim=2).var(dim=1)
    return float(((between / (within / n)) >= observed).double().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+", help="runs saved by bench.frontier --save")
    parser.add_argument(
        "--arms",
        default="importance:distilled,topk:distilled",
        help="two arms A,B (B - A per size), or one arm (its own ratio per size, over the seeds)",
    )
    parser.add_argument("--heads", type=int, default=32, help="the model's heads (the default study: 32)")
    args = parser.parse_args()
    arms = args.arms.split(",")
    if len(arms) not in (1, 2):
        parser.error(f"--arms: one arm or two, got {args.arms!r}")
    per_seed, _ = merge_seeds([json.loads(path.read_text()) for path in args.runs])
    ratios = [log_ratios(per_seed, arm, args.heads) for arm in arms]
    seeds = sorted({s["seed"] for s in per_seed})
    sizes = [k for k in sorted(ratios[0]) if all(k in r and all(s in r[k] for s in seeds) for r in ratios)]
    if len(seeds) < 2 or len(sizes) < 2:
        raise SystemExit("need at least 2 seeds and 2 sizes that the arms reached in every seed")
    first = ratios[0]
    rows = {
        k: [100 * (ratios[-1][k][s] - first[k][s] if len(arms) == 2 else first[k][s]) for s in seeds]
        for k in sizes
    }
    what = f"{arms[1]} - {arms[0]}, log(ppl / dense)" if len(arms) == 2 else f"{arms[0]}: log(ppl / dense)"
    print(f"{what} x 100, seeds {seeds}")
    print("| heads kept | by seed | mean | sd over seeds |")
    print("|---|---|---|---|")
    for k, values in rows.items():
        shown = " / ".join(f"{x:+.1f}" for x in values)
        print(f"| {k} | {shown} | {statistics.fmean(values):+.2f} | {statistics.stdev(values):.2f} |")
    own = pooled_sd([[100 * first[k][s] for s in seeds] for k in sizes])
    summary = {"sizes": len(sizes), "seeds": len(seeds), "one_trial_sd_pct": own}
    print(f"seed noise: one {arms[0]} trial's ratio moves {own:.2f}% (sd) between seeds at one size")
    if len(arms) == 2:
        differences = list(rows.values())
        ratio = f_ratio(differences)
        summary |= {
            "difference_sd_within_size_pct": pooled_sd(differences),
            "f_ratio": ratio,
            "noise_gives_as_large": noise_only_share(len(sizes), len(seeds), ratio),
            "mean_difference_pct": statistics.fmean(x for d in differences for x in d),
        }
        moves = summary["difference_sd_within_size_pct"]
        print(f"the difference moves {moves:.2f}% (sd) between seeds at one size")
        print(
            f"sizes against seeds: F = {ratio:.2f} over {len(sizes)} sizes x {len(seeds)} seeds; noise alone "
            f"gives one as large {summary['noise_gives_as_large']:.0%} of the time. Over all sizes: "
            f"{summary['mean_difference_pct']:+.2f}% ({arms[1]} - {arms[0]})"
        )
    print(json.dumps({"seed_noise": summary}))


if __name__ == "__main__":
    main()
