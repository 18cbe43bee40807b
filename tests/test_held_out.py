"""The test split nothing selects on, lineages, matched dense references and the iterative arm
(issue 46): a study's choices do not see the test split, a lineage adds up, a reference replays
the recipe it claims, and each step of the iterative arm starts from the previous step's model."""

from __future__ import annotations

import hashlib
import json
import math
import random
from pathlib import Path

import optuna
import pandas as pd
import pytest
import torch
from helpers import CORPUS, SMOKE, cli_in_process, launch, tiny_trial_setup

from bench.frontier import hypervolume_within, iterative_arm, summarise
from orchestrator.config import load_study_config, measurement_settings
from orchestrator.report import normalised_hypervolume
from trainers.data import Corpus
from trainers.export import WEIGHTS, read_config
from trainers.hparams import TrialHParams
from trainers.pretrain import load_dense
from trainers.reference import MatchedReference
from trainers.training import Schedule, fit, mean_loss
from trainers.trial import TrialIO, evaluation_windows, run_trial

TEXT = CORPUS.read_text(encoding="utf-8")


def test_a_test_fraction_splits_the_end_of_the_text_off_after_validation() -> None:
    corpus = Corpus.load(CORPUS, val_fraction=0.1, test_fraction=0.1, block_size=32)
    cut_val, cut_test = int(len(TEXT) * 0.8), int(len(TEXT) * 0.9)
    assert corpus.decode(corpus.train.tolist()) == TEXT[:cut_val]
    assert corpus.decode(corpus.val.tolist()) == TEXT[cut_val:cut_test]
    assert corpus.decode(corpus.test.tolist()) == TEXT[cut_test:]


def test_without_a_test_split_the_corpus_and_its_digest_are_as_before() -> None:
    """Earlier studies' dense checkpoints are named by this digest: it must not move."""
    corpus = Corpus.load(CORPUS, val_fraction=0.1, block_size=32)
    cut = int(len(TEXT) * 0.9)
    expected = hashlib.sha256((TEXT[:cut] + "\x1e" + TEXT[cut:]).encode("utf-8")).hexdigest()
    assert corpus.test is None and corpus.digest == expected
    with_test = Corpus.load(CORPUS, val_fraction=0.1, test_fraction=0.1, block_size=32)
    assert with_test.digest != expected


def test_a_study_file_without_a_test_split_measures_as_before() -> None:
    """The digest every COMPLETE trial carries leaves the new keys out while they are unset."""
    settings = measurement_settings(load_study_config(SMOKE))
    assert "test_fraction" not in settings["corpus"] and "test_path" not in settings["corpus"]
    split = measurement_settings(load_study_config(SMOKE, ["corpus.test_fraction=0.1"]))
    assert split["corpus"]["test_fraction"] == 0.1


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("corpus.test_fraction=0.95", "val_fraction + test_fraction is 1.05"),
        ("corpus.test_path='test.txt'", "test_path goes with train_path and val_path"),
    ],
)
def test_a_split_that_cannot_work_is_one_line_and_writes_nothing(tmp_path, override, says) -> None:
    result = cli_in_process("run", str(SMOKE), "--set", override, cwd=tmp_path)
    assert result.returncode == 2
    assert says in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def chain(tmp_path: Path, sparsities: list[float], lrs: list[float]):
    """Trials warm-started each from the previous one's model: (setup, results, folders)."""
    setup = tiny_trial_setup(tmp_path, CORPUS, prune_steps=3, finetune_steps=4, n_head=4)
    results, folders, parent = [], [], None
    for i, (sparsity, lr) in enumerate(zip(sparsities, lrs, strict=True)):
        folder = tmp_path / f"trial{i}"
        hp = TrialHParams(method="importance", sparsity=sparsity, lr=lr, min_heads_per_layer=1)
        results.append(run_trial(setup, hp, TrialIO(save_dir=folder, parent=parent)))
        folders.append(folder)
        parent = folder
    return setup, results, folders


