"""Pareto-aware early stopping on synthetic learning curves: who goes on at a rung, who stops."""

from __future__ import annotations

import math
from types import SimpleNamespace

import optuna
import pytest
import torch
from helpers import tiny_trial_setup
from ray.tune.schedulers import TrialScheduler

from orchestrator.config import EarlyStopping, load_study_config
from orchestrator.early_stopping import (
    RUNG_KEY,
    ParetoHalving,
    ParetoHalvingScheduler,
    exclusive_contributions,
    nondominated_ranks,
    pareto_order,
)
from orchestrator.runner import make_scheduler, rung_context


def curve(final: float, start: float, fraction: float) -> float:
    """A synthetic learning curve: perplexity falls from ``start`` toward ``final``."""
    return final + (start - final) * math.exp(-5 * fraction)


def test_rungs_are_the_fractions_below_one():
    assert EarlyStopping(enabled=False).rungs() == []
    assert EarlyStopping(enabled=True).rungs() == pytest.approx([1 / 9, 1 / 3])
    assert EarlyStopping(enabled=True, reduction_factor=2, min_fraction=0.25).rungs() == [0.25, 0.5]
    # 0.111 x 9 = 0.999: not a rung on the last step, where a finished trial would be "stopped"
    assert EarlyStopping(enabled=True, min_fraction=0.111).rungs() == pytest.approx([0.111, 0.333])


def test_nondominated_ranks_peel_fronts():
    points = [(5.0, 100), (4.0, 200), (4.5, 200), (6.0, 300), (3.0, 300)]
    assert nondominated_ranks(points) == [0, 0, 1, 2, 0]


def test_contributions_prefer_points_far_below_their_neighbours():
    front = [(6.0, 100), (5.9, 200), (4.0, 300), (3.9, 400)]
    contribution = exclusive_contributions(front)
    assert contribution[0] == contribution[3] == math.inf  # the ends
    assert contribution[2] > contribution[1]  # 4.0 drops 1.9 below its neighbour, 5.9 only 0.1
    assert pareto_order(front)[:2] == [0, 3]  # ends first, the cheap one before the other


def test_front_point_goes_on_and_dominated_point_stops():
    halving = ParetoHalving(n_rungs=2, reduction_factor=3)
    at = 1 / 9
    sizes = {"small": 100, "mid": 200, "large": 300}
    assert halving.decide(0, "a", (curve(6.0, 9.0, at), sizes["small"]))
    assert halving.decide(0, "b", (curve(5.0, 8.0, at), sizes["mid"]))
    assert halving.decide(0, "c", (curve(4.0, 7.0, at), sizes["large"]))
    # As large as "c" and worse than "b": dominated, outside the top ceil(4 / 3) = 2.
    assert not halving.decide(0, "bad lr", (curve(5.5, 9.5, at), sizes["large"]))
    # Between "b" and "c" in size, better than "b": on the rung's front, goes on.
    assert halving.decide(0, "good", (curve(4.4, 7.4, at), 250))


def test_cheap_end_is_never_starved():
    """The smallest model has by far the worst perplexity; ranking perplexity alone (Tune's
    ASHA) would stop it at every rung."""
    halving = ParetoHalving(n_rungs=1, reduction_factor=3)
    for i, ppl in enumerate([4.0, 4.1, 4.2, 4.3, 4.4, 4.5]):
        halving.decide(0, f"large{i}", (ppl, 800 - 10 * i))
    assert halving.decide(0, "tiny", (9.0, 100))
    assert sorted(halving.pools[0].values())[-1] == (9.0, 100)


def test_top_fraction_of_dominated_points_goes_on():
    """One size only: a single-objective ASHA; the best ceil(n / eta) go on."""
    halving = ParetoHalving(n_rungs=1, reduction_factor=2)
    assert halving.decide(0, "a", (5.0, 100))
    assert not halving.decide(0, "b", (5.2, 100))  # n 2, top 1: dominated by a
    assert halving.decide(0, "c", (5.1, 100))  # n 3, top 2: dominated, yet second of three
    assert not halving.decide(0, "d", (5.3, 100))  # n 4, top 2


def test_rungs_are_separate_pools():
    halving = ParetoHalving(n_rungs=2, reduction_factor=3)
    halving.decide(0, "a", (5.0, 100))
    assert not halving.decide(0, "b", (5.5, 100))
    assert halving.decide(1, "a", (4.0, 100))
    assert halving.pools[1] == {"a": (4.0, 100.0)}


