"""NSGA-II proposals: ``[study] sampler = "nsga2"``.

Optuna's ``NSGAIISampler`` breeds generations: each child takes every parameter from one of two
parents chosen by tournament (uniform crossover), then draws each at random with probability
1 / the parameters' count (mutation); a generation's parents are the best of the generation
before and its parents, by non-dominated rank (ties: the most isolated on the front, crowding
distance). Here the study's start-up sweep is its first generation, so a generation is as large
as the start-up. What that makes of a study of the default's length: its first generation of
children is bred from every start-up point (the elite of one generation, cut to its own size,
is all of it), so each child is a start-up point with about one setting changed (another
method, rate, distillation or size), where TPE, which models each parameter alone, drifts from
the start-up's settings on every one at once. Selection among the children starts with the
second generation of children, after twice the start-up's trials have been searched.

Like the GP (``gp_proposals``), it runs on the study's searched trials without the dense control
(``proposals``) and proposes what they share; the study's own sampler (TPE) chooses a method's
own knobs, and all of them until a whole first generation is modelled (before that NSGA-II
would draw at random, as with a second trial running beside the last start-up one).

Optuna's NSGA-II keeps its generations in the study it samples: when it samples a trial it
files it in a generation (a system attribute it writes itself), and an enqueued trial, whose
values are fixed, skips that. So each call replays the trials into a throwaway study, one by
one in the order they were asked, each enqueued, asked, its ``relative_params`` read (the
sampler's own choice, unused, which files it), and told: generations come out as in a study that
ran them one at a time, and a driver started again on the database rebuilds the same ones.
That reading is Optuna's behaviour rather than its documented interface;
``tests/test_nsga2_proposals.py`` fails if it changes (children would be random draws). A child
that would run a trial again (the same shared settings at the same head count: for importance
and topk, which keep exactly that many heads, the same batches and the same result) is passed
over for another.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy
import optuna
from optuna.trial import FrozenTrial

from orchestrator.proposals import inside, modelled_trials, quiet_optuna, searched_trials, shared_space
from trainers.gates import heads_to_keep

# Children bred before the proposer gives up and leaves the trial to the study's sampler: a
# generation whose parents all share their settings breeds repeats (a child with no mutation is
# a parent), and about (1 - 1/4)^4, a third, of children of four shared parameters mutate none.
ATTEMPTS = 50


class NSGA2Proposer:
    """Proposes the next trial's shared parameters by NSGA-II from the trials so far; the same
    trials and seed give the same proposal (each call replays them into a new sampler)."""

    name = "nsga2"  # what a trial it proposed records as ``proposed_by``

    def __init__(self, seed: int, population_size: int, total_heads: int = 0) -> None:
        self.seed = seed  # the study's: with the trials' count, each proposal's sampler's
        self.population_size = max(2, population_size)  # NSGA-II's least
        self.total_heads = total_heads  # the model's, to tell two sparsities of one head count apart

    def __call__(self, trials: Iterable[FrozenTrial]) -> dict[str, Any] | None:
        """The parameters for the next trial, or None (fewer modelled trials than a generation,
        nothing they share, or only repeats bred): the study's sampler then chooses them."""
        searched = searched_trials(trials)
        modelled = modelled_trials(searched)
        shared = shared_space(modelled)
        if len(modelled) < self.population_size or not shared:
            return None
        taken = {self._key(t.params, shared) for t in searched}  # FAIL too: it would fail again
        with quiet_optuna():
            sampler = optuna.samplers.NSGAIISampler(
                population_size=self.population_size, seed=self._seed(searched)
            )
            shadow = optuna.create_study(directions=["minimize", "minimize"], sampler=sampler)
            for trial in modelled:
                shadow.enqueue_trial({name: trial.params[name] for name in shared})
                replayed = shadow.ask(fixed_distributions=shared)
                # Files it in its generation; from the second generation on this also breeds a
                # child (unused), which draws on the sampler's random state: deterministically.
                replayed.relative_params  # noqa: B018
                shadow.tell(replayed, trial.values)
            for _ in range(ATTEMPTS):
                child = inside(shadow.ask(fixed_distributions=shared).params, shared)
                if self._key(child, shared) not in taken:
                    return child
        return None

    def _seed(self, searched: list[FrozenTrial]) -> int:
        """This proposal's sampler's seed, from the study's and the trials so far. Not their sum:
        seed s at n trials would draw what seed s + 1 does at n - 1, and studies of neighbouring
        seeds (a benchmark's) would breed the same children (the first NSGA-II run did)."""
        return int(numpy.random.SeedSequence([self.seed, len(searched)]).generate_state(1)[0])

    def _key(self, params: dict[str, Any], shared: dict) -> tuple | None:
        """What makes two trials the same trial: their shared settings, sparsity as the heads it
        keeps. None for a trial that lacks one of them (it repeats nothing proposed)."""
        if not shared.keys() <= params.keys():
            return None
        # A crossover passes a float through the sampler's transform (a log for lr), which can
        # give 0.002999999999999999 for a parent's 3e-3: the same value, to 9 digits.
        values = {
            name: f"{v:.9g}" if isinstance(v, float) else v for name, v in params.items() if name in shared
        }
        if self.total_heads and "sparsity" in values:
            values["sparsity"] = heads_to_keep(self.total_heads, params["sparsity"])
        return tuple(sorted(values.items()))
