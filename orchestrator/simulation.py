"""A discrete-event simulator that runs a study's trials on a virtual clock, for the driver.

Measuring the driver at 10,000 trials with 256 in flight on Ray Tune would take 256 actors
(which do not fit 24 GiB) and hours of training. The simulator trains nothing and starts no
actor: each trial is a ``SimulatedTrial`` (its rung perplexities, its result, its duration) drawn
from a trial model, and events (a rung reached, a trial done) are taken off a heap in order of
their virtual time. Everything else is the real thing, called the way Ray Tune calls it: the
searcher (``execution.StudySearcher``: Optuna's ask and the search space), the callback
(``execution.StudyCallback``: the tell, the frontier table, the note), the early-stopping
scheduler (``early_stopping.ParetoHalvingScheduler``) and the stopper (lease lost, interrupt),
on the real study in the real database. The driver cannot tell (Syne Tune's simulator
backend, a virtual clock driving the real schedulers, is the model).

What it does not see: Ray Tune's own controller, whose per-trial cost grows with the number of
trials it tracks (``bench.driver`` measures it beside the simulator and reports the gap).
"""

from __future__ import annotations

import heapq
import itertools
import json
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ray.tune.schedulers import TrialScheduler
from ray.tune.search import Searcher

from orchestrator.execution import (
    RESULT_KEY,
    DriverTimings,
    RunStopper,
    StudyCallback,
    StudyDriver,
    StudySearcher,
    rung_result,
)
from trainers.gates import heads_to_keep
from trainers.pruning.registry import removes_heads
from trainers.trial import RungReport, TrialResult


@dataclass
class SimulatedTrial:
    """What one trial would report: the perplexity at each rung (a fraction of its fine-tuning
    steps, ``rungs``), then its final result (``execution.train_on_worker``'s last report, or an
    error), after ``seconds``."""

    seconds: float
    rung_perplexities: list[float]
    final: dict[str, Any]
    n_params: int
    finetune_steps: int = 900


TrialModel = Callable[[dict[str, Any], random.Random], SimulatedTrial]


@dataclass
class _Running:
    """A trial in flight, as much of Tune's ``Trial`` as the searcher, scheduler and callback read."""

    trial_id: str
    config: dict[str, Any]
    plan: SimulatedTrial
    last_result: dict[str, Any] = field(default_factory=dict)

    def get_error(self) -> None:
        return None


@dataclass
class SimulationStats:
    """What a simulated run did, on its virtual clock."""

    started: int = 0
    stopped_at_rung: int = 0
    completed: int = 0
    virtual_seconds: float = 0.0
    most_in_flight: int = 0
    # Trials started with the method and sparsity (to 0.01) of one still running: with many in
    # flight a sampler that does not see the running trials proposes the same point again
    # (the default study has about 80 (method, size) cells: with 256 in flight most repeat one).
    same_as_running: int = 0
    identical_to_running: int = 0  # every hyperparameter equal to a running trial's


class SimulatedExecutor:
    """Runs the driver's trials on a virtual clock: ``in_flight`` at a time, each drawn from
    ``trial_model`` for its config, rungs at the fractions ``rungs`` of its duration."""

    def __init__(
        self, trial_model: TrialModel, *, in_flight: int, rungs: tuple[float, ...], seed: int = 0
    ) -> None:
        self.trial_model, self.in_flight, self.rungs = trial_model, in_flight, rungs
        self.rng = random.Random(seed)
        self.stats = SimulationStats()
        self.timings = DriverTimings()  # its own work and the scheduler's, apart from the driver's

    def run(self, driver: StudyDriver, scheduler: TrialScheduler) -> None:
        searcher, callback, stopper = StudySearcher(driver), StudyCallback(driver), RunStopper(driver)
        events: list[tuple[float, int, str, int]] = []  # (time, order, trial id, rung index or -1)
        order = itertools.count()
        running: dict[str, _Running] = {}
        ids = itertools.count()
        now, asking = 0.0, True
        driver.use_clock(lambda: now)  # a trial's wall seconds are virtual ones
        while True:
            while asking and len(running) < self.in_flight and not stopper.stop_all():
                trial_id = f"sim_{next(ids):06d}"
                config = searcher.suggest(trial_id)
                if config is None or config == Searcher.FINISHED:
                    asking = config is None  # None: wait for a trial to finish; FINISHED: done
                    break
                with self.timings.measure("simulator"):
                    plan = self.trial_model(config, self.rng)
                    point = _point(config)
                    self.stats.same_as_running += any(_point(t.config) == point for t in running.values())
                    hparams = config["hparams"]
                    self.stats.identical_to_running += any(
                        t.config["hparams"] == hparams for t in running.values()
                    )
                running[trial_id] = _Running(trial_id, config, plan)
                self.stats.started += 1
                self.stats.most_in_flight = max(self.stats.most_in_flight, len(running))
                reports = plan.rung_perplexities if removes_heads(config["hparams"]["method"]) else []
                for rung, fraction in enumerate(self.rungs[: len(reports)]):
                    heapq.heappush(events, (now + fraction * plan.seconds, next(order), trial_id, rung))
                heapq.heappush(events, (now + plan.seconds, next(order), trial_id, -1))
            if not events or stopper.stop_all():
                break
            now, _, trial_id, rung = heapq.heappop(events)
            trial = running.get(trial_id)
            if trial is None:
                continue  # stopped at an earlier rung: its later events are void
            if rung >= 0:
                result = rung_report(trial.plan, rung, self.rungs[rung])
                with self.timings.measure("rung decisions"):
                    decision = scheduler.on_trial_result(None, trial, result)
                callback.on_trial_result(0, [], trial, result)
                trial.last_result = result
                if decision != TrialScheduler.STOP:
                    continue
                self.stats.stopped_at_rung += 1
            else:
                trial.last_result = trial.plan.final
                with self.timings.measure("rung decisions"):
                    scheduler.on_trial_complete(None, trial, trial.plan.final)
                self.stats.completed += 1
            del running[trial_id]
            callback.on_trial_complete(0, [], trial)
            asking = True
        self.stats.virtual_seconds = now


