"""Warm starts (``[study] warm_start``): a trial prunes an earlier trial's smaller model; the
parent it is given (``orchestrator/warm_start.py``) and what ``run_trial`` does with it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import optuna
import pytest
from helpers import HEADS, n_params, per_layer, tiny_trial_setup, worker_result

from orchestrator.execution import Measurement
from orchestrator.front_gaps import front_of
from orchestrator.warm_start import parent_for
from trainers.export import CONFIG, WEIGHTS, load_model
from trainers.hparams import TrialHParams
from trainers.trial import TrialIO, run_trial

optuna.logging.set_verbosity(optuna.logging.WARNING)


def saved(folder: Path, dense_weights: str = "d") -> str:
    """A folder as a trial saves its model, as far as ``check_parent`` reads it: weights that
    match their checksum, the heads it kept, the dense weights it was pruned from."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / WEIGHTS).write_bytes(b"weights")
    meta = {"model": {}, "sha256": {WEIGHTS: hashlib.sha256(b"weights").hexdigest()}}
    (folder / CONFIG).write_text(json.dumps({**meta, "kept_heads": [[0]], "dense_weights": dense_weights}))
    return str(folder)


def finished(kept: int, ppl: float, folder: str | None, **attrs) -> optuna.trial.FrozenTrial:
    """A COMPLETE trial as the driver records it, its model saved in ``folder``."""
    recorded = {"heads_per_layer": per_layer(kept), "sparsity": 1 - kept / HEADS, **attrs}
    if folder is not None:
        recorded["model_dir"] = folder
    return optuna.trial.create_trial(values=[ppl, n_params(kept)], user_attrs=recorded)


def test_the_parent_is_the_smallest_front_model_larger_than_the_target(tmp_path):
    control = finished(32, 4.60, saved(tmp_path / "0"), dense_control=True)
    large = finished(24, 4.69, saved(tmp_path / "1"))
    middle = finished(16, 4.80, saved(tmp_path / "2"))
    dominated = finished(12, 5.50, saved(tmp_path / "3"))  # 11 heads below do better
    small = finished(11, 5.00, saved(tmp_path / "4"))
    trials = [control, large, middle, dominated, small]
    for number, trial in enumerate(trials):
        trial.number = number

    def parent(sparsity: float, method: str = "importance", among=trials, **context):
        found = parent_for(
            front_of(among), {"method": method, "sparsity": sparsity}, dense_weights="d", **context
        )
        return None if found is None else found.number

    assert parent(1 - 8 / 32) == 4  # 8 heads: from the 11-head point, not the dominated 12
    assert parent(1 - 12 / 32) == 2  # 12 heads: 16 is the smallest larger one on the front
    assert parent(1 - 16 / 32) == 1  # a point of the target's own size is not larger
    assert parent(1 - 28 / 32) is None  # only the dense control is larger: the dense checkpoint
    assert parent(1 - 8 / 32, method="l0_penalty") is None  # no sparsity target to prune down to
    assert parent(1 - 8 / 32, method="topk") == 4  # a gate method with a target is warm-started too

    # A point that cannot be a parent is passed over for the next larger one.
    saved(tmp_path / "4", dense_weights="other")  # pruned from another dense checkpoint
    assert parent(1 - 8 / 32) == 2
    (tmp_path / "4" / CONFIG).write_text(json.dumps({"model": {}, "sha256": {}}))  # an older version's
    assert parent(1 - 8 / 32) == 2
    saved(tmp_path / "4")
    (tmp_path / "4" / WEIGHTS).write_bytes(b"weigh")  # cut short
    assert parent(1 - 8 / 32) == 2
    (tmp_path / "4" / CONFIG).unlink()  # not on this machine's disk
    assert parent(1 - 8 / 32) == 2
    saved(tmp_path / "4")
    assert parent(1 - 8 / 32) == 4
    unsaved = finished(10, 4.90, None)  # a trial that recorded no folder
    unsaved.number = 5
    assert parent(1 - 8 / 32, among=[*trials, unsaved]) == 2
    # measured under another setup (other budgets, another dense model): passed over
    for trial, setup in zip(trials, ["a", "a", "a", "a", "b"], strict=True):
        trial.user_attrs["setup"] = setup
    assert parent(1 - 8 / 32, setup="a") == 2
    assert parent(1 - 8 / 32, setup="b") == 4


def test_a_parent_on_an_object_store_is_chosen_from_what_the_database_records():
    """A trial that recorded its model's digest is judged by its attributes alone (the driver
    reads no folder on a store): pruned from other dense weights, or without its kept heads, it
    is passed over; one of an earlier version on a store, with nothing recorded, is too."""

    def stored(number: int, kept: int, ppl: float, **attrs) -> optuna.trial.FrozenTrial:
        recorded = {"model_sha256": f"{number:064x}", "dense_weights": "d", "kept_heads": [[0]], **attrs}
        trial = finished(kept, ppl, f"s3://bucket/study/trials/s/{number}", **recorded)
        trial.number = number
        return trial

    def parent(*trials) -> int | None:
        found = parent_for(
            front_of(trials), {"method": "importance", "sparsity": 1 - 8 / 32}, dense_weights="d"
        )
        return None if found is None else found.number

    larger, smaller = stored(1, 16, 4.8), stored(2, 11, 5.0)
    assert parent(larger, smaller) == 2
    assert parent(larger, stored(2, 11, 5.0, dense_weights="other")) == 1
    assert parent(larger, stored(2, 11, 5.0, kept_heads=None)) == 1
    assert parent(larger, stored(2, 11, 5.0, model_sha256=None)) == 1  # an earlier version's, on a store


