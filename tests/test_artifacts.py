"""Files a later step trusts (issue 13): one checksummed format for every model; a corrupt dense
checkpoint is trained again, a corrupt after-pruning checkpoint is pruned again, a corrupt trial
model is refused by export-model."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
import torch
from helpers import cli_in_process

from trainers.atomic import write_atomically
from trainers.data import Corpus
from trainers.export import CONFIG, WEIGHTS, CorruptModel, load_model, read_config, save_model
from trainers.hparams import PretrainConfig, TrialBudget, TrialHParams
from trainers.model import LanguageModel, ModelConfig
from trainers.pretrain import ensure_dense_checkpoint
from trainers.tokenizers import CharTokenizer
from trainers.trial import AFTER_PRUNE, TrialIO, TrialSetup, run_trial

VOCAB = "vocab.json"  # the character tokenizer's file
VOCAB_12 = CharTokenizer(list("abcdefghijkl"))


def tiny_model() -> LanguageModel:
    return LanguageModel(ModelConfig(vocab_size=12, block_size=8, n_layer=1, n_head=2, d_model=8))


def flip_a_byte(path: Path, at: int = -100) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x40
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def export_trial_model(tmp_path: Path, output: Path | None = None):
    """``export-model`` of a one-trial study whose model is ``tmp_path/trial0``, to ``output``
    (``tmp_path/out`` unless given)."""
    url = f"sqlite:///{tmp_path}/s.db"
    study = optuna.create_study(study_name="s", storage=url, directions=["minimize", "minimize"])
    study.add_trial(
        optuna.trial.create_trial(values=[5.0, 100], user_attrs={"model_dir": str(tmp_path / "trial0")})
    )
    output = output or tmp_path / "out"
    args = ("--storage", url, "--study-name", "s", "--trial", "0", "--output", str(output))
    return cli_in_process("export-model", *args, cwd=tmp_path)


def test_a_saved_model_loads_back_identical_and_leaves_no_temporary_file(tmp_path):
    model = tiny_model()
    save_model(model, VOCAB_12, tmp_path / "m", extra={"note": 1})
    loaded, tokenizer = load_model(tmp_path / "m")
    assert tokenizer.vocab == VOCAB_12.vocab and read_config(tmp_path / "m")["note"] == 1
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == sorted([WEIGHTS, CONFIG, VOCAB])


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda f: flip_a_byte(f / WEIGHTS), "model.safetensors does not match its checksum"),
        (lambda f: truncate(f / WEIGHTS), "model.safetensors does not match its checksum"),
        (lambda f: flip_a_byte(f / VOCAB, at=2), "vocab.json does not match its checksum"),
        (lambda f: truncate(f / CONFIG), "config.json is unreadable"),
        (lambda f: (f / WEIGHTS).unlink(), "model.safetensors is missing"),
        (lambda f: (f / CONFIG).unlink(), "no config.json"),
    ],
)
def test_every_kind_of_damage_is_named(tmp_path, damage, message):
    save_model(tiny_model(), VOCAB_12, tmp_path / "m")
    damage(tmp_path / "m")
    with pytest.raises(CorruptModel, match=message):
        load_model(tmp_path / "m")


def test_a_corrupt_dense_checkpoint_is_trained_again(tmp_path, small_text):
    corpus = Corpus.load(small_text, block_size=16)
    model = ModelConfig(vocab_size=corpus.vocab_size, block_size=16, n_layer=1, n_head=2, d_model=16)
    pretrain = PretrainConfig(steps=4, batch_size=4, warmup_steps=1)
    first = ensure_dense_checkpoint(corpus, model, pretrain, tmp_path, eval_tokens=64)
    truncate(first.path / WEIGHTS)
    notices: list[str] = []
    again = ensure_dense_checkpoint(corpus, model, pretrain, tmp_path, eval_tokens=64, notice=notices.append)
    assert not again.reused and again.path == first.path
    assert notices == [
        f"dense checkpoint not used: {first.path / WEIGHTS} does not match its checksum "
        "(truncated or altered)"
    ]
    load_model(again.path)  # sound again
    assert ensure_dense_checkpoint(corpus, model, pretrain, tmp_path, eval_tokens=64).reused


def test_a_dense_checkpoint_pretraining_did_not_write_is_trained_again(tmp_path, small_text):
    """A sound model folder without pretraining's record (an export copied in by hand)."""
    corpus = Corpus.load(small_text, block_size=16)
    model = ModelConfig(vocab_size=corpus.vocab_size, block_size=16, n_layer=1, n_head=2, d_model=16)
    pretrain = PretrainConfig(steps=4, batch_size=4, warmup_steps=1)
    first = ensure_dense_checkpoint(corpus, model, pretrain, tmp_path, eval_tokens=64)
    weights, tokenizer = load_model(first.path)
    save_model(weights, tokenizer, first.path)  # checksums whole, no val_perplexity nor seconds
    notices: list[str] = []
    again = ensure_dense_checkpoint(corpus, model, pretrain, tmp_path, eval_tokens=64, notice=notices.append)
    assert not again.reused and again.val_perplexity == pytest.approx(first.val_perplexity)
    assert notices == [f"dense checkpoint not used: {first.path / CONFIG} records no val_perplexity"]


