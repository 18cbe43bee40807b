"""One trial's pruned model written to a folder of its own (``launch-study export-model``): from
this machine's disk or the object store (its checksums verified), in its family's own format or
the project's, staged beside the target and swapped in whole."""

from __future__ import annotations

import math
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import optuna
from optuna.trial import TrialState

from orchestrator.artifacts import fetch, is_remote
from orchestrator.errors import UserError
from orchestrator.preflight import check_not_an_input, check_writable_folder
from orchestrator.storage import StudyStore, sqlite_database
from trainers.export import CorruptModel, UnverifiedModel, load_model, read_config
from trainers.families import family


def _warn(message: str) -> None:
    print(f"launch-study: warning: {message}", file=sys.stderr)


def export_trial_model(
    store: StudyStore,
    study: optuna.Study,
    trial_number: int,
    output: Path,
    force: bool = False,
    warn: Callable[[str], None] = _warn,
) -> Path:
    """Write COMPLETE trial ``trial_number``'s model to the folder ``output`` (new, empty, or
    replaced whole with ``force``); returns it. Every refusal is a ``UserError`` of one line."""
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    trial = trials.get(trial_number)
    if trial is None:
        raise UserError(f"study {study.study_name!r} has no trial {trial_number}")
    if trial.state != TrialState.COMPLETE:
        raise UserError(f"trial {trial_number} of {study.study_name!r} is {trial.state.name}, not COMPLETE")
    recorded = trial.user_attrs.get("model_dir")
    if recorded and is_remote(recorded):  # downloaded into this machine's cache, checked there
        try:
            source = fetch(recorded, trial.user_attrs.get("model_sha256"))
        except CorruptModel as err:
            raise UserError(f"trial {trial_number}'s model cannot be exported: {err}") from None
        except OSError as err:
            raise UserError(f"trial {trial_number}'s model: {recorded}: {err}") from None
    else:
        source = Path(recorded).resolve() if recorded else None
    if source is None or not source.is_dir():
        raise UserError(f"trial {trial_number}'s model is not on this machine (looked in {recorded or '-'})")
    try:
        try:
            model, tokenizer = load_model(source)  # checksums, then the weights themselves
        except UnverifiedModel:  # a trial of an earlier version: exported, with a word about it
            warn(f"trial {trial_number}'s model has no checksums to verify")
            model, tokenizer = load_model(source, verify=False)  # its weights may still be broken
    except CorruptModel as err:
        raise UserError(f"trial {trial_number}'s model cannot be exported: {err}") from None
    # A study made before model folders took a suffix of their own (storage.models_folder) shares
    # its folder with any study of its name run with the same --artifacts: check it is this trial's.
    saved = read_config(source, verify=False).get("val_perplexity")
    if saved is not None and not math.isclose(saved, trial.values[0], rel_tol=1e-9):
        raise UserError(
            f"trial {trial_number}'s folder {source} holds another model (perplexity {saved:.4f}, the "
            f"trial's {trial.values[0]:.4f}): a study of this name elsewhere wrote it since"
        )
    given, output = output, output.resolve()  # messages name it as it was given
    database = sqlite_database(store.url)
    check_not_an_input("--output", output, {"study's database": database, "trial's own folder": source})
    # the export is staged beside the folder, then renamed into place: its parent must be writable
    check_writable_folder("--output", output.parent, shown=given)
    # Copied beside the target, then swapped in: an export cut short leaves the old folder whole.
    staging, backup = output.with_name(f".{output.name}.partial"), output.with_name(f".{output.name}.old")
    if backup.is_dir() and not output.exists():  # a swap killed between its two renames
        backup.rename(output)  # the old export comes back, and is judged as any other below
    if output.exists() and not output.is_dir():
        raise UserError(f"--output {given} is a file; export-model writes a folder")
    if output.is_dir() and any(output.iterdir()) and not force:
        raise UserError(f"--output {given} is not empty; --force replaces it whole")
    for leftover in (staging, backup):
        shutil.rmtree(leftover, ignore_errors=True)
    family(model.cfg.family).export(model, tokenizer, source, staging)  # its own format, or as saved
    if output.exists():
        output.rename(backup)
    staging.rename(output)
    shutil.rmtree(backup, ignore_errors=True)
    return given
