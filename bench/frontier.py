"""The default study's front against what a user would get without it, at equal compute.

    python -m bench.frontier --seeds 3 --budget-minutes 25 [--arms searched,iterative,...]
                             [--study studies/python_code.toml] [--set trial.finetune_steps=300 ...]

Every arm of one seed starts from the same dense checkpoint and spends the same budget of trial
CPU time (``--budget-minutes`` of CPU, one trial at a time with the study's threads; CPU time,
not wall time, so that seeds may run side by side in separate processes): it starts trials until
the finished ones' CPU time adds up to the budget, so the last one may run past it; the table
shows what each arm used. Seeds side by side, e.g. on 2 cores:

    for s in 0 1 2; do python -m bench.frontier --seed-list $s --save f$s.json & done; wait
    python -m bench.frontier --merge f0.json f1.json f2.json   # runs of other arms too

Runs of other arms merge also from a machine of another speed, their budgets being equal in
trials of the dense control (``merge_seeds``; ``--same-machine`` where they all ran on one, whose
dense controls then differ only by the load beside them), and runs with other settings (``--set``)
with ``--label NAME``: their arms are ARM:NAME, beside the default run's ARM.

The arms:

- ``searched@SAMPLER`` (e.g. ``searched@tpe_multivariate``): the same with ``[study] sampler = SAMPLER``,
  to compare the samplers side by side (each searched arm is judged by the targets below);
- ``searched``: the default study as ``launch-study run --n-trials N`` runs it, N being the full
  trials the budget affords (Ray Tune + Optuna, early stopping as the study file says, the
  controlled dense control, a start-up sweep over N/2 + 1 sparsities, at most one per head
  count, of ``[startup] method`` (several in turn when it lists several), else the first listed method,
  at ``[startup]``'s settings, then the sampler);
- ``random``, ``importance``, ``l0_target``, ``topk``: sweeps of one method at sparsities spread
  evenly over the study's range (every prefix covers it), every other knob as the searched
  study's start-up sets it for that method (``[startup]``, else its default): the start-up run
  on with one method;
- ``l0_penalty``: Shim et al.'s recipe, a sweep over lambda (log-spread over ``--l0-lambda``,
  [10, 150] unless given), the sparsity being what lambda gives, the other knobs as the sweeps';
- ``plain_tune``: Ray Tune with its ``OptunaSearch`` (TPE on both objectives, seeded) over the
  same search space, no early stopping, no dense control, no start-up spread: a user's own
  search;
- ``iterative``: gradual pruning without a search (Zhu & Gupta 2017): a schedule fixed before the
  run, each step pruning the previous step's model (warm starts) further, with the start-up's
  method and knobs and the same trial budget. A chain visits the start-up's sparsities (as many
  as the searched arm's start-up has, the same values) from the lowest to the highest; a budget
  left after a chain starts the next one from the dense model, over the spread's next values.
  It differs from the searched arm (warm starts on) by the search alone.

Every figure is selected by validation and reported on the test split (``--study``'s corpus has
one; a study file without one reports validation, and says so): an arm's front is its points
non-dominated by validation perplexity, its hypervolume and ratios are theirs on test. Each ratio
is given twice: against the dense control, and against the point's matched reference, the dense
model trained along the point's lineage (``trainers/reference.py``; ``--no-reference`` skips it),
so that a lead made of more training shows as one.

Each seed also runs the dense control once (nothing sampled, as the study's trial 0). Every
arm's front holds it and every arm pays for it: the searched arm runs its own, the others share
this one and have its CPU time taken from their budget (until December 2026 it was free to them).
Every front is normalised by it: perplexity / dense, parameters / dense, reference point (2, 1).
A second table gives each arm's hypervolume after a quarter, a half and three quarters of the
budget (its first trials within that much CPU), so one run shows where one arm passes another.
Per arm: the hypervolume, the best perplexity / dense among points with >= 50% and >= 75% of the
heads removed, the trials finished and the configurations per CPU-hour. Per searched arm, its
hypervolume minus each other arm's, paired by seed, with the mean's 95% t-interval: with 3 seeds
an interval that holds 0 says the seeds cannot tell the two apart. Targets (issue 11): the
searched hypervolume beats every other arm on the mean and on at least 2 of 3 seeds (by more
than ``TIE``, the tables' last digit); at 50%
removed its best point is within 2% of the dense control, at 75% within 10%.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import uuid
from dataclasses import replace
from functools import partial
from pathlib import Path

import optuna
import torch
from ray.tune.stopper import Stopper

from bench.common import print_json, print_table
from orchestrator.config import SAMPLERS, load_study_config
from orchestrator.frontier import pareto_front
from orchestrator.inputs import prepare_inputs, study_dense_checkpoint
from orchestrator.records import perplexity_ratio
from orchestrator.report import normalised_hypervolume
from orchestrator.runner import run_study, startup_trials
from orchestrator.search_space import Range, SearchSpace
from orchestrator.session import RunOptions
from trainers.gates import heads_to_keep
from trainers.hparams import TrialHParams
from trainers.reference import MatchedReference
from trainers.trial import TrialIO, TrialSetup, run_trial

REPO = Path(__file__).resolve().parent.parent
STUDY = REPO / "studies" / "tinyshakespeare.toml"
SWEEPS = ("random", "importance", "l0_target", "topk")  # one method over the sparsity spread
ARMS = ("searched", "iterative", *SWEEPS, "l0_penalty", "plain_tune")
# The l0_penalty sweep's lambdas: with the sweeps' distillation and 50 gate steps (3 seeds;
# BENCHMARKS.md, "Shim's l0_penalty with distillation") lambda 10-14 removes 9-19% of the heads,
# 45-70 removes 56-78% and 100-150 removes 72-88% (on two seeds of three nearly every such trial
# keeps only the floor of one head a layer), so this range covers the front. The earlier [0.1, 10]
# was measured without distillation, where a quarter of its trials removed no head; with
# distillation lambda 13 or less removed at most 19% in every trial measured.
LAMBDA_RANGE = (10.0, 150.0)
# A seed (or the mean) counts as won only by more than the tables' last digit: two fronts of the
# same trials differ in float noise, and a run once counted such a tie as a win ("met").
TIE = 1e-4


def point(result, hparams: dict) -> dict:
    """A finished trial's point, with the settings it ran with (which of them moved a point is
    what the comparison between arms has to explain)."""
    return {
        "method": result.method,
        "sparsity": result.sparsity,
        "ppl": result.val_perplexity,
        "test_ppl": result.test_perplexity,
        "params": result.n_params,
        "seconds": result.cpu_seconds,
        "hparams": hparams,
        "lineage": result.lineage,
    }


POINT_KEYS = ("method", "sparsity", "ppl", "test_ppl", "params", "seconds", "hparams", "lineage")


def timed_trial(setup: TrialSetup, hp: TrialHParams, io: TrialIO | None = None) -> dict:
    return point(run_trial(setup, hp, io or TrialIO()), hp.to_dict())


def searched_arm(cfg, seed: int, budget_s: float, artifacts: Path, startup: int, sampler: str) -> list[dict]:
    study = replace(cfg.study, seed=seed, startup_trials=startup, sampler=sampler)
    name = f"frontier-seed{seed}-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as tmp:
        opts = RunOptions(
            storage_url=f"sqlite:///{tmp}/study.db",
            # A name of its own: trial folders (<artifacts>/trials/<name>/<n>) are not shared
            # with another seed or an earlier run.
            study_name=name,
            n_trials=100_000,  # the budget ends it
            max_concurrent=1,
            artifacts=artifacts,
            output_csv=Path(tmp) / "front.csv",
            trial_cpu_seconds_budget=budget_s,
        )
        run_study(replace(cfg, study=study), opts)
        return study_points(optuna.load_study(study_name=name, storage=opts.storage_url))


def study_points(study: optuna.Study) -> list[dict]:
    """A searched arm's finished trials in the order they ran: a point for each COMPLETE one,
    and for each stopped early its compute (it has no final point)."""
    points = []
    for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)):
        if t.state == optuna.trial.TrialState.COMPLETE:
            points.append(
                {
                    "method": t.user_attrs["method"],
                    "sparsity": t.user_attrs["sparsity"],
                    "ppl": t.values[0],
                    "test_ppl": t.user_attrs.get("test_perplexity"),
                    "params": int(t.values[1]),
                    "seconds": t.user_attrs["cpu_seconds"],
                    "hparams": t.user_attrs["hparams"],
                    "lineage": t.user_attrs.get("lineage"),
                }
            )
        else:
            points.append({"method": "pruned", "seconds": t.user_attrs["cpu_seconds"]})
    return points


def sweep_hparams(space: SearchSpace, method: str, index: int, **values) -> TrialHParams:
    """The searched study's ``index``-th start-up trial (the even spread's sparsity,
    ``[startup]``'s settings, defaults) with ``method`` swept instead: a sweep is the study's own
    start-up run on with one method, so the searched arm's edge over it is what the sampler and
    early stopping add."""
    return TrialHParams(**space.sweep_point(method, index, **values))


def l0_penalty_at(space: SearchSpace, index: int, lambda_range=LAMBDA_RANGE) -> TrialHParams:
    """The ``index``-th lambda of an even spread of log(lambda) over ``lambda_range``, the other
    settings as a sweep's."""
    log_range = SearchSpace({"x": Range(*(math.log(v) for v in lambda_range))})
    return sweep_hparams(space, "l0_penalty", index, l0_lambda=math.exp(log_range.spread("x", index)))