def test_a_corrupt_after_pruning_checkpoint_is_pruned_again(tmp_path, small_text):
    corpus = Corpus.load(small_text, block_size=16)
    model = ModelConfig(vocab_size=corpus.vocab_size, block_size=16, n_layer=2, n_head=2, d_model=16)
    dense = ensure_dense_checkpoint(
        corpus, model, PretrainConfig(steps=4, batch_size=4), tmp_path, eval_tokens=64
    )
    setup = TrialSetup(
        corpus, dense, TrialBudget(prune_steps=4, finetune_steps=2, batch_size=4, eval_tokens=64), 0
    )
    hp = TrialHParams(method="l0_target", sparsity=0.5)
    fresh = run_trial(setup, hp, TrialIO(save_dir=tmp_path / "first"))
    flip_a_byte(tmp_path / "first" / AFTER_PRUNE / WEIGHTS)
    retried = run_trial(setup, hp, TrialIO(save_dir=tmp_path / "retry", resume_dirs=[tmp_path / "first"]))
    assert "prune_resumed" not in retried.phase_seconds  # not resumed from the damaged one
    assert retried.val_perplexity == pytest.approx(fresh.val_perplexity, rel=1e-6)
    resumed = run_trial(setup, hp, TrialIO(save_dir=tmp_path / "third", resume_dirs=[tmp_path / "retry"]))
    assert "prune_resumed" in resumed.phase_seconds  # a sound one is


def test_export_model_refuses_a_bit_flipped_trial_model(tmp_path):
    save_model(tiny_model(), VOCAB_12, tmp_path / "trial0")
    flip_a_byte(tmp_path / "trial0" / WEIGHTS)
    run = export_trial_model(tmp_path)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip() == (
        f"launch-study: error: trial 0's model cannot be exported: {tmp_path / 'trial0' / WEIGHTS} "
        "does not match its checksum (truncated or altered)"
    )
    assert not (tmp_path / "out").exists()
    assert json.loads((tmp_path / "trial0" / CONFIG).read_text())["sha256"]  # left as it was


def resumable_trial(tmp_path: Path, small_text):
    """(corpus, dense checkpoint, budget, hyperparameters) of a tiny trial that prunes with gates,
    so that it writes a checkpoint after pruning."""
    corpus = Corpus.load(small_text, block_size=16)
    model = ModelConfig(vocab_size=corpus.vocab_size, block_size=16, n_layer=2, n_head=2, d_model=16)
    dense = ensure_dense_checkpoint(
        corpus, model, PretrainConfig(steps=4, batch_size=4), tmp_path, eval_tokens=64
    )
    budget = TrialBudget(prune_steps=4, finetune_steps=2, batch_size=4, eval_tokens=64)
    return corpus, dense, budget, TrialHParams(method="l0_target", sparsity=0.5)