def _trial(number: int, method: str = "random") -> SimpleNamespace:
    return SimpleNamespace(
        trial_id=f"t{number}", config={"optuna_trial": number, "hparams": {"method": method}}
    )


def _rung(rung: int, ppl: float, params: int) -> dict:
    return {RUNG_KEY: rung, "val_perplexity": ppl, "n_params": params}


def test_scheduler_decides_on_arrival_with_two_workers():
    """Asynchronous: each report is decided when it comes, against what reached that rung so
    far; no trial waits for the rung to fill. Two workers interleave their trials' reports."""
    scheduler = ParetoHalvingScheduler(ParetoHalving(n_rungs=2, reduction_factor=3))
    go, stop = TrialScheduler.CONTINUE, TrialScheduler.STOP
    worker1, worker2 = _trial(1), _trial(2)
    assert scheduler.on_trial_result(None, worker1, _rung(0, 6.0, 200)) == go  # alone at rung 0
    assert scheduler.on_trial_result(None, worker1, _rung(1, 5.0, 200)) == go  # alone at rung 1
    # Worker 2's trial reaches rung 0 while worker 1's is past it: dominated (bigger, worse).
    assert scheduler.on_trial_result(None, worker2, _rung(0, 6.5, 300)) == stop
    worker2 = _trial(3)  # worker 2 takes the next trial: smaller, so on the front
    assert scheduler.on_trial_result(None, worker2, _rung(0, 7.0, 100)) == go
    assert scheduler.on_trial_result(None, worker1, {"val_perplexity": 4.5, "n_params": 200}) == go  # final
    assert scheduler.on_trial_result(None, worker2, _rung(1, 5.5, 100)) == go


def test_scheduler_never_stops_the_dense_control():
    scheduler = ParetoHalvingScheduler(ParetoHalving(n_rungs=1, reduction_factor=3))
    scheduler.on_trial_result(None, _trial(1), _rung(0, 4.0, 100))
    control = _trial(0, method="dense")
    assert scheduler.on_trial_result(None, control, _rung(0, 9.0, 900)) == TrialScheduler.CONTINUE
    assert 0 not in scheduler.halving.pools[0]


def test_failed_trial_is_forgotten():
    scheduler = ParetoHalvingScheduler(ParetoHalving(n_rungs=1, reduction_factor=3))
    scheduler.on_trial_result(None, _trial(1), _rung(0, 4.0, 100))
    scheduler.on_trial_error(None, _trial(1))
    assert scheduler.halving.pools[0] == {}


@pytest.mark.parametrize(
    "final",
    [{"trial_error": "OSError: disk full"}, {"val_perplexity": math.nan, "n_params": 100}],
    ids=["reported error", "diverged after the rung"],
)
def test_a_trial_that_ends_failed_leaves_the_pools(final):
    """Found in review: a trial that reports its error as a result (so Tune does not retry it), or
    ends on a non-finite score, completes for Tune (no on_trial_error); the driver tells it FAIL,
    and its good rung point used to go on stopping others."""
    scheduler = ParetoHalvingScheduler(ParetoHalving(n_rungs=1, reduction_factor=3))
    scheduler.on_trial_result(None, _trial(1), _rung(0, 4.0, 100))
    scheduler.on_trial_result(None, _trial(2), _rung(0, 5.0, 100))
    scheduler.on_trial_complete(None, _trial(1), final)
    scheduler.on_trial_complete(None, _trial(2), _rung(0, 5.0, 100))  # stopped there: it stays
    assert scheduler.halving.pools[0] == {2: (5.0, 100.0)}


def test_a_trial_stopped_on_diverging_keeps_its_earlier_rung_points():
    """PRUNED at a later rung, as a resumed run pools it: its finite points stay, the NaN never
    joins."""
    scheduler = ParetoHalvingScheduler(ParetoHalving(n_rungs=2, reduction_factor=3))
    assert scheduler.on_trial_result(None, _trial(1), _rung(0, 5.0, 100)) == TrialScheduler.CONTINUE
    assert scheduler.on_trial_result(None, _trial(1), _rung(1, math.nan, 100)) == TrialScheduler.STOP
    scheduler.on_trial_complete(None, _trial(1), _rung(1, math.nan, 100))
    assert scheduler.halving.pools == [{1: (5.0, 100.0)}, {}]