def test_the_driver_hands_a_trial_its_parent_and_records_it(tmp_path):
    """The default study's start-up, warm starts on: 0.875 and 0.4625 (4 and 17 heads) have no
    larger front point but the dense control; 0.66875 (11 heads) starts from the 17-head trial."""
    from helpers import default_study_driver

    driver = default_study_driver(tmp_path, startup=4, spread_trials=3, warm_start=True)
    driver.measure_under(Measurement(dense_weights="d"))  # as the runner does
    configs = {}

    def run(name: str, ppl: float, driver=driver) -> dict:
        configs[name] = config = driver.next_config(name)
        hparams = config["hparams"] if name != "dense" else {**config["hparams"], "sparsity": 0.0}
        saved(Path(config["model_dir"]))  # the worker saves the model there
        driver.finish(name, worker_result(hparams, ppl), None)
        return config

    run("dense", 4.60)
    assert run("s0", 6.27)["parent_dir"] == ""
    assert run("s1", 4.80)["parent_dir"] == ""
    third = run("s2", 5.00)
    trials = {t.number: t for t in driver.study.get_trials()}
    s1 = configs["s1"]["optuna_trial"]
    assert third["parent_dir"] == configs["s1"]["model_dir"]
    assert trials[third["optuna_trial"]].user_attrs["warm_start_from"] == s1
    assert "warm_start_from" not in trials[configs["s0"]["optuna_trial"]].user_attrs

    cold = default_study_driver(tmp_path / "off", startup=4, spread_trials=3)  # the default: off
    cold.dense_weights = "d"
    for name, ppl in zip(("dense", "s0", "s1", "s2"), (4.60, 6.27, 4.80, 5.00), strict=True):
        assert run(name, ppl, driver=cold)["parent_dir"] == ""


def test_a_warm_started_trial_prunes_its_parents_heads_from_its_weights(tmp_path, small_text):
    """A 2-layer, 4-head model: the parent keeps 6 of 8 heads, the child 4 of those 6. With the
    child's rate at 0 (importance trains nothing while choosing), its weights outside attention
    are the parent's exactly, not the dense checkpoint's."""
    setup = tiny_trial_setup(tmp_path, small_text, prune_steps=2, finetune_steps=4, n_head=4)
    parent_hp = TrialHParams(method="importance", sparsity=0.25, lr=1e-2)
    parent = run_trial(setup, parent_hp, TrialIO(save_dir=tmp_path / "parent"))
    child_hp = TrialHParams(method="importance", sparsity=0.5, lr=0.0)
    child = run_trial(setup, child_hp, TrialIO(save_dir=tmp_path / "child", parent=tmp_path / "parent"))

    assert sum(parent.heads_per_layer) == 6 and sum(child.heads_per_layer) == 4
    assert child.sparsity == 0.5
    meta = json.loads((tmp_path / "child" / CONFIG).read_text())
    parent_meta = json.loads((tmp_path / "parent" / CONFIG).read_text())
    assert meta["kept_heads"] == child.kept_heads
    assert meta["parent_weights"] == parent_meta["sha256"]["model.safetensors"]

    def weights(folder: Path) -> dict:
        model, _ = load_model(folder)
        return model.state_dict()

    child_w, parent_w = weights(tmp_path / "child"), weights(tmp_path / "parent")
    assert child_w["tok_emb.weight"].equal(parent_w["tok_emb.weight"])
    assert not child_w["tok_emb.weight"].equal(weights(setup.dense.path)["tok_emb.weight"])

    # Each of the child's heads is the parent's head of the same dense index, unchanged: its
    # recorded indices are the dense model's, mapped through the parent's.
    def head(out_projection, index: int):  # a head's columns of W_O (d_model 16, 4 heads)
        return out_projection[:, index * 4 : (index + 1) * 4]

    for layer, (mine, theirs) in enumerate(zip(child.kept_heads, parent.kept_heads, strict=True)):
        assert set(mine) <= set(theirs)
        out_child = child_w[f"blocks.{layer}.attn.proj.weight"]
        out_parent = parent_w[f"blocks.{layer}.attn.proj.weight"]
        for position, dense_index in enumerate(mine):
            assert head(out_child, position).equal(head(out_parent, theirs.index(dense_index)))