def test_a_checkpoint_of_another_seed_is_not_resumed_and_a_retry_keeps_its_own(tmp_path, small_text):
    """A folder may hold a trial of an earlier study of the same name, or another seed's; a
    resumed trial writes its own checkpoint, so the retry of a retry resumes too."""
    corpus, dense, budget, hp = resumable_trial(tmp_path, small_text)
    run_trial(TrialSetup(corpus, dense, budget, 0), hp, TrialIO(save_dir=tmp_path / "seed0"))
    other_seed = run_trial(
        TrialSetup(corpus, dense, budget, 1),
        hp,
        TrialIO(save_dir=tmp_path / "a", resume_dirs=[tmp_path / "seed0"]),
    )
    assert "prune_resumed" not in other_seed.phase_seconds
    retry = run_trial(
        TrialSetup(corpus, dense, budget, 1),
        hp,
        TrialIO(save_dir=tmp_path / "b", resume_dirs=[tmp_path / "a"]),
    )
    assert "prune_resumed" in retry.phase_seconds and (tmp_path / "b" / AFTER_PRUNE).is_dir()
    again = run_trial(
        TrialSetup(corpus, dense, budget, 1),
        hp,
        TrialIO(save_dir=tmp_path / "c", resume_dirs=[tmp_path / "b"]),
    )
    assert "prune_resumed" in again.phase_seconds
    assert again.val_perplexity == pytest.approx(other_seed.val_perplexity, rel=1e-6)


def test_a_retry_does_not_resume_from_a_dense_model_trained_again(tmp_path, small_text):
    """The dense checkpoint's folder is named by its settings: one found corrupt and trained
    again holds other weights at the same path, which the pruned checkpoint was not cut from."""
    corpus, dense, budget, hp = resumable_trial(tmp_path, small_text)
    run_trial(TrialSetup(corpus, dense, budget, 0), hp, TrialIO(save_dir=tmp_path / "first"))
    same = run_trial(TrialSetup(corpus, dense, budget, 0), hp, TrialIO(resume_dirs=[tmp_path / "first"]))
    assert "prune_resumed" in same.phase_seconds  # the same dense weights: resumed
    weights, tokenizer = load_model(dense.path)
    with torch.no_grad():
        for p in weights.parameters():
            p.add_(0.01)
    save_model(weights, tokenizer, dense.path, extra=read_config(dense.path, verify=False))
    retried = run_trial(TrialSetup(corpus, dense, budget, 0), hp, TrialIO(resume_dirs=[tmp_path / "first"]))
    assert "prune_resumed" not in retried.phase_seconds


def save_trial_of_an_earlier_version(folder: Path) -> None:
    """A trial's model folder as headprune 0.1 wrote it: no checksums in its config."""
    save_model(tiny_model(), VOCAB_12, folder)
    config = json.loads((folder / CONFIG).read_text())
    del config["sha256"]
    (folder / CONFIG).write_text(json.dumps(config))


