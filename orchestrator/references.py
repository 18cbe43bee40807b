"""``launch-study reference``: a matched dense reference for each point of a study's front.

A point's ratio to the dense control mixes the heads it lost with the training it got along its
warm-start lineage (``trainers/reference.py``). This command replays each front point's lineage on
the dense model and records, in the study, the best dense checkpoint within as many steps, so that
the Pareto CSV and ``status`` show each point against the dense model given the same training.
Nothing here selects on the test split: the reference checkpoint is chosen by validation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orchestrator.config import StudyConfig
from orchestrator.errors import UserError
from orchestrator.progress import say
from orchestrator.records import REFERENCES_ATTR, TrialRecord, dense_control, on_one_split
from orchestrator.session import RunOptions, StudySession
from orchestrator.storage import complete_trials, front_rows
from trainers.reference import MatchedReference, check_lineage
from trainers.trial import lineage_steps


@dataclass
class ReferenceSummary:
    csv: Path
    scored: int  # front points given a reference
    skipped: list[str]  # "trial N: why" (no lineage recorded)


def matched_references(cfg: StudyConfig, opts: RunOptions, eval_every: int = 50) -> ReferenceSummary:
    """Replay the lineage of each point of the front (and of the dense control) on the dense
    model; record each point's reference in the study and write the Pareto CSV with them.

    Checked before anything is written, as ``replicate`` checks: the study exists, the study file
    measures as the study did, the front has points, the dense checkpoint is the one it pruned."""
    if eval_every < 1:
        raise UserError(f"--eval-every must be at least 1, got {eval_every}")
    session = StudySession.to_revisit(cfg, opts)
    study, setup = session.study, session.setup
    front = front_rows(study)
    if not front:
        raise UserError(f"study {opts.study_name!r} has no front (no complete trial)")
    trials = {t.number: t for t in complete_trials(study)}
    wanted = [row["trial_number"] for row in front]
    control = dense_control(list(trials.values()))
    if control is not None and control.number not in wanted:
        wanted.append(control.number)
    lineages, skipped = {}, []
    for number in wanted:
        try:
            lineages[number] = check_lineage(trials[number].user_attrs.get("lineage"))
        except ValueError as err:
            skipped.append(f"trial {number}: {err}")
    if not lineages:
        raise UserError(f"study {opts.study_name!r}: no front point records its lineage ({skipped[0]})")
    trial_setup = session.revisited_setup()
    say(
        f"study {opts.study_name!r}: matched references for {len(lineages)} points, "
        f"{sum(map(lineage_steps, lineages.values())):,} steps of lineage"
    )
    replay = MatchedReference(trial_setup, eval_every=eval_every)
    points = {}
    for number, lineage in lineages.items():
        score = replay.score(lineage)
        points[str(number)] = score.to_dict()
        record = TrialRecord.from_trial(trials[number])
        split, mine, theirs = on_one_split(
            record.test_perplexity, record.val_perplexity, score.test_perplexity, score.val_perplexity
        )
        say(
            f"trial {number} (sparsity {record.sparsity:.3f}, {score.lineage_steps} steps): {split} "
            f"perplexity {mine:.3f} against {theirs:.3f} for the dense model at its best within them (step "
            f"{score.best_step}): {mine / theirs:.3f}x"
        )
    say(f"{replay.steps_trained:,} steps replayed (shared lineage prefixes replayed once)")
    if study.user_attrs.get("setup") is None:  # a study of an earlier version: so that exports read these
        study.set_user_attr("setup", setup)
    study.set_user_attr(REFERENCES_ATTR, {"setup": setup, "eval_every": eval_every, "points": points})
    csv = session.write_front(study)
    say(f"Pareto front with each point's matched reference -> {csv}")
    return ReferenceSummary(csv, len(points), skipped)