def test_a_parent_that_cannot_be_pruned_down_to_the_target_is_refused(tmp_path, small_text):
    setup = tiny_trial_setup(tmp_path, small_text, prune_steps=2, finetune_steps=2, n_head=4)
    run_trial(setup, TrialHParams(method="importance", sparsity=0.5), TrialIO(save_dir=tmp_path / "half"))
    with pytest.raises(ValueError, match="parent keeps 4 heads, the target 4: nothing to remove"):
        run_trial(setup, TrialHParams(method="importance", sparsity=0.5), TrialIO(parent=tmp_path / "half"))
    with pytest.raises(ValueError, match="takes no sparsity target"):
        run_trial(setup, TrialHParams(method="l0_penalty"), TrialIO(parent=tmp_path / "half"))
    foreign = tmp_path / "foreign"  # the same model, as if pruned from another dense checkpoint
    foreign.mkdir()
    for file in (tmp_path / "half").iterdir():
        if file.is_file():
            (foreign / file.name).write_bytes(file.read_bytes())
    meta = json.loads((foreign / CONFIG).read_text())
    (foreign / CONFIG).write_text(json.dumps({**meta, "dense_weights": "0" * 64}))
    with pytest.raises(ValueError, match="not a model pruned from this study's dense checkpoint"):
        run_trial(setup, TrialHParams(method="importance", sparsity=0.75), TrialIO(parent=foreign))
    run_trial(setup, TrialHParams(method="importance", sparsity=0.75), TrialIO(parent=tmp_path / "half"))


@pytest.mark.slow
def test_the_smoke_study_with_warm_starts_prunes_a_trial_from_its_parent(tmp_path):
    """Through launch-study and Ray: the smoke study's start-up keeps 2, 4 and 3 of its 8 heads;
    the third starts from the second (4 heads, the smallest larger point) and keeps 3 of its."""
    from helpers import SMOKE, heads, launch, leftover_ray_processes, ray_processes

    before = ray_processes()
    run = launch("run", str(SMOKE), "--n-trials", "4", "--set", "study.warm_start=true", cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert not leftover_ray_processes(before)
    study = optuna.load_study(study_name="smoke", storage=f"sqlite:///{tmp_path}/runs/smoke.db")
    trials = study.get_trials()
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 4
    assert [sum(heads(t)) for t in trials[1:]] == [2, 4, 3]
    assert [t.user_attrs.get("warm_start_from") for t in trials] == [None, None, None, 2]
    assert "trial 3: started  l0_target sparsity 0.62 from trial 2" in run.stderr
    child, parent = trials[3].user_attrs["kept_heads"], trials[2].user_attrs["kept_heads"]
    assert all(set(c) <= set(p) for c, p in zip(child, parent, strict=True))


def test_a_retry_resumes_after_pruning_only_from_the_same_parent(tmp_path, small_text):
    """A retry continues from the checkpoint its first try left after pruning only when it is
    given the same parent: pruned from another, the checkpoint holds other heads."""
    setup = tiny_trial_setup(tmp_path, small_text, prune_steps=2, finetune_steps=2, n_head=4)
    for name, sparsity in (("a", 0.125), ("b", 0.25)):
        run_trial(
            setup, TrialHParams(method="importance", sparsity=sparsity), TrialIO(save_dir=tmp_path / name)
        )
    hp = TrialHParams(method="importance", sparsity=0.5)
    first = run_trial(setup, hp, TrialIO(save_dir=tmp_path / "try1", parent=tmp_path / "a"))
    again = run_trial(setup, hp, TrialIO(resume_dirs=[tmp_path / "try1"], parent=tmp_path / "a"))
    assert "prune_resumed" in again.phase_seconds and again.kept_heads == first.kept_heads
    other = run_trial(setup, hp, TrialIO(resume_dirs=[tmp_path / "try1"], parent=tmp_path / "b"))
    assert "prune_resumed" not in other.phase_seconds
    cold = run_trial(setup, hp, TrialIO(resume_dirs=[tmp_path / "try1"]))
    assert "prune_resumed" not in cold.phase_seconds


def test_an_earlier_versions_checkpoint_naming_folders_still_resumes(tmp_path, small_text):
    """Checkpoints written before identities named models by digest alone also held the dense
    model's and the parent's folders: a retry still resumes from them."""
    setup = tiny_trial_setup(tmp_path, small_text, prune_steps=2, finetune_steps=2, n_head=4)
    run_trial(setup, TrialHParams(method="importance", sparsity=0.25), TrialIO(save_dir=tmp_path / "a"))
    hp = TrialHParams(method="importance", sparsity=0.5)
    first = run_trial(setup, hp, TrialIO(save_dir=tmp_path / "try1", parent=tmp_path / "a"))
    config = tmp_path / "try1" / "after_prune" / CONFIG
    meta = json.loads(config.read_text())  # config.json vouches for the other files, not itself
    meta["identity"] |= {"dense": "/old/artifacts/dense/key", "parent": "/old/artifacts/trials/s/1"}
    config.write_text(json.dumps(meta))
    again = run_trial(setup, hp, TrialIO(resume_dirs=[tmp_path / "try1"], parent=tmp_path / "a"))
    assert "prune_resumed" in again.phase_seconds and again.kept_heads == first.kept_heads