def test_a_model_of_an_earlier_version_exports_with_a_warning(tmp_path):
    save_trial_of_an_earlier_version(tmp_path / "trial0")
    run = export_trial_model(tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stderr.strip() == "launch-study: warning: trial 0's model has no checksums to verify"
    model, tokenizer = load_model(tmp_path / "out", verify=False)
    assert tokenizer.vocab == VOCAB_12.vocab


def test_a_write_that_fails_midway_leaves_the_old_file_whole(tmp_path):
    """What every cache, model file and export goes through (a SIGKILL mid-write is the same)."""
    target = tmp_path / "front.csv"
    target.write_text("trial_number\n0\n1\n")

    def half(tmp):
        tmp.write_text("trial_number\n0\n")
        raise OSError("No space left on device")

    with pytest.raises(OSError):
        write_atomically(target, half)
    assert target.read_text() == "trial_number\n0\n1\n"
    assert [p.name for p in tmp_path.iterdir()] == ["front.csv"]  # no temporary file left
    write_atomically(target, lambda tmp: tmp.write_text("new"))
    assert target.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["front.csv"]
    # a link stays a link, to the file it named; a device is written through, not replaced
    (tmp_path / "link.csv").symlink_to(target)
    write_atomically(tmp_path / "link.csv", lambda tmp: tmp.write_text("through the link"))
    assert (tmp_path / "link.csv").is_symlink() and target.read_text() == "through the link"
    write_atomically(Path("/dev/null"), lambda tmp: tmp.write_text("gone"))
    assert Path("/dev/null").is_char_device()


@pytest.mark.parametrize("damage", ["truncated", "missing"])
def test_a_model_of_an_earlier_version_with_broken_weights_is_one_line(tmp_path, damage):
    """Without checksums nothing vouches for the weights: loading them is the check."""
    save_trial_of_an_earlier_version(tmp_path / "trial0")
    weights = tmp_path / "trial0" / WEIGHTS
    if damage == "truncated":
        weights.write_bytes(weights.read_bytes()[:100])
    else:
        weights.unlink()
    run = export_trial_model(tmp_path)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    *warning, error = run.stderr.strip().splitlines()
    assert warning == ["launch-study: warning: trial 0's model has no checksums to verify"]
    assert error.startswith("launch-study: error: trial 0's model cannot be exported: ")
    assert "not a model of this format" in error
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("where", ["/proc/m", "{tmp}/s.db/m"])
def test_a_folder_that_cannot_be_written_is_one_line_before_anything_is_copied(tmp_path, where):
    save_model(tiny_model(), VOCAB_12, tmp_path / "trial0")
    run = export_trial_model(tmp_path, Path(where.replace("{tmp}", str(tmp_path))))
    assert run.returncode == 2, run.stderr
    assert run.stderr.count("\n") == 1 and "--output" in run.stderr and "Traceback" not in run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.db", "trial0"]  # no staging folder left


def test_an_export_killed_between_its_two_renames_gets_the_old_folder_back(tmp_path):
    save_model(tiny_model(), VOCAB_12, tmp_path / "trial0")
    assert export_trial_model(tmp_path).returncode == 0
    (tmp_path / "out" / "mine.txt").write_text("the user's")
    (tmp_path / "out").rename(tmp_path / ".out.old")  # the old one moved aside, the new not yet in
    args = ("--storage", f"sqlite:///{tmp_path}/s.db", "--study-name", "s", "--trial", "0")
    again = cli_in_process("export-model", *args, "--output", str(tmp_path / "out"), cwd=tmp_path)
    assert again.returncode == 2 and "is not empty; --force replaces it whole" in again.stderr
    assert (tmp_path / "out" / "mine.txt").read_text() == "the user's"
    assert not (tmp_path / ".out.old").exists()


def test_a_model_folder_another_study_of_the_name_wrote_is_not_exported(tmp_path):
    """Folders are named by study and trial number: a study of the same name in another
    database, sharing --artifacts, writes its trial 0 there too (this trial scored 5.0)."""
    save_model(tiny_model(), VOCAB_12, tmp_path / "trial0", extra={"val_perplexity": 4.0})
    run = export_trial_model(tmp_path)
    assert run.returncode == 2 and "holds another model (perplexity 4.0000, the trial's 5.0000)" in run.stderr
    assert not (tmp_path / "out").exists()
    save_model(tiny_model(), VOCAB_12, tmp_path / "trial0", extra={"val_perplexity": 5.0})
    args = ("--storage", f"sqlite:///{tmp_path}/s.db", "--study-name", "s", "--trial", "0")
    again = cli_in_process("export-model", *args, "--output", str(tmp_path / "out"), cwd=tmp_path)
    assert again.returncode == 0, again.stderr  # its own model exports


def test_export_model_never_replaces_the_folder_of_the_studys_database(tmp_path):
    save_model(tiny_model(), VOCAB_12, tmp_path / "trial0")
    run = export_trial_model(tmp_path, output=tmp_path)  # the folder that holds s.db
    assert run.returncode == 2 and "holds the study's database" in run.stderr
    assert (tmp_path / "s.db").is_file()
