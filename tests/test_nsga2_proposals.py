"""``[study] sampler = "nsga2"``: NSGA-II breeds the searched trials' shared parameters from the
start-up, its first generation, with the dense control kept out (orchestrator/nsga2_proposals.py)."""

from __future__ import annotations

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState, create_trial

from orchestrator.nsga2_proposals import NSGA2Proposer
from trainers.gates import heads_to_keep

optuna.logging.set_verbosity(optuna.logging.WARNING)

SPACE = {
    "method": CategoricalDistribution(["importance", "l0_target", "topk"]),
    "sparsity": FloatDistribution(0.05, 0.875),
    "lr": FloatDistribution(1e-3, 6e-3, log=True),
    "distill": CategoricalDistribution([False, True]),
    "gate_lr_mult": FloatDistribution(10.0, 200.0, log=True),  # the gate methods' knob only
}
DENSE = create_trial(values=[1.0, 32.0], user_attrs={"dense_control": True})
HEADS = 32


def perplexity(method: str, sparsity: float, lr: float, distill: bool) -> float:
    """A synthetic front: l0_target is the best method at every size, 3e-3 the best rate, and
    distillation helps."""
    return (
        1.0
        + sparsity**2
        + (0.0 if method == "l0_target" else 0.1)
        + abs(lr - 3e-3) * 20
        + 0.1 * (not distill)
    )


def trial(method: str, sparsity: float, lr: float = 3e-3, distill: bool = True, state=TrialState.COMPLETE):
    params = {"method": method, "sparsity": sparsity, "lr": lr, "distill": distill}
    if method != "importance":
        params["gate_lr_mult"] = 30.0
    finished = state == TrialState.COMPLETE
    values = [perplexity(method, sparsity, lr, distill), HEADS * (1 - sparsity)] if finished else None
    distributions = {name: SPACE[name] for name in params}
    return create_trial(state=state, params=params, distributions=distributions, values=values)


def startup(n: int) -> list:
    """A start-up sweep as the study runs one: importance at lr 3e-3 with distillation, n sizes."""
    return [trial("importance", 0.05 + 0.825 * i / (n - 1)) for i in range(n)]


def told(proposal: dict) -> optuna.trial.FrozenTrial:
    return trial(proposal["method"], proposal["sparsity"], proposal["lr"], proposal["distill"])


def test_the_proposal_is_what_every_pruned_trial_shares_and_inside_its_ranges():
    proposal = NSGA2Proposer(seed=0, population_size=6, total_heads=HEADS)([DENSE, *startup(6)])
    assert proposal is not None and set(proposal) == {"method", "sparsity", "lr", "distill"}
    assert proposal["method"] in SPACE["method"].choices and proposal["distill"] in (False, True)
    assert 0.05 <= proposal["sparsity"] <= 0.875 and 1e-3 <= proposal["lr"] <= 6e-3


def test_too_few_trials_or_nothing_shared_leaves_the_choice_to_the_studys_sampler():
    proposer = NSGA2Proposer(seed=0, population_size=4)
    assert proposer([DENSE]) is None
    only_own_knobs = [  # trials with no parameter in common
        create_trial(values=[1.2, 16.0], params={"lr": 3e-3}, distributions={"lr": SPACE["lr"]}),
        create_trial(
            values=[1.1, 24.0], params={"sparsity": 0.25}, distributions={"sparsity": SPACE["sparsity"]}
        ),
    ]
    assert proposer([DENSE, *only_own_knobs, *only_own_knobs]) is None


def test_until_a_whole_first_generation_is_modelled_the_studys_sampler_chooses():
    """With fewer finished trials than a generation NSGA-II has no parents and would draw at
    random: so with a start-up trial still running (two trials at once), or one stopped before
    its first rung, the proposer declines. A trial stopped at a rung counts, at its rung."""
    proposer = NSGA2Proposer(seed=0, population_size=4, total_heads=HEADS)
    sweep = startup(4)
    assert proposer([DENSE, *sweep]) is not None
    still_running = trial("importance", sweep[-1].params["sparsity"], state=TrialState.RUNNING)
    assert proposer([DENSE, *sweep[:3], still_running]) is None

    def stopped(rung_attrs: dict):
        params = {"method": "topk", "sparsity": 0.5, "lr": 3e-3, "distill": True}
        distributions = {name: SPACE[name] for name in params}
        return create_trial(
            state=TrialState.PRUNED, params=params, distributions=distributions, user_attrs=rung_attrs
        )

    assert proposer([DENSE, *sweep[:3], stopped({})]) is None  # stopped before a rung: nothing to model
    assert proposer([DENSE, *sweep[:3], stopped({"rung_val_perplexity": 1.4, "n_params": 16.0})]) is not None


def test_when_every_child_repeats_a_trial_the_studys_sampler_chooses():
    """Only method and distillation shared, and every pair of them run: nothing new to breed."""
    space = {name: SPACE[name] for name in ("method", "distill")}
    every_pair = [
        create_trial(values=[1.0 + i, 10.0 - i], params={"method": m, "distill": d}, distributions=space)
        for i, (m, d) in enumerate((m, d) for m in SPACE["method"].choices for d in (False, True))
    ]
    assert NSGA2Proposer(seed=0, population_size=2)([DENSE, *every_pair]) is None
    assert NSGA2Proposer(seed=0, population_size=2)([DENSE, *every_pair[1:]]) == {
        "method": "importance",
        "distill": False,
    }