def test_a_diverged_trial_is_stopped_at_its_rung_and_not_pooled():
    """Found in review: nothing dominates NaN, so a diverged trial ranked on the front and ran
    its whole budget; an earlier run's NaN point is not pooled either."""
    halving = ParetoHalving(n_rungs=1, reduction_factor=3)
    for i in range(6):
        assert halving.decide(0, i, (5.0 - i / 100, 100 + i))  # a front
    assert not halving.decide(0, "diverged", (math.nan, 50))
    halving.record(0, "diverged earlier", (math.inf, 60))
    assert set(halving.pools[0]) == set(range(6))


def test_a_restarted_worker_is_not_judged_again_at_a_rung_it_passed():
    """Found in review: Tune restarts a dead worker from the start of fine-tuning, and its
    rung reports came again; judged against a fuller pool, a trial past rung 1 was stopped at
    rung 0. Tune's own ASHA decides a trial once per rung."""
    halving = ParetoHalving(n_rungs=2, reduction_factor=3)
    assert halving.decide(0, "x", (5.5, 100))
    for i in range(3):  # better points of its size arrive
        halving.decide(0, i, (5.0, 100))
    assert halving.decide(1, "x", (5.2, 100))
    assert halving.decide(0, "x", (5.5, 100))  # the restarted worker, at rung 0 again
    assert not halving.decide(0, "y", (5.5, 100))  # a new trial there is judged, and stopped


def test_a_rung_context_differs_with_the_setup_the_rungs_or_their_tokens():
    contexts = {
        rung_context("setup", (0.111, 0.333), 512),
        rung_context("other setup", (0.111, 0.333), 512),
        rung_context("setup", (0.25, 0.5), 512),
        rung_context("setup", (0.111, 0.333), 1024),
    }
    assert len(contexts) == 4


def test_resumed_scheduler_starts_with_the_finished_trials_points(tmp_path):
    """The database is the source of truth: a restarted driver's pools hold the rung points of
    the COMPLETE and PRUNED trials measured under the same ``rung_context`` (not the dense
    control's, not a failed or diverged one's, not those of a run whose rungs were at other
    moments of training or scored other tokens, nor those of a version that recorded none)."""
    study_file = tmp_path / "s.toml"
    study_file.write_text(
        '[study]\nname = "s"\n[corpus]\npath = "x.txt"\n[early_stopping]\nenabled = true\n', encoding="utf-8"
    )
    cfg = load_study_config(study_file)
    study = optuna.create_study(directions=["minimize", "minimize"])
    distributions: dict = {}

    def add(state, attrs, values=None):
        study.add_trial(
            optuna.trial.create_trial(
                state=state, values=values, params={}, distributions=distributions, user_attrs=attrs
            )
        )

    curve_a = [[0, 11, 6.0], [1, 33, 5.0]]
    same = {"rung_context": "this run's"}
    add(
        optuna.trial.TrialState.COMPLETE,
        {"dense_control": True, "curve": [[0, 11, 4.0]], "n_params": 900, **same},
        [4, 900],
    )
    add(optuna.trial.TrialState.COMPLETE, {"curve": curve_a, "n_params": 200, **same}, [4.5, 200])
    add(optuna.trial.TrialState.PRUNED, {"curve": [[0, 11, 7.0]], "n_params": 300, **same})
    add(optuna.trial.TrialState.FAIL, {"curve": [[0, 11, 3.0]], "n_params": 100, **same})
    add(optuna.trial.TrialState.PRUNED, {"curve": [[0, 11, 2.0]], "n_params": 150, "rung_context": "other"})
    add(optuna.trial.TrialState.COMPLETE, {"curve": [[0, 11, 2.5]], "n_params": 160}, [3.0, 160])  # older
    add(optuna.trial.TrialState.PRUNED, {"curve": [[0, 11, math.nan]], "n_params": 170, **same})  # diverged
    scheduler = make_scheduler(cfg, study, n_rungs=2, context="this run's")
    assert scheduler.halving.pools == [{1: (6.0, 200.0), 2: (7.0, 300.0)}, {1: (5.0, 200.0)}]


