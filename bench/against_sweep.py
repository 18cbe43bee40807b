"""How often another configuration beats the sweep's trial of its own size: from saved runs.

    cd bench/results
    python -m bench.against_sweep frontier_long_importance_distilled_seed{0,1,2,3,4}.json --runs \\
      frontier_long_{topk_distilled,l0penalty_distilled,l0penalty,plaintune,random}_seed*.json \\
      frontier_long_seed{0,1,2}.json

Reads ``bench.frontier`` runs (``--save``). The first runs hold the sweep (one arm; the default
study's start-up, distilled importance, unless ``--arm`` says otherwise); every finished trial of
the other runs' arms is paired with the sweep's trial that keeps as many heads in the same seed
(one seed is one draw of every trial's batches) and scored as perplexity / the sweep's - 1.
Grouped by method, distillation and how many heads the trial keeps, it prints how many trials,
the median, how many were better than the sweep's and the best.

Why: ``bench.seed_noise`` found that one trial's perplexity moves 1.4-5.1% with its batches at
heavy pruning. If configurations at one size differ by noise of that order, about half of any
other configuration's trials beat the sweep's at their size, by up to a few percent, and a
search gains by drawing many distinct trials where the front is steep, whatever it models.

Searched arms are left out: their early stopping ends the trials that are behind at a rung, so
their finished trials are a selection, not a sample. Plain Tune's trials are TPE's choices but
each one finished. A run whose dense control differs from the sweep's seed (another checkpoint)
is skipped and named.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

from trainers.gates import heads_to_keep
from trainers.pruning.registry import removes_heads

BANDS = ((4, 10), (11, 15), (16, 31))  # heads kept, as bench.seed_noise reports its noise


def band_of(kept: int) -> str:
    for low, high in BANDS:
        if low <= kept <= high:
            return f"{low}-{high}"
    return f"{kept}"


def first_by_head_count(points: list[dict], total_heads: int) -> dict[int, float]:
    """Heads kept -> the first finished pruned trial's perplexity there (a sweep's point of
    that size; the dense control and stopped trials left out)."""
    sizes: dict[int, float] = {}
    for p in points:
        if "ppl" in p and removes_heads(p["hparams"]["method"]):
            sizes.setdefault(heads_to_keep(total_heads, p["sparsity"]), p["ppl"])
    return sizes


def sweep_points(runs: list[dict], arm: str | None, total_heads: int) -> dict[int, dict]:
    """seed -> {"dense": its dense control's ppl, heads kept -> the sweep's first ppl there}."""
    found: dict[int, dict] = {}
    for run in runs:
        for seed in run["seeds"]:
            name = arm or next(iter(seed["arms"]))
            sizes = found.setdefault(seed["seed"], {"dense": seed["dense"]["ppl"]})
            for kept, ppl in first_by_head_count(seed["arms"][name], total_heads).items():
                sizes.setdefault(kept, ppl)  # an earlier run's point of that size stays
    return found


def against_sweep(sweep: dict[int, dict], runs: dict[str, dict], total_heads: int):
    """(method, distill, band) -> the trials' ratios to the sweep's, in percent; and the runs
    skipped for another dense control."""
    ratios: dict[tuple, list[float]] = defaultdict(list)
    skipped = []
    for label, run in runs.items():
        for seed in run["seeds"]:
            reference = sweep.get(seed["seed"])
            if reference is None or abs(seed["dense"]["ppl"] / reference["dense"] - 1) > 1e-4:
                skipped.append(f"{label} (seed {seed['seed']})")
                continue
            for arm, points in seed["arms"].items():
                if arm.startswith("searched"):
                    continue
                for p in points:
                    hp = p.get("hparams", {})
                    if "ppl" not in p or hp.get("method") in (None, "dense"):
                        continue
                    kept = heads_to_keep(total_heads, p["sparsity"])  # as run: l0_penalty sets no target
                    if kept in reference:
                        key = (hp["method"], bool(hp.get("distill")), band_of(kept))
                        ratios[key].append(100 * (p["ppl"] / reference[kept] - 1))
    return dict(ratios), skipped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep", type=Path, nargs="+", help="the sweep's runs (bench.frontier --save)")
    parser.add_argument("--runs", type=Path, nargs="+", required=True, help="the runs whose trials to pair")
    parser.add_argument("--arm", help="the sweep's arm in its runs (default: the run's first)")
    parser.add_argument("--heads", type=int, default=32, help="the model's heads (the default study: 32)")
    args = parser.parse_args()
    sweep = sweep_points([json.loads(p.read_text()) for p in args.sweep], args.arm, args.heads)
    runs = {p.name: json.loads(p.read_text()) for p in args.runs if p not in args.sweep}
    ratios, skipped = against_sweep(sweep, runs, args.heads)
    print(f"perplexity / the sweep's trial of the same size and seed - 1, percent; seeds {sorted(sweep)}")
    print("| method | distilled | heads kept | trials | median | better than the sweep's | best |")
    print("|---|---|---|---|---|---|---|")
    rows = []
    for (method, distill, band), values in sorted(ratios.items()):
        better, median = sum(v < 0 for v in values), statistics.median(values)
        print(
            f"| {method} | {'yes' if distill else 'no'} | {band} | {len(values)} | {median:+.1f}% "
            f"| {better} ({better / len(values):.0%}) | {min(values):+.1f}% |"
        )
        rows.append(
            {
                "method": method,
                "distill": distill,
                "heads_kept": band,
                "n": len(values),
                "median_pct": median,
                "better": better,
                "best_pct": min(values),
            }
        )
    if skipped:
        print("skipped (another dense control than the sweep's seed): " + ", ".join(skipped))
    print(json.dumps({"against_sweep": rows}))


if __name__ == "__main__":
    main()
