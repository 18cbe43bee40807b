"""Trials of two lengths at equal compute: more sizes, or every size fine-tuned longer?

    python -m bench.trial_length --measure-cost-ratio       # once, on the long runs' machine
    python -m bench.trial_length --measure-cost-ratio --short-steps 100+300 --long-steps 100+700
    python -m bench.trial_length --cost-ratio 2.66 \\
      --short bench/results/frontier_long_importance_distilled_seed{0,1,2}.json \\
      --long bench/results/frontier_len400_importance_distilled_seed{0,1,2}.json

Reads ``bench.frontier`` runs (``--save``) made at two trial lengths: ``--short`` ones (the
benchmark's 50 + 100 steps) and ``--long`` ones (e.g. the default study's own 100 + 300). A
front of one budget can hold many sizes trained briefly or fewer sizes trained longer; the
hypervolume says which buys more. Every arm is compared with every other at the same trial CPU
time, by seed, with the paired mean and its 95% interval (``bench.frontier.paired``).

Equal compute across two lengths needs one yardstick. Each run's dense control is a trial of
its own length, so it measures its machine only at that length: CPU seconds are counted in
*short dense controls* (a dense control of the short length on the runs' machine): the median of
the short runs' dense controls, and of the long runs' over ``--cost-ratio``, the CPU time of a
long dense control over a short one on one machine (``--measure-cost-ratio`` measures it where
it runs; measure it under the load the runs had, if it changes the ratio). Runs of one length
from machines of different speeds are refused. Every arm is cut to the smallest budget among
the runs (``--budget`` in short dense controls, to cut further) twice: by the rule the runs
ended by (a trial starts while less than the budget is spent, so the last may end past it) and
counting only the trials that ended within it. A long trial overshoots or falls short by more
than a short one, so the truth lies between the two; each table says what each arm used.

Each arm's front is normalised by its own seed's dense control (as ``bench.frontier`` does),
and again by the short runs', since a longer dense control ends a little worse (the converged
checkpoint drifts) and a ratio to it flatters the long arms by that much. Last, what the
longer fine-tuning buys one size: the long sweep's perplexity against the short sweep's at the
same head count and seed.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

from bench.against_sweep import band_of, first_by_head_count
from bench.common import print_json, print_table
from bench.frontier import (
    SWEEPS,
    best_ratio,
    ended_within,
    hypervolume_within,
    mean_and_range,
    paired,
    within_budget,
)

REPO = Path(__file__).resolve().parent.parent


# Dense controls of one length more than this far from their median came from machines of
# different speeds: one yardstick would not serve them (bench.frontier --merge rescales those).
SAME_MACHINE = 0.10


def group_unit(runs: list[dict], cost_ratio: float, what: str) -> float:
    """CPU-s of a short dense control on the machine the runs of one length ran on: the median of
    their dense controls' CPU times over ``cost_ratio`` (one trial per seed and run is a noisy
    yardstick: on one machine two runs' dense controls of one seed differed by 10%)."""
    seconds = [seed["dense"]["seconds"] for run in runs for seed in run["seeds"]]
    median = statistics.median(seconds)
    if any(abs(s / median - 1) > SAME_MACHINE for s in seconds):
        raise SystemExit(
            f"the {what} runs' dense controls took {min(seconds):.0f}-{max(seconds):.0f} CPU-s: machines of "
            "different speeds; compare runs of one machine (or merge them with bench.frontier --merge)"
        )
    return median / cost_ratio


def in_units(points: list[dict], unit: float) -> list[dict]:
    """The points with their CPU time ("seconds") in short dense controls."""
    return [{**p, "seconds": p["seconds"] / unit} for p in points]


def gather(short: list[dict], long: list[dict], cost_ratio: float) -> tuple[dict[int, dict], float]:
    """seed -> {"short_dense": the short runs' dense control, "arms": arm -> (points in short
    dense controls, the arm's own dense control)}, for the seeds that have every arm; and the
    smallest budget among those seeds' runs, in short dense controls."""
    if len({run["cpus_per_trial"] for run in short + long}) > 1:
        raise SystemExit("the runs have different threads per trial")
    seeds: dict[int, dict] = defaultdict(lambda: {"arms": {}, "budgets": []})
    for runs, ratio, is_short in ((short, 1.0, True), (long, cost_ratio, False)):
        if not runs:
            continue
        unit = group_unit(runs, ratio, "short" if is_short else "long")
        for run in runs:
            for seed in run["seeds"]:
                found = seeds[seed["seed"]]
                found["budgets"].append(run["budget_minutes"] * 60 / unit)
                if is_short:
                    known = found.setdefault("short_dense", seed["dense"])
                    if not math.isclose(known["ppl"], seed["dense"]["ppl"], rel_tol=1e-6):
                        raise SystemExit(f"seed {seed['seed']}'s short runs have different dense controls")
                for arm, points in seed["arms"].items():
                    if arm in found["arms"]:
                        raise SystemExit(f"seed {seed['seed']} has arm {arm} twice")
                    found["arms"][arm] = (in_units(points, unit), seed["dense"])
    arms = {arm for seed in seeds.values() for arm in seed["arms"]}
    complete = {n: s for n, s in sorted(seeds.items()) if set(s["arms"]) == arms and "short_dense" in s}
    left_out = sorted(set(seeds) - set(complete))
    if left_out:
        print(f"seeds {left_out} left out: they lack an arm or a short run", flush=True)
    if not complete:
        raise SystemExit("no seed has every arm and a short run")
    return complete, min(b for seed in complete.values() for b in seed["budgets"])