@pytest.fixture(scope="module")
def stopped_study(tmp_path_factory):
    """The smoke study with early stopping on, every trial the same size (so a trial with a worse
    learning rate is dominated at a rung), two trials at once: 6 finished trials asked for."""
    from helpers import SMOKE, launch, leftover_ray_processes, ray_processes

    work = tmp_path_factory.mktemp("early")
    before = ray_processes()
    overrides = [
        "early_stopping.enabled=true",
        "search.sparsity=0.5",
        "study.cpus_per_trial=1",
        "study.max_concurrent=2",
        "early_stopping.eval_tokens=1024",  # rungs score half of the trial's 2048 tokens
    ]
    run = launch("run", str(SMOKE), "--n-trials", "6", *(f"--set={o}" for o in overrides), cwd=work)
    leftover = leftover_ray_processes(before)
    status = launch(
        "status", "--storage", f"sqlite:///{work}/runs/smoke.db", "--study-name", "smoke", cwd=work
    )
    from orchestrator.storage import open_store

    store = open_store(f"sqlite:///{work}/runs/smoke.db")
    study = optuna.load_study(study_name="smoke", storage=store.storage)
    return {"run": run, "status": status, "store": store, "study": study, "leftover": leftover}


@pytest.mark.slow
def test_study_with_early_stopping_ends_with_the_asked_finished_trials(stopped_study):
    assert stopped_study["run"].returncode == 0, stopped_study["run"].stderr[-3000:]
    assert not stopped_study["leftover"]
    trials = stopped_study["study"].get_trials()
    states = [t.state for t in trials]
    pruned = [t for t in trials if t.state == optuna.trial.TrialState.PRUNED]
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(pruned) + len(complete) == 6
    assert pruned, "no trial was stopped early"
    assert optuna.trial.TrialState.RUNNING not in states
    assert complete[0].user_attrs.get("dense_control") is True  # never stopped
    assert complete[0].user_attrs["curve"] == []  # and so never scored at a rung
    for t in pruned:
        attrs = t.user_attrs
        assert 0 < attrs["stopped_at_step"] < attrs["finetune_steps"]
        assert attrs["saved_steps"] == attrs["finetune_steps"] - attrs["stopped_at_step"]
        assert attrs["curve"][-1][1:] == [attrs["stopped_at_step"], attrs["rung_val_perplexity"]]
    for t in complete[1:]:
        assert [point[0] for point in t.user_attrs["curve"]] == [0, 1]  # both rungs reached
    for t in [*pruned, *complete[1:]]:
        assert t.user_attrs["rung_tokens"] == 1024  # the study's [early_stopping] eval_tokens
    # what a resumed run pools them by: one context for the run, of this version's rung rule
    contexts = {t.user_attrs["rung_context"] for t in [*pruned, *complete[1:]]}
    assert len(contexts) == 1 and contexts.pop().startswith("v2:")


@pytest.mark.slow
def test_frontier_table_and_status_with_stopped_trials(stopped_study):
    from helpers import expected_front, frontier_triples

    from orchestrator.storage import read_frontier

    rows = read_frontier(stopped_study["store"], "smoke")
    complete = {
        t.number for t in stopped_study["study"].get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    }
    assert rows and {r["trial_number"] for r in rows} <= complete
    assert frontier_triples(rows) == expected_front(stopped_study["study"])
    out = stopped_study["status"].stdout
    n_pruned = len(stopped_study["study"].get_trials(states=(optuna.trial.TrialState.PRUNED,)))
    assert f"stopped early: {n_pruned} trials (PRUNED)" in out
    assert "dense checkpoint: perplexity" in out


def test_a_rung_scores_every_kth_window_spread_over_the_whole_slice():
    from trainers.data import rung_windows

    x = torch.arange(40 * 4).view(40, 4)  # 40 windows of 4 tokens
    sub_x, sub_y = rung_windows((x, x + 1), max_tokens=40)  # 10 windows' worth: every 4th
    assert sub_x[:, 0].tolist() == [4 * i for i in range(0, 40, 4)]
    assert torch.equal(sub_y, sub_x + 1)
    spread = rung_windows((x, x), max_tokens=100)[0][:, 0] // 4  # 25 of the 40 windows
    assert len(spread) == 25 and spread[0] == 0 and spread[-1] >= 38  # first to last
    assert len(set(spread.tolist())) == 25 and set(spread.diff().tolist()) <= {1, 2}  # evenly
    assert rung_windows((x, x), max_tokens=30)[0].numel() == 28  # whole windows, never more
    assert rung_windows((x, x), max_tokens=1_000)[0].shape == x.shape  # a larger budget: all of it
    assert rung_windows((x, x), max_tokens=1)[0].shape == (1, 4)  # at least one window
    assert rung_windows((x, x), max_tokens=0)[0].shape == x.shape  # 0: the whole slice