def test_a_lineage_adds_up_along_its_warm_starts(tmp_path) -> None:
    _, results, folders = chain(tmp_path, [0.25, 0.5, 0.75], [1e-3, 2e-3, 3e-3])
    for i, result in enumerate(results):
        # importance trains no weight while it chooses: each trial's 3 + 4 steps are fine-tuning
        assert result.lineage == [{"lr": lr, "steps": [7]} for lr in (1e-3, 2e-3, 3e-3)[: i + 1]]
        assert result.lineage_steps == 7 * (i + 1)
        assert read_config(folders[i], verify=False)["lineage"] == result.lineage


def test_a_gated_trial_counts_its_pruning_phase_as_a_phase_of_its_own(tmp_path) -> None:
    setup = tiny_trial_setup(tmp_path, CORPUS, prune_steps=3, finetune_steps=4, n_head=4)
    hp = TrialHParams(method="l0_target", sparsity=0.5, lr=1e-3, min_heads_per_layer=1)
    result = run_trial(setup, hp)
    assert result.lineage == [{"lr": 1e-3, "steps": [3, 4]}] and result.lineage_steps == 7


def replayed_by_hand(setup, lineage: list[dict]) -> list[tuple[int, float]]:
    """(step, validation perplexity) at every step of ``lineage`` trained on the dense model with
    ``fit`` directly, step 0 included: what the reference must pick its best from."""
    model = load_dense(setup.dense, torch.device("cpu"))
    windows = evaluation_windows(setup)
    scores, step = [(0, math.exp(mean_loss(model, windows)))], 0
    for entry in lineage:
        generator = torch.Generator().manual_seed(setup.seed)
        for steps in entry["steps"]:

            def record(done: int, start=step) -> bool:
                scores.append((start + done, math.exp(mean_loss(model, windows))))
                return False

            schedule = Schedule(steps, setup.budget.batch_size, entry["lr"])
            fit(model, setup.corpus.train, generator, schedule, after_step=record)
            step += steps
    return scores


def test_a_matched_reference_is_the_best_checkpoint_of_the_recipe_it_replays(tmp_path) -> None:
    setup = tiny_trial_setup(tmp_path, CORPUS, prune_steps=3, finetune_steps=4, n_head=4)
    lineage = [{"lr": 3e-2, "steps": [5]}, {"lr": 1e-2, "steps": [2, 4]}]
    score = MatchedReference(setup, eval_every=1).score(lineage)
    by_hand = replayed_by_hand(setup, lineage)
    best_step, best_val = min(by_hand, key=lambda s: (s[1], s[0]))
    assert score.lineage_steps == 11 and score.best_step == best_step
    assert score.val_perplexity == pytest.approx(best_val, rel=1e-5)
    # A coarser checkpoint interval can only find a checkpoint among those it scores.
    coarse = MatchedReference(setup, eval_every=3).score(lineage)
    scored = {0, 3, 5, 7, 9, 10, 11}  # every 3 steps of each phase, and each phase's end
    assert coarse.best_step in scored
    assert coarse.val_perplexity == pytest.approx(min(v for s, v in by_hand if s in scored), rel=1e-5)


def test_a_longer_lineage_continues_from_its_replayed_prefix_as_a_fresh_replay_would(tmp_path) -> None:
    setup = tiny_trial_setup(tmp_path, CORPUS, prune_steps=3, finetune_steps=4, n_head=4)
    prefix = [{"lr": 3e-2, "steps": [4]}]
    longer = [*prefix, {"lr": 2e-2, "steps": [4]}]
    shared = MatchedReference(setup, eval_every=2)
    shared.score(prefix)
    continued = shared.score(longer)
    assert shared.steps_trained == 8  # the prefix was not trained again
    fresh = MatchedReference(setup, eval_every=2).score(longer)
    assert (continued.best_step, continued.val_perplexity) == (fresh.best_step, fresh.val_perplexity)