def cut(points: list[dict], budget: float, rule: str) -> list[dict]:
    """The trials an arm holds at ``budget``: by the rule its run ended by ("started": a trial
    starts while less than the budget is spent, so the last one may end past it, the more so
    the longer the trials) or only those that "ended" within it (the other way round)."""
    return within_budget(points, budget) if rule == "started" else ended_within(points, budget)


def sweep_pairs(short_arms: list[str], long_arms: list[str]) -> list[tuple[str, str]]:
    """(short arm, long arm) of the same sweep (``importance:distilled`` and
    ``importance:len400``): one method at the two lengths, nothing else."""
    pairs = []
    for short in short_arms:
        method = short.split(":")[0]
        pairs += [(short, long) for long in long_arms if method in SWEEPS and long.split(":")[0] == method]
    return pairs


def same_size_gains(
    seeds: dict[int, dict], short_arm: str, long_arm: str, total_heads: int
) -> dict[str, list[float]]:
    """Heads kept band -> the long sweep's perplexity / the short sweep's - 1 (percent) at every
    head count both hold in a seed, whatever the budget: the same checkpoint, the same seed's
    batches, the same validation tokens, so the perplexities compare as they are."""

    gains: dict[str, list[float]] = defaultdict(list)
    for seed in seeds.values():
        short = first_by_head_count(seed["arms"][short_arm][0], total_heads)
        long = first_by_head_count(seed["arms"][long_arm][0], total_heads)
        for kept in sorted(set(short) & set(long)):
            gains[band_of(kept)].append(100 * (long[kept] / short[kept] - 1))
    return dict(gains)


def measure_cost_ratio(short_steps: tuple[int, int], long_steps: tuple[int, int], repeats: int) -> float:
    """The CPU time of the default study's dense control at ``long_steps`` (gate steps,
    fine-tuning steps) over ``short_steps``, one thread, alternated ``repeats`` times on this
    machine; the ratio of the medians. Evaluation costs the same at both lengths, so the ratio is
    under the ratio of steps (400 / 150 for the defaults)."""
    import torch

    from bench.frontier import STUDY, timed_trial
    from orchestrator.config import load_study_config
    from orchestrator.inputs import prepare_inputs, study_dense_checkpoint
    from trainers.hparams import TrialHParams
    from trainers.trial import TrialSetup

    def dense_control_at(steps: tuple[int, int]) -> tuple[TrialSetup, TrialHParams]:
        sets = ["study.cpus_per_trial=1", f"trial.prune_steps={steps[0]}", f"trial.finetune_steps={steps[1]}"]
        cfg = load_study_config(STUDY, sets)
        corpus, model_cfg = prepare_inputs(cfg)
        checkpoint = study_dense_checkpoint(cfg, corpus, model_cfg, REPO / "runs" / "artifacts")
        return TrialSetup(corpus, checkpoint, cfg.budget, 0), TrialHParams(**cfg.search.control_point())

    torch.set_num_threads(1)
    # the corpus and the checkpoint read once per length, not once per repeat
    setups = {steps: dense_control_at(steps) for steps in (short_steps, long_steps)}
    seconds: dict[tuple[int, int], list[float]] = {steps: [] for steps in setups}
    for _ in range(repeats):
        for steps, (setup, control) in setups.items():
            dense = timed_trial(setup, control)
            seconds[steps].append(dense["seconds"])
            print(f"dense control, {steps[0]} + {steps[1]} steps: {dense['seconds']:.1f} CPU-s", flush=True)
    return statistics.median(seconds[long_steps]) / statistics.median(seconds[short_steps])