def test_the_same_trials_and_seed_give_the_same_proposal_as_a_resumed_driver_needs():
    """Each call replays the trials into a new sampler: a driver started again on the same
    database (a new proposer, the study's seed: ``runner.make_proposer``) proposes what the old
    one would have."""
    trials = [DENSE, *startup(5), trial("topk", 0.4)]
    assert NSGA2Proposer(3, 5, HEADS)(trials) == NSGA2Proposer(3, 5, HEADS)(trials)
    assert NSGA2Proposer(3, 5, HEADS)(trials) != NSGA2Proposer(4, 5, HEADS)(trials)


def test_neighbouring_seeds_do_not_share_their_children():
    """Seed 0 with one trial more running than seed 1 (the same results modelled) once drew
    from the same random stream (0 + 7 = 1 + 6), so a benchmark's neighbouring seeds bred the
    same children. Two proposals each, as a study asks them."""

    def two_proposals(seed: int, running: list) -> list[dict]:
        trials, proposals = [DENSE, *startup(6), *running], []
        for _ in range(2):
            proposals.append(NSGA2Proposer(seed, population_size=6, total_heads=HEADS)(trials))
            trials.append(trial(proposals[-1]["method"], proposals[-1]["sparsity"], state=TrialState.RUNNING))
        return proposals

    assert two_proposals(0, [trial("topk", 0.3, state=TrialState.RUNNING)]) != two_proposals(1, [])


def test_children_are_variations_of_the_startup_not_random_draws():
    """The start-up is the first generation, so a child takes each setting from a start-up
    parent and redraws about one in four: most keep the start-up's rate. A sampler that did
    not see the generations (the replay not filing them) draws every child at random, and a
    random rate is never 3e-3 (to the transform's rounding)."""
    trials = [DENSE, *startup(10)]
    proposer = NSGA2Proposer(seed=0, population_size=10, total_heads=HEADS)
    children = []
    for _ in range(20):
        children.append(proposer(trials))
        trials.append(told(children[-1]))
    assert sum(abs(c["lr"] - 3e-3) < 1e-12 for c in children) >= 9, children


def test_no_child_runs_a_trial_again():
    """A child with no setting mutated is one of its parents: the same trial (same batches,
    same result). Such children, and ones at a sparsity that keeps a parent's head count with
    its settings, are passed over."""
    trials = [DENSE, *startup(8)]
    proposer = NSGA2Proposer(seed=1, population_size=8, total_heads=HEADS)
    for _ in range(15):
        child = proposer(trials)
        same = [
            t
            for t in trials[1:]
            if (t.params["method"], t.params["distill"]) == (child["method"], child["distill"])
            and abs(t.params["lr"] - child["lr"]) < 1e-12
            and heads_to_keep(HEADS, t.params["sparsity"]) == heads_to_keep(HEADS, child["sparsity"])
        ]
        assert same == [], child
        trials.append(told(child))


def test_generations_select_the_better_method():
    """Over generations the elite keeps the dominating points: on a front where l0_target is
    better at every size, the later generations breed mostly l0_target (the first child's
    method is the start-up's, importance, unless mutated)."""
    trials = [DENSE, *startup(5)]
    proposer = NSGA2Proposer(seed=0, population_size=5, total_heads=HEADS)
    methods = []
    for _ in range(30):
        child = proposer(trials)
        methods.append(child["method"])
        trials.append(told(child))
    assert methods[:5].count("l0_target") <= 2, methods
    assert methods[-10:].count("l0_target") >= 7, methods


def test_the_runner_builds_the_proposer_the_study_file_names():
    from orchestrator.gp_proposals import GPProposer
    from orchestrator.runner import make_proposer
    from orchestrator.search_space import SearchSpace

    space = SearchSpace(entries={}).for_model([8, 8, 8, 8])
    seeds = {"seed": 7, "study_seed": 0}  # the run's (the study's plus the trials asked) and the study's
    nsga2 = make_proposer("nsga2", **seeds, startup=19, space=space)
    assert isinstance(nsga2, NSGA2Proposer) and nsga2.population_size == 19 and nsga2.total_heads == 32
    assert nsga2.seed == 0  # a resumed run replays the study and proposes what the first would have
    assert isinstance(make_proposer("gp", **seeds, startup=19, space=space), GPProposer)
    assert make_proposer("tpe", **seeds, startup=19, space=space) is None


def test_the_driver_runs_the_proposal_after_the_startup(tmp_path):
    """The default study's space: after a start-up of 3, each trial takes NSGA-II's method,
    sparsity, lr and distill (marked as proposed), and the study's sampler the rest."""
    from helpers import default_study_driver, worker_result

    proposer = NSGA2Proposer(seed=0, population_size=3, total_heads=HEADS)
    driver = default_study_driver(tmp_path, startup=4, spread_trials=3, proposer=proposer)
    dense = driver.next_config("dense")["hparams"]
    driver.finish("dense", worker_result({**dense, "sparsity": 0.0}, 4.60), None)
    for name, ppl in zip(["s0", "s1", "s2"], [6.27, 4.80, 5.00]):
        driver.finish(name, worker_result(driver.next_config(name)["hparams"], ppl), None)
    for n in range(3):
        expected = proposer(driver.study.get_trials(deepcopy=False))
        hparams = driver.next_config(f"p{n}")["hparams"]
        assert expected is not None and {k: hparams[k] for k in expected} == expected
        driver.finish(f"p{n}", worker_result(hparams, 5.0), None)
    trials = driver.study.get_trials(deepcopy=False)
    assert [t.user_attrs.get("proposed_by") for t in trials] == [None] * 4 + ["nsga2"] * 3