def _point(config: dict[str, Any]) -> tuple[str, float | None]:
    hparams = config["hparams"]
    return hparams["method"], round(hparams["sparsity"], 2) if "sparsity" in hparams else None


class MeasuredTrials:
    """A trial model from measured trials ``points`` (sparsity, perplexity, parameters) and
    durations ``seconds`` (``bench.driver`` reads them from the 3-seed comparisons): a
    simulated trial takes the duration of a measured one drawn at random, and the perplexity of
    a measured trial near its sparsity (within 0.07) times 1% noise (the spread between seeds);
    its size is the measured sizes' linear fit in sparsity. A warm start (``parent_dir``) is
    0.5% better, about the measured gain. Its rung perplexities are the final one x
    (1 + 0.6 (1 - f)^2) with 3% noise: a rung is part-way through fine-tuning, above the end,
    and noisier. The rest of its result is what a worker reports (``trainers.trial.TrialResult``)."""

    def __init__(
        self, points: list[tuple[float, float, float]], seconds: list[float], layer_heads: list[int]
    ) -> None:
        self.points, self.seconds, self.layer_heads = sorted(points), list(seconds), list(layer_heads)
        slope, intercept = statistics.linear_regression([p[0] for p in points], [p[2] for p in points])
        self.slope, self.intercept = slope, intercept

    def __call__(self, config: dict[str, Any], rng: random.Random) -> SimulatedTrial:
        hparams = config["hparams"]
        default = rng.uniform(0.05, 0.875) if removes_heads(hparams["method"]) else 0.0
        sparsity = hparams.get("sparsity", default)
        total, layers = sum(self.layer_heads), len(self.layer_heads)
        kept = heads_to_keep(total, sparsity) if sparsity else total
        near = [p for p in self.points if abs(p[0] - sparsity) <= 0.07] or self.points
        warm = 0.995 if config.get("parent_dir") else 1.0
        ppl = rng.choice(near)[1] * rng.lognormvariate(0, 0.01) * warm
        n_params = int(self.intercept + self.slope * (1 - kept / total))
        per_layer = [kept // layers + (i < kept % layers) for i in range(layers)]
        seconds = rng.choice(self.seconds)
        result = TrialResult(
            val_perplexity=ppl,
            n_params=n_params,
            n_params_nonembed=n_params,
            sparsity=1 - kept / total,
            heads_per_layer=per_layer,
            kept_heads=[list(range(k)) for k in per_layer],
            method=hparams["method"],
            tokens_per_s=0.0,
            cpu_seconds=seconds,
        ).to_dict()
        final = {
            "val_perplexity": ppl,
            "n_params": n_params,
            RESULT_KEY: json.dumps(result | {"model_sha256": f"{rng.getrandbits(128):032x}"}),
            "node_id": "simulated",
        }
        rungs = [ppl * (1 + 0.6 * (1 - f) ** 2) * rng.lognormvariate(0, 0.03) for f in (1 / 9, 1 / 3)]
        return SimulatedTrial(seconds=seconds, rung_perplexities=rungs, final=final, n_params=n_params)


def rung_report(plan: SimulatedTrial, rung: int, fraction: float) -> dict[str, Any]:
    """What a worker reports at a rung (``execution.rung_result``), for a simulated trial."""
    return rung_result(
        RungReport(
            rung=rung,
            step=round(fraction * plan.finetune_steps),
            steps=plan.finetune_steps,
            val_perplexity=plan.rung_perplexities[rung],
            n_params=plan.n_params,
            cpu_seconds=fraction * plan.seconds,
        )
    )


def replay_on_worker(config: dict[str, Any], trial_model: TrialModel, rungs: tuple[float, ...] = ()) -> None:
    """A Ray Tune trainable that trains nothing: it reports at once the rungs and the result
    ``trial_model`` draws for the trial (seeded by its number). Run through the real
    ``runner.TuneExecutor``, it measures what Ray Tune itself costs per trial, which the
    simulator does not see (``bench.driver --calibrate``)."""
    from ray import tune

    plan = trial_model(config, random.Random(config["optuna_trial"]))
    if removes_heads(config["hparams"]["method"]):
        for rung, fraction in enumerate(rungs[: len(plan.rung_perplexities)]):
            tune.report(rung_report(plan, rung, fraction))
    tune.report(plan.final)