def trial_steps(text: str) -> tuple[int, int]:
    """A trial's length as "gate steps+fine-tuning steps" ("100+300")."""
    try:
        gate, finetune = (int(part) for part in text.split("+"))
    except ValueError:
        expected = "expected gate+fine-tuning steps such as 100+300"
        raise argparse.ArgumentTypeError(f"{expected}, got {text!r}") from None
    if gate < 0 or finetune < 1:
        raise argparse.ArgumentTypeError(f"steps must be >= 0 (gate) and >= 1 (fine-tuning), got {text!r}")
    return gate, finetune


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
        help="measure it here (the dense control at the two lengths, alternated 3 times) and stop",
    )
    parser.add_argument(
        "--short-steps",
        type=trial_steps,
        default=(50, 100),
        help="the short length as gate + fine-tuning steps, for --measure-cost-ratio (default 50+100)",
    )
    parser.add_argument(
        "--long-steps",
        type=trial_steps,
        default=(100, 300),
        help="the long length, for --measure-cost-ratio (default 100+300: the default study's)",
    )
    parser.add_argument("--budget", type=float, help="cut every arm to this many short dense controls")
    parser.add_argument("--heads", type=int, default=32, help="the model's heads (the default study: 32)")
    args = parser.parse_args()
    if args.measure_cost_ratio:
        ratio = measure_cost_ratio(args.short_steps, args.long_steps, repeats=3)
        print(f"cost ratio (median over median): {ratio:.3f}")
        print_json("trial_length_cost_ratio", {"cost_ratio": ratio})
        return
    if not (args.short and args.long and args.cost_ratio is not None):
        parser.error("--short, --long and --cost-ratio are needed (or --measure-cost-ratio alone)")
    if not args.cost_ratio > 0:
        parser.error(f"--cost-ratio must be above 0, got {args.cost_ratio}")
    try:
        short = [json.loads(p.read_text()) for p in args.short]
        long = [json.loads(p.read_text()) for p in args.long]
    except (OSError, json.JSONDecodeError) as error:
        parser.error(f"cannot read a saved run: {error}")
    seeds, budget = gather(short, long, args.cost_ratio)
    if args.budget is not None:
        budget = min(budget, args.budget)
    arms = list(next(iter(seeds.values()))["arms"])
    short_arms = sorted({arm for run in short for seed in run["seeds"] for arm in seed["arms"]})
    long_arms = [arm for arm in arms if arm not in short_arms]
    results: dict[str, dict] = {}
    for rule in ("started", "ended"):
        for reference in ("own", "short"):
            whose = "each arm's own" if reference == "own" else "the short runs'"
            hv, rows = {}, []
            for arm in arms:
                held = [cut(seed["arms"][arm][0], budget, rule) for seed in seeds.values()]
                dense = [
                    seed["arms"][arm][1] if reference == "own" else seed["short_dense"]
                    for seed in seeds.values()
                ]
                hv[arm] = [hypervolume_within(h, d, math.inf) for h, d in zip(held, dense)]
                rows.append(
                    [
                        arm,
                        *(f"{v:.4f}" for v in hv[arm]),
                        mean_and_range(hv[arm]),
                        *(
                            mean_and_range([best_ratio(h, d, r) for h, d in zip(held, dense)])
                            for r in (0.5, 0.75)
                        ),
                        f"{statistics.mean(sum(p['seconds'] for p in h) for h in held):.1f}",
                    ]
                )
            results[f"{rule}/{reference}"] = hv
            print_table(
                f"hypervolume at {budget:.1f} short dense controls of trial CPU per arm and seed (trials "
                f"{rule} within it), normalised by {whose} dense control; seeds {list(seeds)}",
                [
                    "arm",
                    *(f"seed {n}" for n in seeds),
                    "mean [min, max]",
                    "best ppl / dense, >= 50% removed",
                    ">= 75% removed",
                    "used (mean)",
                ],
                rows,
            )
            print_table(
                f"paired by seed ({rule} within, by {whose} dense control): each arm minus each other",
                ["arm", "minus", "by seed", "mean", "95% interval"],
                [[a, b, *paired(hv[a], hv[b])] for i, a in enumerate(arms) for b in arms[i + 1 :]],
            )
    gains = {}
    for short_arm, long_arm in sweep_pairs(short_arms, long_arms):
        found = same_size_gains(seeds, short_arm, long_arm, args.heads)
        gains[f"{long_arm} / {short_arm}"] = found
        print_table(
            f"{long_arm} against {short_arm} at the same head count and seed (every trial, whatever "
            "the budget): perplexity / perplexity - 1, percent",
            ["heads kept", "sizes x seeds", "median", "range"],
            [
                [band, str(len(v)), f"{statistics.median(v):+.1f}%", f"{min(v):+.1f}% .. {max(v):+.1f}%"]
                for band, v in sorted(found.items(), key=lambda kv: int(kv[0].split("-")[0]))
            ],
        )
    print_json("trial_length", {"budget_short_dense": budget, "hypervolume": results, "same_size_pct": gains})


if __name__ == "__main__":
    main()
