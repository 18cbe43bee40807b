"""Trials of two lengths at equal compute: more sizes, or every size fine-tuned longer?

    cd bench/results
    python -m bench.trial_length --short frontier_long_importance_distilled_seed{0,1,2}.json \\
      --long frontier_len400_{importance_distilled,searched}_seed{0,1,2}.json --cost-ratio 2.43

Reads ``bench.frontier`` runs (``--save``) made at two trial lengths: ``--short`` ones (the
benchmark's 50 + 100 steps) and ``--long`` ones (e.g. the default study's own 100 + 300). A
front of one budget can hold many sizes trained briefly or fewer sizes trained longer; the
hypervolume says which buys more. Every arm is compared with every other at the same trial CPU
time, by seed, with the paired mean and its 95% interval (``bench.frontier.paired``).

Equal compute across two lengths needs one yardstick. Each run's dense control is a trial of
its own length, so it measures its machine only at that length: CPU seconds are counted in
*short dense controls* (a dense control of the short length on the run's machine), which is a
long run's dense control divided by ``--cost-ratio``, the CPU time of a long dense control over
a short one measured side by side on one machine (``--measure-cost-ratio`` measures it where it
runs). A run's last trial may end past its budget; every arm is cut to the smallest budget
among the runs (``--budget`` in short dense controls, to cut further), counting the trials that
end within it.

Each arm's front is normalised by its own seed's dense control (as ``bench.frontier`` does),
and again by the short run's, since a longer dense control ends a little worse (the converged
checkpoint drifts) and a ratio to it flatters the long arms by that much. Last, what the
longer fine-tuning buys one size: the long sweep's point against the short sweep's at the same
head count and seed.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

from bench.against_sweep import band_of
from bench.common import print_json, print_table
from bench.frontier import hypervolume_within, mean_and_range, paired
from trainers.gates import heads_to_keep

REPO = Path(__file__).resolve().parent.parent


def in_short_dense_units(run: dict, cost_ratio: float) -> dict[int, dict]:
    """seed -> {"dense": its dense control, "unit": CPU-s of a short dense control on its
    machine, "budget": the run's budget in those units, "arms": points with "units" added}."""
    found = {}
    for seed in run["seeds"]:
        unit = seed["dense"]["seconds"] / cost_ratio
        arms = {
            arm: [{**p, "units": p["seconds"] / unit} for p in points] for arm, points in seed["arms"].items()
        }
        found[seed["seed"]] = {
            "dense": seed["dense"],
            "unit": unit,
            "budget": run["budget_minutes"] * 60 / unit,
            "arms": arms,
        }
    return found


def gather(short: list[dict], long: list[dict], cost_ratio: float) -> tuple[dict[int, dict], float]:
    """seed -> {"short_dense": the short run's dense control, "arms": arm -> (points, own dense)},
    for the seeds every arm ran; and the smallest budget among the runs, in short dense controls."""
    seeds: dict[int, dict] = defaultdict(lambda: {"arms": {}})
    budgets = []
    for runs, ratio in ((short, 1.0), (long, cost_ratio)):
        for run in runs:
            for number, seed in in_short_dense_units(run, ratio).items():
                budgets.append(seed["budget"])
                if ratio == 1.0:
                    seeds[number]["short_dense"] = seed["dense"]
                for arm, points in seed["arms"].items():
                    if arm in seeds[number]["arms"]:
                        raise SystemExit(f"seed {number} has arm {arm} twice")
                    seeds[number]["arms"][arm] = (points, seed["dense"])
    arms = {arm for seed in seeds.values() for arm in seed["arms"]}
    complete = {n: s for n, s in seeds.items() if set(s["arms"]) == arms and "short_dense" in s}
    if not complete:
        raise SystemExit("no seed has every arm and a short run")
    return dict(sorted(complete.items())), min(budgets)


def hypervolume_at(points: list[dict], dense: dict, budget_units: float) -> float:
    """``bench.frontier.hypervolume_within`` in short dense controls instead of CPU-s."""
    return hypervolume_within([{**p, "seconds": p["units"]} for p in points], dense, budget_units)


def best_ratio(points: list[dict], dense: dict, budget_units: float, removed: float) -> float | None:
    """The best perplexity / dense among the points with at least ``removed`` of the heads gone,
    of the trials that ended within the budget."""
    spent, best = 0.0, None
    for p in points:
        spent += p["units"]
        if spent > budget_units:
            break
        if "ppl" in p and p["sparsity"] >= removed - 1e-9:
            best = min(best or math.inf, p["ppl"] / dense["ppl"])
    return best


def same_size_gains(
    seeds: dict[int, dict], short_arm: str, long_arm: str, total_heads: int
) -> dict[str, list[float]]:
    """Heads kept band -> the long sweep's perplexity / the short sweep's - 1 (percent), each over
    its own dense control, at every head count both hold in a seed (whatever the budget)."""

    def by_size(points: list[dict], dense: dict) -> dict[int, float]:
        sizes: dict[int, float] = {}
        for p in points:
            if "ppl" in p and p["hparams"]["method"] != "dense":
                sizes.setdefault(heads_to_keep(total_heads, p["sparsity"]), p["ppl"] / dense["ppl"])
        return sizes

    gains: dict[str, list[float]] = defaultdict(list)
    for seed in seeds.values():
        short, long = by_size(*seed["arms"][short_arm]), by_size(*seed["arms"][long_arm])
        for kept in sorted(set(short) & set(long)):
            gains[band_of(kept)].append(100 * (long[kept] / short[kept] - 1))
    return dict(gains)


def measure_cost_ratio(short_steps: tuple[int, int], long_steps: tuple[int, int], repeats: int) -> float:
    """The CPU time of the default study's dense control at ``long_steps`` (gate steps,
    fine-tuning steps) over ``short_steps``, one thread, alternated ``repeats`` times on this
    machine; the ratio of the medians."""
    import torch

    from bench.frontier import STUDY, timed_trial
    from orchestrator.config import load_study_config
    from orchestrator.runner import prepare_inputs, study_dense_checkpoint
    from trainers.hparams import TrialHParams
    from trainers.trial import TrialSetup

    torch.set_num_threads(1)
    seconds: dict[tuple[int, int], list[float]] = {short_steps: [], long_steps: []}
    for _ in range(repeats):
        for steps in seconds:
            sets = [
                "study.cpus_per_trial=1",
                f"trial.prune_steps={steps[0]}",
                f"trial.finetune_steps={steps[1]}",
            ]
            cfg = load_study_config(STUDY, sets)
            corpus, model_cfg = prepare_inputs(cfg)
            checkpoint = study_dense_checkpoint(cfg, corpus, model_cfg, REPO / "runs" / "artifacts")
            dense = timed_trial(
                TrialSetup(corpus, checkpoint, cfg.budget, 0), TrialHParams(**cfg.search.control_point())
            )
            seconds[steps].append(dense["seconds"])
            print(f"dense control, {steps[0]} + {steps[1]} steps: {dense['seconds']:.1f} CPU-s", flush=True)
    return statistics.median(seconds[long_steps]) / statistics.median(seconds[short_steps])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", type=Path, nargs="+", help="runs at the short length")
    parser.add_argument("--long", type=Path, nargs="+", help="runs at the long length")
    parser.add_argument(
        "--cost-ratio",
        type=float,
        help="CPU time of a long dense control over a short one, side by side on one machine",
    )
    parser.add_argument(
        "--measure-cost-ratio",
        action="store_true",
        help="measure it here (the dense control at 50 + 100 and 100 + 300 steps, alternated 3 times) "
        "and stop",
    )
    parser.add_argument("--budget", type=float, help="cut every arm to this many short dense controls")
    parser.add_argument("--heads", type=int, default=32, help="the model's heads (the default study: 32)")
    args = parser.parse_args()
    if args.measure_cost_ratio:
        ratio = measure_cost_ratio((50, 100), (100, 300), repeats=3)
        print(f"cost ratio (median over median): {ratio:.3f}")
        print_json("trial_length_cost_ratio", {"cost_ratio": ratio})
        return
    if not (args.short and args.long and args.cost_ratio is not None):
        parser.error("--short, --long and --cost-ratio are needed (or --measure-cost-ratio alone)")
    if not args.cost_ratio > 0:
        parser.error(f"--cost-ratio must be above 0, got {args.cost_ratio}")
    short = [json.loads(p.read_text()) for p in args.short]
    long = [json.loads(p.read_text()) for p in args.long]
    seeds, budget = gather(short, long, args.cost_ratio)
    if args.budget is not None:
        budget = min(budget, args.budget)
    arms = list(next(iter(seeds.values()))["arms"])
    short_arms = {arm for run in short for seed in run["seeds"] for arm in seed["arms"]}

    def per_seed(arm: str, reference: str) -> list[float]:
        values = []
        for seed in seeds.values():
            points, own = seed["arms"][arm]
            dense = own if reference == "own" else seed["short_dense"]
            values.append(hypervolume_at(points, dense, budget))
        return values

    results = {}
    for reference in ("own", "short"):
        hv = {arm: per_seed(arm, reference) for arm in arms}
        results[reference] = hv
        whose = "each arm's own" if reference == "own" else "the short run's"
        print_table(
            f"hypervolume at {budget:.1f} short dense controls of trial CPU per arm and seed, "
            f"normalised by {whose} dense control; seeds {list(seeds)}",
            ["arm", *(f"seed {n}" for n in seeds), "mean [min, max]", ">= 50% removed", ">= 75% removed"],
            [
                [
                    arm,
                    *(f"{v:.4f}" for v in hv[arm]),
                    mean_and_range(hv[arm]),
                    *(
                        mean_and_range(
                            [
                                best_ratio(
                                    s["arms"][arm][0],
                                    s["arms"][arm][1] if reference == "own" else s["short_dense"],
                                    budget,
                                    removed,
                                )
                                for s in seeds.values()
                            ]
                        )
                        for removed in (0.5, 0.75)
                    ),
                ]
                for arm in arms
            ],
        )
        print_table(
            "paired by seed: each arm minus each other (95% t-interval)",
            ["arm", "minus", "by seed", "mean", "95% interval"],
            [[a, b, *paired(hv[a], hv[b])] for i, a in enumerate(arms) for b in arms[i + 1 :]],
        )
    long_sweeps = [a for a in arms if a not in short_arms and not a.startswith("searched")]
    gains = {}
    for short_arm in sorted(short_arms):
        for long_arm in long_sweeps:
            found = same_size_gains(seeds, short_arm, long_arm, args.heads)
            gains[f"{long_arm} / {short_arm}"] = found
            print_table(
                f"{long_arm} against {short_arm} at the same head count and seed: "
                "(ppl / its dense) over (ppl / its dense) - 1, percent",
                ["heads kept", "sizes x seeds", "median", "range"],
                [
                    [band, str(len(v)), f"{statistics.median(v):+.1f}%", f"{min(v):+.1f}% .. {max(v):+.1f}%"]
                    for band, v in sorted(found.items(), key=lambda kv: int(kv[0].split("-")[0]))
                ],
            )
    print_json("trial_length", {"budget_short_dense": budget, "hypervolume": results, "same_size_pct": gains})


if __name__ == "__main__":
    main()
