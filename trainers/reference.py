"""Matched dense references: the dense model given the training a pruned point had.

A point deep in a warm-start lineage has been fine-tuned over several trials (``TrialResult.
lineage``: each trial's peak learning rate and the steps of its phases), while the dense control
gets one trial's steps at its own rate. Its ratio to the dense control mixes two things: the heads
it lost and the training it got. The matched reference replays the point's lineage on the dense
model, phase by phase (a warm-up-free cosine schedule at the trial's rate, as a trial trains; each
trial's batches drawn from a generator seeded as a trial's), scores the validation split every
``eval_every`` steps and at each phase's end, and keeps the best checkpoint reached within that
many steps, the dense checkpoint itself included (at this scale more training can hurt the dense
model). Its test-split score is the reference: chosen by validation, reported on test, like the
points it is compared with.

Lineages share their first trials (a front is a tree of warm starts), so the replay of a prefix
is kept and a longer lineage continues from it.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from trainers.pretrain import load_dense
from trainers.training import Schedule, final_scores, fit, mean_loss, pick_device
from trainers.trial import TrialSetup, evaluation_windows, lineage_steps, test_windows


@dataclass(frozen=True)
class ReferenceScore:
    """The best dense checkpoint within a lineage's steps."""

    lineage_steps: int  # the steps replayed
    best_step: int  # steps into the replay of the best checkpoint (0: the dense model as it is)
    val_perplexity: float
    test_perplexity: float | None  # None: the corpus has no test split

    def to_dict(self) -> dict:
        return {
            "lineage_steps": self.lineage_steps,
            "best_step": self.best_step,
            "val_perplexity": self.val_perplexity,
            "test_perplexity": self.test_perplexity,
        }


def check_lineage(lineage: object) -> list[dict]:
    """``lineage`` as recorded (a list of {"lr": float > 0, "steps": [int >= 0, ...]}), or a
    ``ValueError`` saying what is wrong."""
    if not isinstance(lineage, list):
        raise ValueError("no lineage recorded (a trial of a version before lineages)")
    for entry in lineage:
        ok = isinstance(entry, dict) and isinstance(entry.get("lr"), (int, float)) and entry["lr"] > 0
        steps = entry.get("steps") if isinstance(entry, dict) else None
        if not ok or not isinstance(steps, list) or not all(isinstance(n, int) and n >= 0 for n in steps):
            raise ValueError(f"a lineage entry is not {{'lr': rate, 'steps': [n, ...]}}: {entry!r}")
    return lineage


class MatchedReference:
    """Replays lineages on the study's dense model (``setup.dense``), sharing their prefixes."""

    def __init__(
        self, setup: TrialSetup, eval_every: int = 50, progress: Callable[[str], None] | None = None
    ) -> None:
        if eval_every < 1:
            raise ValueError(f"eval_every must be at least 1, got {eval_every}")
        self.setup, self.eval_every, self.progress = setup, eval_every, progress
        self.device = pick_device(setup.budget.device)
        self.windows = evaluation_windows(setup)
        self.test = test_windows(setup) if setup.corpus.test is not None else None
        model = load_dense(setup.dense, self.device)
        # prefix (JSON of its entries) -> (weights after it, best (val, step, test) within it)
        self._replayed: dict[str, tuple[dict, tuple[float, int, float | None]]] = {
            "[]": (copy.deepcopy(model.state_dict()), self._scored(model, 0))
        }
        self._model = model
        self.steps_trained = 0  # replayed steps in all (what the shared prefixes saved shows here)

    def _scored(
        self, model: torch.nn.Module, step: int, val: float | None = None
    ) -> tuple[float, int, float | None]:
        val = math.exp(mean_loss(model, self.windows)) if val is None else val
        test = final_scores(model, self.test, self.setup.corpus.tokenizer)[0] if self.test else None
        return val, step, test

    def score(self, lineage: list[dict]) -> ReferenceScore:
        """The best checkpoint of the dense model trained along ``lineage``, within its steps."""
        lineage = check_lineage(lineage)
        done = 0
        while done < len(lineage) and json.dumps(lineage[: done + 1], sort_keys=True) in self._replayed:
            done += 1
        state, best = self._replayed[json.dumps(lineage[:done], sort_keys=True)]
        model = self._model
        model.load_state_dict(state)
        step = lineage_steps(lineage[:done])
        for i in range(done, len(lineage)):
            entry = lineage[i]
            generator = torch.Generator().manual_seed(self.setup.seed)  # as each trial's batches
            for phase_steps in entry["steps"]:
                if not phase_steps:
                    continue
                start = step

                def checkpoint(done_steps: int, start=start, steps=phase_steps) -> bool:
                    nonlocal best
                    if done_steps % self.eval_every == 0 or done_steps == steps:
                        val = math.exp(mean_loss(model, self.windows))
                        if val < best[0]:  # the test split is scored only for the best so far
                            best = self._scored(model, start + done_steps, val)
                    return False

                schedule = Schedule(phase_steps, self.setup.budget.batch_size, float(entry["lr"]))
                fit(model, self.setup.corpus.train, generator, schedule, after_step=checkpoint)
                step += phase_steps
                self.steps_trained += phase_steps
            key = json.dumps(lineage[: i + 1], sort_keys=True)
            self._replayed[key] = (copy.deepcopy(model.state_dict()), best)
            if self.progress is not None:
                self.progress(f"replayed {i + 1}/{len(lineage)} trials of a lineage ({step} steps)")
        val, best_step, test = best
        return ReferenceScore(step, best_step, val, test)