# Methods whose trial depends on its sparsity only through the head count it keeps (the exact
# budget, trainers.gates.heads_to_keep): two sparsities that keep as many heads run the same trial.
BY_HEAD_COUNT = ("importance", "random")


def sweep_arm(setup: TrialSetup, hparams_at, budget_s: float, dense: dict, run=timed_trial) -> list[dict]:
    """The dense control's point (its CPU time counts against the budget), then trials
    ``hparams_at(0), hparams_at(1), ...`` until the budget is spent.

    A sweep over a range of 27 head counts repeats one from its 28th trial (every start-up
    trial a new head count, ``SearchSpace.start_sparsity``; before December 2026 from about its
    19th, the plain spread); for a method of BY_HEAD_COUNT the repeat is the same trial (same
    heads, batches and seed), so after the first repeat has been run and scored exactly as the
    trial it repeats, later repeats are not run again: the earlier point is taken, its CPU time
    charged again. The arm's front and budget are what running them would give; only the
    benchmark's wall time is saved. A first repeat that scores differently turns this off for
    the arm."""
    total_heads = sum(setup.dense.model_config.layer_heads)
    points, spent, index = [dense], dense["seconds"], 0
    ran: dict[str, dict] = {}
    reuse: bool | None = None  # None until the first repeat has been run and compared
    while spent < budget_s:
        hp = hparams_at(index)
        key = hp.to_dict()
        if hp.method in BY_HEAD_COUNT:
            key["sparsity"] = heads_to_keep(total_heads, hp.sparsity)
        key = json.dumps(key, sort_keys=True)
        note = ""
        if key in ran and reuse:
            p, note = dict(ran[key]), " (a repeat, not run again)"
        else:
            p = run(setup, hp)
            if key in ran and reuse is None:
                reuse = p["ppl"] == ran[key]["ppl"]
                note = f" (a repeat, run: {'the same' if reuse else 'NOT the same'} perplexity)"
            ran.setdefault(key, p)
        points.append(p)
        spent += p["seconds"]
        index += 1
        print(
            f"    {p['method']} sparsity {p['sparsity']:.3f}: ppl {p['ppl']:.3f} ({spent:.0f}s){note}",
            flush=True,
        )
    return points