def test_a_rung_scores_its_subset_and_the_trial_ends_on_the_whole_slice(tmp_path, small_text):
    """A rung at the last step scores the model the trial ends with: on the whole slice it gives
    the final perplexity, on a subset (``rung_eval_tokens``) that subset's."""
    from trainers.data import eval_windows, rung_windows
    from trainers.export import load_model
    from trainers.hparams import TrialHParams
    from trainers.training import mean_loss
    from trainers.trial import RungPlan, TrialIO, run_trial

    setup = tiny_trial_setup(tmp_path, small_text, prune_steps=2, finetune_steps=4)
    corpus = setup.corpus
    hp = TrialHParams(method="importance", sparsity=0.5)
    reports = []
    whole = run_trial(setup, hp, rungs=RungPlan(fractions=(1.0,), report=reports.append))
    assert [r.val_perplexity for r in reports] == [whole.val_perplexity]
    part = run_trial(
        setup, hp, TrialIO(save_dir=tmp_path / "part"), RungPlan(fractions=(1.0,), eval_tokens=128)
    )
    assert part.val_perplexity == pytest.approx(whole.val_perplexity, rel=1e-6)  # the same trial
    trained, _ = load_model(tmp_path / "part")
    subset = rung_windows(eval_windows(corpus.val, 16, 512), 128)
    assert subset[0].numel() == 128
    assert part.curve[0][2] == pytest.approx(math.exp(mean_loss(trained, subset)), rel=1e-5)
    assert part.curve[0][2] != pytest.approx(part.val_perplexity, rel=1e-4)


def test_every_method_reaches_a_rung_after_as_many_weight_updates(tmp_path, small_text):
    """Found in review: rungs were fractions of each trial's own fine-tuning, so a gated method
    (its weights trained while choosing) was compared after prune_steps + 1/9 of fine-tuning with
    importance (nothing trained while choosing) after 1/9 of its longer fine-tuning alone."""
    from trainers.hparams import TrialHParams
    from trainers.trial import RungPlan, run_trial

    setup = tiny_trial_setup(tmp_path, small_text, prune_steps=4, finetune_steps=8)
    updates = {}
    for method in ("importance", "l0_target"):
        reports = []
        run_trial(
            setup,
            TrialHParams(method=method, sparsity=0.5),
            rungs=RungPlan(fractions=(0.25, 0.5), report=reports.append),
        )
        trained_while_choosing = 12 - reports[0].steps
        updates[method] = [trained_while_choosing + r.step for r in reports]
    assert updates == {"importance": [6, 8], "l0_target": [6, 8]}
    # A rung that would fall on the last step (or past it) judges nothing: there is none.
    reports = []
    run_trial(
        setup,
        TrialHParams(method="importance", sparsity=0.5),
        rungs=RungPlan(fractions=(0.5, 0.99), report=reports.append),
    )
    assert [r.step for r in reports] == [8]


def test_a_margin_keeps_a_trial_within_the_rungs_noise_of_a_smaller_one():
    """At one size a trial 1.2% worse than the best is dominated, and third of six stops; with a
    2% margin it is not counted as beaten (the rung's subset ranks two models differently by
    about that much), while one 5% worse still stops. Margin 0 is the plain rule."""
    pool = {"a": (5.00, 100), "a2": (5.02, 100), "b": (5.6, 100), "c": (5.7, 100), "d": (5.8, 100)}
    plain = ParetoHalving(n_rungs=1, reduction_factor=3)
    tolerant = ParetoHalving(n_rungs=1, reduction_factor=3, margin=0.02)
    for halving in (plain, tolerant):
        for key, point in pool.items():
            halving.decide(0, key, point)
    assert not plain.decide(0, "close", (5.06, 100))  # behind a and a2, top ceil(6 / 3) = 2
    assert tolerant.decide(0, "close", (5.06, 100))
    assert not tolerant.decide(0, "far", (5.25, 100))  # 5% behind a; fourth of 7, top 3
    # A larger trial within the margin of a smaller one goes on too; beyond it, it stops.
    assert tolerant.decide(0, "larger", (5.08, 120))
    assert not tolerant.decide(0, "larger, worse", (5.5, 130))


def test_early_stopping_margin_is_read_from_the_study_file(tmp_path):
    study_file = tmp_path / "s.toml"
    study_file.write_text(
        '[study]\nname = "s"\n[corpus]\npath = "x.txt"\n[early_stopping]\nenabled = true\nmargin = 0.02\n',
        encoding="utf-8",
    )
    cfg = load_study_config(study_file)
    assert (
        make_scheduler(cfg, optuna.create_study(directions=["minimize"] * 2), 2, 512).halving.margin == 0.02
    )