def test_each_step_of_the_iterative_arm_starts_from_the_previous_steps_model(tmp_path) -> None:
    setup = tiny_trial_setup(tmp_path, CORPUS, prune_steps=3, finetune_steps=4, n_head=4)
    space = load_study_config(SMOKE).search.for_model(setup.dense.model_config.layer_heads)
    dense = {"method": "dense", "sparsity": 0.0, "ppl": 1.0, "params": 1, "seconds": 0.0}
    folder = tmp_path / "chain"
    points = iterative_arm(setup, space, 4, math.inf, dense, folder, max_steps=6)[1:]
    ran = sorted(int(p.name.removeprefix("step")) for p in folder.iterdir())
    assert len(ran) == len(points) >= 5
    first_chain = [p["sparsity"] for step, p in zip(ran, points, strict=True) if step < 4]
    assert first_chain == sorted(first_chain)  # the lowest first
    for i, (step, point) in enumerate(zip(ran, points, strict=True)):
        meta = read_config(folder / f"step{step}", verify=False)
        if step % 4 == 0:  # a chain starts from the dense model
            assert "parent_weights" not in meta and len(point["lineage"]) == 1
        else:  # the model the step before saved, by its weights' digest
            before = read_config(folder / f"step{ran[i - 1]}", verify=False)
            assert meta["parent_weights"] == before["sha256"][WEIGHTS]
            assert point["lineage"][:-1] == points[i - 1]["lineage"]


def test_an_arms_front_is_chosen_by_validation_and_scored_on_test() -> None:
    dense = {"ppl": 2.0, "test_ppl": 2.2, "params": 100, "seconds": 1.0, "sparsity": 0.0}
    chosen = {"ppl": 2.1, "test_ppl": 2.6, "params": 50, "seconds": 1.0, "sparsity": 0.5}
    # Better on test, but dominated on validation by `chosen`: not on the arm's front.
    passed_over = {"ppl": 2.2, "test_ppl": 2.3, "params": 60, "seconds": 1.0, "sparsity": 0.4}
    points = [dense, chosen, passed_over]
    expected = normalised_hypervolume([(2.2, 100), (2.6, 50)], (2.2, 100))
    assert hypervolume_within(points, dense, math.inf) == pytest.approx(expected)
    summary = summarise(points, dense)
    assert summary["ppl_ratio_50"] == pytest.approx(2.6 / 2.2)
    assert summary["reference_ratio_50"] is None  # no reference recorded


# --- the study end to end: the test split's noise changes no choice --------------------------


def study_on(folder: Path, test_text: str) -> Path:
    """The smoke study with warm starts and early stopping on, on files split as test_fraction
    would split them, the test file holding ``test_text``."""
    folder.mkdir()
    cut_val, cut_test = int(len(TEXT) * 0.8), int(len(TEXT) * 0.9)
    for name, part in (("train", TEXT[:cut_val]), ("val", TEXT[cut_val:cut_test]), ("test", test_text)):
        (folder / f"{name}.txt").write_text(part, encoding="utf-8")
    study = SMOKE.read_text().replace(
        'path = "data/tinyshakespeare.txt"',
        'train_path = "train.txt"\nval_path = "val.txt"\ntest_path = "test.txt"',
    )
    study = study.replace("enabled = false", "enabled = true\nmin_fraction = 0.3")
    study = study.replace("n_trials = 3", "n_trials = 5\nwarm_start = true")
    (folder / "study.toml").write_text(study)
    return folder / "study.toml"


@pytest.fixture(scope="module")
def twin_studies(tmp_path_factory):
    work = tmp_path_factory.mktemp("held_out")
    real = TEXT[int(len(TEXT) * 0.9) :]
    alphabet = sorted(set(TEXT))
    noise = "".join(random.Random(0).choices(alphabet, k=len(real)))
    runs = {}
    for name, test_text in (("real", real), ("noise", noise)):
        study_file = study_on(work / name, test_text)
        result = launch(
            "run", str(study_file), "--artifacts", str(work / name / "artifacts"), cwd=work / name
        )
        assert result.returncode == 0, result.stderr[-3000:]
        runs[name] = {"file": study_file, "url": f"sqlite:///{work / name}/runs/smoke.db", "cwd": work / name}
    return runs