def iterative_arm(
    setup: TrialSetup,
    space: SearchSpace,
    chain: int,
    budget_s: float,
    dense: dict,
    folder: Path,
    max_steps: int | None = None,
) -> list[dict]:
    """Gradual pruning on a fixed schedule: chains of ``chain`` steps over the start-up's
    sparsities (the ``k``-th chain the spread's values ``k * chain`` to ``(k + 1) * chain - 1``,
    lowest first), each step warm-started from the previous one's model, with the start-up's
    method and knobs, until the budget is spent (the dense control's CPU time included). A step
    that would remove nothing (the spread's next value keeps as many heads as the previous step's
    model) is passed over: it is not run and costs nothing. ``max_steps``: at most so many steps
    of the schedule (a test's bound)."""
    method = space.startup_methods()[0]
    points, spent, step = [dense], dense["seconds"], 0
    while spent < budget_s and (max_steps is None or step < max_steps):
        first = (step // chain) * chain
        schedule = sorted(range(first, first + chain), key=lambda i: space.start_sparsity(i))
        parent = None
        for index in schedule:
            if spent >= budget_s or (max_steps is not None and step >= max_steps):
                break
            hp = sweep_hparams(space, method, index)
            save_dir = folder / f"step{step}"
            step += 1
            try:
                p = timed_trial(setup, hp, TrialIO(save_dir=save_dir, parent=parent))
            except ValueError as err:  # the parent keeps no more heads than this target
                print(f"    step {step - 1}: passed over ({err})", flush=True)
                continue
            parent = save_dir
            points.append(p)
            spent += p["seconds"]
            print(
                f"    {p['method']} sparsity {p['sparsity']:.3f}: ppl {p['ppl']:.3f} after "
                f"{p['lineage'] and len(p['lineage'])} steps of the chain ({spent:.0f}s)",
                flush=True,
            )
    return points


class DefineByRun:
    """OptunaSearch's space: the study's own suggest, conditions included. A module-level class,
    since Tune pickles its searcher (and stopper) into the experiment folder."""

    def __init__(self, space: SearchSpace) -> None:
        self.space = space

    def __call__(self, trial: optuna.Trial) -> None:
        self.space.suggest(trial)


class TrialTimeBudget(Stopper):
    """Ends the experiment once the finished trials' own seconds add up to the budget, and keeps
    their points (runs in the driver; Tune's result files are off in this process, see runner).
    Tune hands a finished function trainable's last result to the stopper a second time: each
    trial counts once (before December 2026 it counted twice, and plain Tune ran on about half
    the budget)."""

    def __init__(self, budget_s: float) -> None:
        self.budget_s, self.spent, self.points = budget_s, 0.0, []
        self.counted: set[str] = set()

    def __call__(self, trial_id: str, result: dict) -> bool:
        if "ppl" in result and trial_id not in self.counted:
            self.counted.add(trial_id)
            self.spent += result["seconds"]
            self.points.append({k: result[k] for k in POINT_KEYS})
        return False

    def stop_all(self) -> bool:
        return self.spent >= self.budget_s


def plain_tune_arm(cfg, setup: TrialSetup, seed: int, budget_s: float) -> list[dict]:
    """Ray Tune + OptunaSearch, as a user would write it: TPE on both objectives."""
    import ray
    from ray import tune
    from ray.tune.search.optuna import OptunaSearch

    def trainable(config: dict) -> None:
        torch.set_num_threads(max(1, int(cfg.study.cpus_per_trial)))
        hparams = TrialHParams(**{**cfg.search.control_point(), **config})
        result = run_trial(setup, hparams)
        tune.report(point(result, hparams.to_dict()) | {"val_perplexity": result.val_perplexity})

    cpus = max(1, math.ceil(cfg.study.cpus_per_trial))
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            searcher = OptunaSearch(
                DefineByRun(cfg.search),
                metric=["val_perplexity", "params"],
                mode=["min", "min"],
                sampler=optuna.samplers.TPESampler(seed=seed),
            )
            budget = TrialTimeBudget(budget_s)
            tune.Tuner(
                tune.with_resources(trainable, {"cpu": cfg.study.cpus_per_trial}),
                tune_config=tune.TuneConfig(search_alg=searcher, num_samples=-1, max_concurrent_trials=1),
                run_config=tune.RunConfig(storage_path=tmp, stop=budget, verbose=0),
            ).fit()
            return budget.points
    finally:
        ray.shutdown()


def reported(p: dict) -> float:
    """What a point reports: its test perplexity, its validation one where the corpus (or a run
    saved before test splits) has no test split."""
    return p["test_ppl"] if p.get("test_ppl") is not None else p["ppl"]


def best_by_validation(points: list[dict], removed: float) -> dict | None:
    """The finished point with at least ``removed`` of the heads gone that validation picks
    (stopped trials have no point)."""
    found = [p for p in points if "ppl" in p and p["sparsity"] >= removed - 1e-9]
    return min(found, key=lambda p: p["ppl"]) if found else None


def best_ratio(points: list[dict], dense: dict, removed: float) -> float | None:
    """``best_by_validation``'s reported perplexity / the dense control's."""
    best = best_by_validation(points, removed)
    if not best:
        return None
    return perplexity_ratio(best.get("test_ppl"), best["ppl"], dense.get("test_ppl"), dense["ppl"])


def reference_ratio(points: list[dict], removed: float) -> float | None:
    """``best_by_validation``'s reported perplexity / its matched reference's (``add_references``);
    None where it has none."""
    best = best_by_validation(points, removed)
    reference = best.get("reference") if best else None
    if not reference:
        return None
    their = (reference["test_perplexity"], reference["val_perplexity"])
    return perplexity_ratio(best.get("test_ppl"), best["ppl"], *their)


def add_references(points: list[dict], replay: MatchedReference) -> None:
    """Each point a ratio is read from (``best_by_validation`` at 50% and 75%) gets its matched
    reference (``trainers/reference.py``), kept in the point: a run saved with them merges with
    them. A point without a recorded lineage gets none."""
    for removed in (0.5, 0.75):
        best = best_by_validation(points, removed)
        if best and best.get("lineage") and "reference" not in best:
            best["reference"] = replay.score(best["lineage"]).to_dict()


def summarise(points: list[dict], dense: dict) -> dict:
    seconds = sum(p["seconds"] for p in points)
    return {
        "hypervolume": hypervolume_within(points, dense, math.inf),
        "hypervolume_val": hypervolume_within(points, dense, math.inf, score=lambda p: p["ppl"]),
        "ppl_ratio_50": best_ratio(points, dense, 0.5),
        "ppl_ratio_75": best_ratio(points, dense, 0.75),
        "reference_ratio_50": reference_ratio(points, 0.5),
        "reference_ratio_75": reference_ratio(points, 0.75),
        "trials": len(points),
        "complete": sum("ppl" in p for p in points),
        "minutes": seconds / 60,
        "trials_per_cpu_hour": len(points) / max(1e-9, seconds) * 3600,
    }


def hypervolume_within(points: list[dict], dense: dict, seconds: float, score=reported) -> float:
    """The hypervolume of the arm's first trials, in the order they ran, whose CPU time adds up
    to at most ``seconds``: what the arm had found at that part of the budget. One run so shows
    at which budget one arm passes another (both measured side by side, not in separate runs).
    The front is chosen by validation and scored by ``score`` (default: on the test split,
    ``reported``), against the dense control scored the same way."""
    finished = [p for p in ended_within(points, seconds) if "ppl" in p]
    chosen = pareto_front(finished, key=lambda p: (p["ppl"], p["params"]))
    found = [(score(p), p["params"]) for p in chosen]
    return normalised_hypervolume(found, (score(dense), dense["params"]))


def mean_and_range(values: list[float | None]) -> str:
    """Mean [min, max]; over the seeds that have a value, said when some have none."""
    known = [v for v in values if v is not None]
    if not known:
        return "-"
    some = f" ({len(known)} of {len(values)} seeds)" if len(known) < len(values) else ""
    if len(known) == 1:
        return f"{known[0]:.4f}{some}"
    return f"{statistics.mean(known):.4f} [{min(known):.4f}, {max(known):.4f}]{some}"


def run_seed(
    cfg,
    seed: int,
    arms: list[str],
    budget_s: float,
    artifacts: Path,
    inputs,
    lambda_range=LAMBDA_RANGE,
    references: bool = True,
) -> dict:
    corpus, checkpoint = inputs
    setup = TrialSetup(corpus, checkpoint, cfg.budget, seed)
    dense = timed_trial(setup, TrialHParams(**cfg.search.control_point()))
    # The searched arm as a user would run it on this budget: --n-trials = the full trials it
    # affords, hence the default rule's start-up spread (half of them, at most one per size).
    affords = max(1, int(budget_s // dense["seconds"]))
    space = cfg.search.for_model(setup.dense.model_config.layer_heads)  # as the study's start-up
    startup = startup_trials(cfg, affords, space)
    print(
        f"seed {seed}: dense control ppl {dense['ppl']:.3f} ({dense['seconds']:.0f} CPU-s); "
        f"the budget affords {affords} full trials, {startup} of them start-up",
        flush=True,
    )
    found: dict[str, list[dict]] = {}
    for arm in arms:
        print(f"  seed {seed}, arm {arm}", flush=True)
        if arm.startswith("searched"):
            sampler = arm.partition("@")[2] or cfg.study.sampler
            found[arm] = searched_arm(cfg, seed, budget_s, artifacts, startup, sampler)
        elif arm in SWEEPS:
            sweep = partial(sweep_hparams, space, arm)
            found[arm] = sweep_arm(setup, sweep, budget_s, dense)
        elif arm == "l0_penalty":
            lambdas = partial(l0_penalty_at, space, lambda_range=lambda_range)
            found[arm] = sweep_arm(setup, lambdas, budget_s, dense)
        elif arm == "plain_tune":
            found[arm] = [dense, *plain_tune_arm(cfg, setup, seed, budget_s - dense["seconds"])]
        elif arm == "iterative":
            with tempfile.TemporaryDirectory(dir=artifacts) as chain_dir:
                found[arm] = iterative_arm(setup, space, startup, budget_s, dense, Path(chain_dir))
    if references:  # one replay per seed: the arms' lineages share their prefixes
        print(f"  seed {seed}: matched references", flush=True)
        replay = MatchedReference(setup)
        for points in found.values():
            add_references(points, replay)
    return {"seed": seed, "dense": dense, "arms": found}


def report(per_seed: list[dict], budget_minutes: float, cpus_per_trial: float) -> None:
    """Per-seed tables, then mean [min, max] over the seeds, then the targets."""
    arms = list(per_seed[0]["arms"])
    split = "test" if all(seed["dense"].get("test_ppl") is not None for seed in per_seed) else "validation"
    print(
        f"fronts chosen by validation, scored on the {split} split"
        + ("" if split == "test" else " (no test split: the split the arms selected on)"),
        flush=True,
    )
    for seed in per_seed:
        seed["summary"] = {arm: summarise(points, seed["dense"]) for arm, points in seed["arms"].items()}
        print_table(
            f"seed {seed['seed']}, {budget_minutes:.3g} CPU-min of trials per arm "
            f"(dense control {split} ppl {reported(seed['dense']):.3f})",
            [
                "arm",
                "hypervolume",
                "(validation)",
                ">= 50% removed: / dense",
                "/ matched",
                ">= 75% removed: / dense",
                "/ matched",
                "trials (complete)",
                "CPU-min",
                "per CPU-h",
            ],
            [
                [
                    arm,
                    f"{s['hypervolume']:.4f}",
                    f"{s['hypervolume_val']:.4f}",
                    mean_and_range([s["ppl_ratio_50"]]),
                    mean_and_range([s["reference_ratio_50"]]),
                    mean_and_range([s["ppl_ratio_75"]]),
                    mean_and_range([s["reference_ratio_75"]]),
                    f"{s['trials']} ({s['complete']})",
                    f"{s['minutes']:.1f}",
                    f"{s['trials_per_cpu_hour']:.0f}",
                ]
                for arm, s in seed["summary"].items()
            ],
        )

    def column(arm: str, key: str) -> list:
        return [seed["summary"][arm][key] for seed in per_seed]

    print_table(
        f"mean [min, max] over {len(per_seed)} seed(s), {budget_minutes:.3g} CPU-min per arm and seed",
        [
            "arm",
            f"hypervolume ({split})",
            "(validation)",
            ">= 50% removed: / dense",
            "/ matched",
            ">= 75% removed: / dense",
            "/ matched",
            "trials/CPU-h",
        ],
        [
            [
                arm,
                mean_and_range(column(arm, "hypervolume")),
                mean_and_range(column(arm, "hypervolume_val")),
                mean_and_range(column(arm, "ppl_ratio_50")),
                mean_and_range(column(arm, "reference_ratio_50")),
                mean_and_range(column(arm, "ppl_ratio_75")),
                mean_and_range(column(arm, "reference_ratio_75")),
                f"{statistics.mean(column(arm, 'trials_per_cpu_hour')):.0f}",
            ]
            for arm in arms
        ],
    )
    # The last column is the whole run, as above: its last trial may end past the budget.
    fractions = (0.25, 0.5, 0.75, math.inf)
    print_table(
        "hypervolume as the budget is spent: mean [min, max] over the seeds of each arm's first "
        "trials within that much CPU",
        ["arm", *(f"{budget_minutes * f:.3g} CPU-min" for f in fractions[:-1]), "the whole run"],
        [
            [
                arm,
                *(
                    mean_and_range(
                        [
                            hypervolume_within(seed["arms"][arm], seed["dense"], budget_minutes * 60 * f)
                            for seed in per_seed
                        ]
                    )
                    for f in fractions
                ),
            ]
            for arm in arms
        ],
    )
    others = [a for a in arms if not a.startswith("searched")]
    for candidate in [a for a in arms if a.startswith("searched")]:
        mine = column(candidate, "hypervolume")
        rivals = [a for a in arms if a != candidate]  # other searched arms too (samplers side by side)
        if rivals:
            print_table(
                f"{candidate}'s hypervolume minus each other arm's, paired by seed (one seed's batches "
                "are every arm's): the mean and its 95% t-interval",
                ["arm", "by seed", "mean", "95% interval"],
                [[rival, *paired(mine, column(rival, "hypervolume"))] for rival in rivals],
            )
        # per other arm, the candidate's lead on each seed (its mean lead is their mean)
        leads = [[m - o for m, o in zip(mine, column(a, "hypervolume"))] for a in others]
        on_mean = all(statistics.mean(lead) > TIE for lead in leads)
        wins = [sum(d > TIE for d in lead) for lead in leads]
        ties = [sum(abs(d) <= TIE for d in lead) for lead in leads]
        enough = all(w >= math.ceil(2 * len(per_seed) / 3) for w in wins)
        # Against the matched references where the run has them (the yardstick for a lineage's
        # extra training), else against the dense control.
        ratios = column(candidate, "reference_ratio_50") + column(candidate, "reference_ratio_75")
        prefix = "reference_ratio" if all(r is not None for r in ratios) else "ppl_ratio"
        yardstick = "the matched reference" if prefix == "reference_ratio" else "the dense control"
        r50, r75 = column(candidate, f"{prefix}_50"), column(candidate, f"{prefix}_75")
        # With no arm but searched ones, "beats every other arm" would hold of nothing: say so, not "met".
        hypervolume = (
            f"hypervolume beats every other arm on the mean: {'met' if on_mean else 'not met'}; "
            f"on >= 2/3 of the seeds: {'met' if enough else 'not met'} (wins {dict(zip(others, wins))}, "
            f"ties within {TIE:g} {dict(zip(others, ties))})"
            if others
            else "hypervolume: no arm but searched ones here to compare with (--merge the others' saved runs)"
        )
        print(
            f"targets: {candidate} {hypervolume}; "
            f"50% removed within 2% of {yardstick}: {met(r50, 1.02)}; "
            f"75% removed within 10%: {met(r75, 1.10)} "
            f"(on the {split} split)"
        )


def met(ratios: list[float | None], at_most: float) -> str:
    """ "met" when every seed's ratio is known and at most ``at_most``."""
    return "met" if all(r is not None and r <= at_most for r in ratios) else "not met"


# Student's t, two-sided 95%, by degrees of freedom (seeds - 1); past 30, 2.0 (t at 60 df; from 31
# to 59 df a hair narrow, by at most 1.1%).
T_95 = {
    1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
    10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110,
    18: 2.101, 19: 2.093, 20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060,
    26: 2.056, 27: 2.052, 28: 2.048, 29: 2.045, 30: 2.042,
}  # fmt: skip


def paired(mine: list[float], theirs: list[float]) -> list[str]:
    """By seed, the mean and the 95% t-interval of ``mine - theirs``: the interval is what the
    seeds say about the difference; one that holds 0 is no evidence either way."""
    diffs = [m - t for m, t in zip(mine, theirs, strict=True)]
    mean = statistics.mean(diffs)
    if len(diffs) < 2:
        interval = "-"
    else:
        half = T_95.get(len(diffs) - 1, 2.0) * statistics.stdev(diffs) / math.sqrt(len(diffs))
        interval = f"[{mean - half:+.4f}, {mean + half:+.4f}]"
    return [" / ".join(f"{d:+.4f}" for d in diffs), f"{mean:+.4f}", interval]


def machine_scale(reference_seconds: float, own_seconds: float) -> float:
    """What a run's CPU seconds are multiplied by to read in the reference run's: the ratio of
    their dense controls' CPU times, or 1 within 3% (one machine's noise, not another machine)."""
    scale = reference_seconds / own_seconds
    return 1.0 if abs(scale - 1) <= 0.03 else scale


def merge_seeds(
    saved: list[dict], budget_minutes: float = math.inf, same_machine: bool = False
) -> tuple[list[dict], float]:
    """Saved runs as one, and the budget in minutes they are compared at: the arms of runs of
    the same seed side by side (from the same dense control, which is checked), the seeds in
    order.

    Runs made on machines of different speeds merge in units of the dense control: where its
    CPU time differs by more than 3% (another machine, not one machine's noise), a run's CPU
    times are scaled by the first run's over its own, so every arm's "CPU-min" and
    configurations per CPU-hour read in the first run's seconds (a machine 1.6x slower runs the
    other arms of a 28-minute comparison on a 45-minute budget); a seed whose first run came
    from another machine than the first seed's is scaled to the first seed's the same way.
    Every arm is then cut to the smallest budget among the runs, by the rule a run ends by (a
    trial starts while the CPU time spent is under the budget), so that arms whose budgets came
    out a little apart (one dense trial is a noisy yardstick of a machine's speed) still compare
    at equal compute; at
    ``budget_minutes`` where that is smaller (a subset of the runs compared at the budget of a
    larger merge). ``same_machine`` (``--same-machine``): the runs all ran on one machine, so CPU
    seconds are compared as measured; there a dense control's time moves with the load beside it
    (106-127 CPU-s for the same trial, two runs side by side), which is no machine's speed."""
    speed_ratio = (lambda reference, own: 1.0) if same_machine else machine_scale
    by_seed: dict[int, dict] = {}
    budgets: list[tuple[int, float]] = []  # (seed, a run's budget in the seconds of that seed's first run)
    for run in saved:
        if run["cpus_per_trial"] != saved[0]["cpus_per_trial"]:
            raise SystemExit("--merge: the runs have different threads per trial")
        for seed in run["seeds"]:
            known = by_seed.setdefault(seed["seed"], {**seed, "arms": {}})
            # The same checkpoint and seed: equal up to the rounding of another machine's arithmetic.
            if not math.isclose(known["dense"]["ppl"], seed["dense"]["ppl"], rel_tol=1e-6):
                raise SystemExit(f"--merge: seed {seed['seed']}'s runs have different dense controls")
            twice = set(known["arms"]) & set(seed["arms"])
            if twice:
                raise SystemExit(f"--merge: seed {seed['seed']} has arm(s) {', '.join(sorted(twice))} twice")
            scale = speed_ratio(known["dense"]["seconds"], seed["dense"]["seconds"])
            if scale != 1.0:
                print(
                    f"seed {seed['seed']}: {', '.join(seed['arms'])} ran where the dense control took "
                    f"{seed['dense']['seconds']:.0f} CPU-s against {known['dense']['seconds']:.0f}: "
                    f"their CPU times are scaled by {scale:.3f}",
                    flush=True,
                )
                seed = {**seed, "arms": rescaled(seed["arms"], scale)}
            budgets.append((seed["seed"], run["budget_minutes"] * 60 * scale))
            known["arms"].update(seed["arms"])
    arms = [set(by_seed[seed]["arms"]) for seed in by_seed]
    if any(a != arms[0] for a in arms):
        raise SystemExit("--merge: the seeds do not all have the same arms")
    # Seeds whose first runs were on machines of other speeds (seeds added later, elsewhere): in
    # the first seed's seconds too, so that one budget is equal compute.
    first = by_seed[saved[0]["seeds"][0]["seed"]]["dense"]["seconds"]
    factor = {}
    for number, seed in by_seed.items():
        factor[number] = speed_ratio(first, seed["dense"]["seconds"])
        if factor[number] != 1.0:
            print(
                f"seed {number}: its first run's dense control took {seed['dense']['seconds']:.0f} CPU-s "
                f"against {first:.0f} (the first seed's): its CPU times are scaled by {factor[number]:.3f}",
                flush=True,
            )
            by_seed[number] = {
                **seed,
                "dense": {**seed["dense"], "seconds": seed["dense"]["seconds"] * factor[number]},
                "arms": rescaled(seed["arms"], factor[number]),
            }
    budget_s = min([budget_minutes * 60, *(b * factor[number] for number, b in budgets)])
    merged = [by_seed[seed] for seed in sorted(by_seed)]
    for seed in merged:
        for arm, points in seed["arms"].items():
            seed["arms"][arm] = within_budget(points, budget_s)
            if len(seed["arms"][arm]) < len(points):
                print(
                    f"seed {seed['seed']}: {arm} cut to {budget_s / 60:.1f} CPU-min "
                    f"({len(points) - len(seed['arms'][arm])} trials left out)",
                    flush=True,
                )
    return merged, budget_s / 60


def rescaled(arms: dict[str, list[dict]], scale: float) -> dict[str, list[dict]]:
    """The arms' points with their CPU times in another machine's seconds."""
    return {arm: [{**p, "seconds": p["seconds"] * scale} for p in points] for arm, points in arms.items()}


def within_budget(points: list[dict], budget_s: float) -> list[dict]:
    """The points a run with this budget would have: a trial starts while the CPU time spent
    is under the budget (so the last one may end past it)."""
    kept, spent = [], 0.0
    for p in points:
        if spent >= budget_s:
            break
        kept.append(p)
        spent += p["seconds"]
    return kept


def ended_within(points: list[dict], budget_s: float) -> list[dict]:
    """The first points whose CPU time adds up to at most the budget: the trials that ended
    within it (``within_budget`` also holds the one that started within it and ended past)."""
    kept, spent = [], 0.0
    for p in points:
        spent += p["seconds"]
        if spent > budget_s:
            break
        kept.append(p)
    return kept


def labelled(per_seed: list[dict], label: str) -> list[dict]:
    """The seeds' arms named ARM:LABEL: a run with other settings (``--set``) merges beside the
    same arms of the default run, and a labelled ``searched`` arm is judged by the targets too."""
    return [
        {**seed, "arms": {f"{arm}:{label}": list(pts) for arm, pts in seed["arms"].items()}}
        for seed in per_seed
    ]


def read_saved(parser: argparse.ArgumentParser, path: Path) -> dict:
    """A run saved with --save; a missing or unreadable file is the user's mistake: one line."""
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        parser.error(f"--merge: cannot read {path}: {error}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="run seeds 0 .. N-1")
    parser.add_argument(
        "--seed-list", help="these seeds instead, e.g. 2 (one process per seed, side by side)"
    )
    parser.add_argument(
        "--budget-minutes",
        type=float,
        help="trial CPU time per arm and seed (default 25); with --merge, cut every arm to it where "
        "the runs' smallest budget is larger",
    )
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument(
        "--l0-lambda",
        type=float,
        nargs=2,
        default=LAMBDA_RANGE,
        metavar=("LOW", "HIGH"),
        help="the l0_penalty arm's lambda range (default %(default)s)",
    )
    parser.add_argument("--set", action="append", default=[], help="a study-file override, as the CLI's")
    parser.add_argument("--study", type=Path, default=STUDY, help="the study file (default: %(default)s)")
    parser.add_argument(
        "--no-reference",
        action="store_true",
        help="skip the matched references (the dense model replaying each ratio's point's lineage)",
    )
    parser.add_argument("--artifacts", type=Path, default=REPO / "runs" / "artifacts")
    parser.add_argument("--save", type=Path, help="also write the per-seed points here (JSON)")
    parser.add_argument(
        "--label",
        help="name the arms ARM:LABEL (e.g. a run with other --set values), so that --merge holds "
        "them beside the same arms of another run",
    )
    parser.add_argument("--merge", type=Path, nargs="+", help="report saved runs together; run nothing")
    parser.add_argument(
        "--same-machine",
        action="store_true",
        help="with --merge: the runs all ran on this one machine; compare their CPU seconds as measured "
        "instead of rescaling by their dense controls' times (which move with the load beside them)",
    )
    args = parser.parse_args()
    if args.budget_minutes is not None and not args.budget_minutes > 0:
        parser.error(f"--budget-minutes must be above 0, got {args.budget_minutes}")
    if args.merge:
        saved = [read_saved(parser, path) for path in args.merge]
        merged, budget_minutes = merge_seeds(
            saved, math.inf if args.budget_minutes is None else args.budget_minutes, args.same_machine
        )
        report(merged, budget_minutes, saved[0]["cpus_per_trial"])
        return
    if not 0 < args.l0_lambda[0] < args.l0_lambda[1]:
        parser.error(f"--l0-lambda: need 0 < LOW < HIGH, got {args.l0_lambda[0]} {args.l0_lambda[1]}")
    arms = args.arms.split(",")
    known = set(ARMS) | {f"searched@{sampler}" for sampler in SAMPLERS}
    unknown = sorted(set(arms) - known)
    if unknown:
        raise SystemExit(f"unknown arm(s) {', '.join(unknown)}; choose from {', '.join(sorted(known))}")
    seeds = [int(s) for s in args.seed_list.split(",")] if args.seed_list else list(range(args.seeds))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    cfg = load_study_config(args.study, args.set)
    artifacts = args.artifacts.resolve()
    corpus, model_cfg = prepare_inputs(cfg)
    checkpoint = study_dense_checkpoint(cfg, corpus, model_cfg, artifacts)
    torch.set_num_threads(max(1, int(cfg.study.cpus_per_trial)))
    if args.budget_minutes is None:
        args.budget_minutes = 25.0
    budget_s = args.budget_minutes * 60
    inputs, lambdas = (corpus, checkpoint), tuple(args.l0_lambda)
    per_seed = [
        run_seed(cfg, seed, arms, budget_s, artifacts, inputs, lambdas, not args.no_reference)
        for seed in seeds
    ]
    if args.label:
        per_seed = labelled(per_seed, args.label)
    payload = {"budget_minutes": args.budget_minutes, "cpus_per_trial": cfg.study.cpus_per_trial}
    payload["seeds"] = per_seed
    if args.save:
        args.save.write_text(json.dumps(payload))
    report(per_seed, args.budget_minutes, cfg.study.cpus_per_trial)
    print_json("frontier", payload)


if __name__ == "__main__":
    main()