@pytest.mark.slow
def test_a_study_whose_test_split_is_noise_makes_the_same_choices(twin_studies) -> None:
    def choices(run: dict) -> list:
        study = optuna.load_study(study_name="smoke", storage=run["url"])
        return [
            (
                t.number,
                t.state,
                t.params,
                t.values,
                t.user_attrs.get("warm_start_from"),
                t.user_attrs.get("hparams"),
                t.user_attrs.get("rung_val_perplexity"),
            )
            for t in study.get_trials()
        ]

    real, noise = choices(twin_studies["real"]), choices(twin_studies["noise"])
    assert real == noise
    assert any(c[4] is not None for c in real), "no trial was warm-started: the check would miss parents"
    tests = {
        name: [
            t.user_attrs.get("test_perplexity")
            for t in optuna.load_study(study_name="smoke", storage=run["url"]).trials
        ]
        for name, run in twin_studies.items()
    }
    scored = [(a, b) for a, b in zip(tests["real"], tests["noise"], strict=True) if a is not None]
    assert scored and all(a != b for a, b in scored), "the test split was not scored at all"


@pytest.mark.slow
def test_the_csv_and_status_report_test_first_and_the_matched_reference(twin_studies) -> None:
    run = twin_studies["real"]
    csv = run["cwd"] / "front.csv"
    result = cli_in_process(
        "reference", str(run["file"]), "--artifacts", str(run["cwd"] / "artifacts"), "--output", str(csv),
        "--eval-every", "5", cwd=run["cwd"],
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    frame = pd.read_csv(csv)
    columns = list(frame.columns)
    assert columns.index("test_perplexity") < columns.index("val_perplexity")
    assert {"lineage_steps", "reference_test_perplexity", "reference_ratio"} <= set(columns)
    assert frame["reference_test_perplexity"].notna().all()
    ratio = frame["test_perplexity"] / frame["reference_test_perplexity"]
    assert (ratio - frame["reference_ratio"]).abs().max() < 1e-9
    study = optuna.load_study(study_name="smoke", storage=run["url"])
    recorded = study.user_attrs["matched_references"]["points"]
    for number, reference in recorded.items():
        assert reference["lineage_steps"] == study.trials[int(number)].user_attrs["lineage_steps"]
    status = cli_in_process("status", "--storage", run["url"], "--study-name", "smoke", cwd=run["cwd"])
    assert "test perplexity" in status.stdout and "matched reference" in status.stdout
    assert json.loads(json.dumps(recorded))  # plain JSON in the study, for the dashboard


@pytest.mark.parametrize("study_file", sorted((SMOKE.parent).glob("*.toml")), ids=lambda p: p.name)
def test_every_shipped_study_file_loads_and_its_corpus_reads(study_file: Path) -> None:
    """The study files a user is pointed at (the default, the second corpus's, the examples):
    valid, and their corpus files there and split as they say."""
    cfg = load_study_config(study_file)
    if cfg.corpus.tokenizer != "char":  # a trained BPE or a model's own: test_hf_study runs those
        return
    corpus = Corpus.load(**cfg.corpus.load_kwargs(study_file.parent), block_size=cfg.model["block_size"])
    has_test = bool(cfg.corpus.test_path or cfg.corpus.test_fraction)
    assert (corpus.test is not None) == has_test
    if study_file.name in ("tinyshakespeare.toml", "python_code.toml"):  # what issue 46 compares on
        assert has_test


@pytest.mark.parametrize(
    ("extra", "says"),
    [((), "no database at runs/smoke.db"), (("--eval-every", "0"), "--eval-every must be at least 1")],
)
def test_reference_refuses_bad_input_in_one_line_and_writes_nothing(tmp_path, extra, says) -> None:
    result = cli_in_process("reference", str(SMOKE), *extra, cwd=tmp_path)
    assert result.returncode == 2 and says in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not list(tmp_path.iterdir())
