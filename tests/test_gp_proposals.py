"""``[study] sampler = "gp"``: the Gaussian process proposes what the pruned trials share, with
the dense control (no parameters) kept out of its model (orchestrator/gp_proposals.py)."""

from __future__ import annotations

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState, create_trial

from orchestrator.gp_proposals import GPProposer
from orchestrator.proposals import as_modelled

optuna.logging.set_verbosity(optuna.logging.WARNING)

SPACE = {
    "method": CategoricalDistribution(["importance", "l0_target"]),
    "sparsity": FloatDistribution(0.05, 0.875),
    "lr": FloatDistribution(1e-3, 6e-3, log=True),
    "gate_lr_mult": FloatDistribution(10.0, 200.0, log=True),  # l0_target's knob only
}
DENSE = create_trial(values=[1.0, 32.0], user_attrs={"dense_control": True})


def perplexity(method: str, sparsity: float) -> float:
    """A synthetic front: l0_target is better than importance at every size."""
    return 1.0 + sparsity**2 + (0.0 if method == "l0_target" else 0.3)


def pruned(method: str, sparsity: float, lr: float = 3e-3, state: TrialState = TrialState.COMPLETE):
    params = {"method": method, "sparsity": sparsity, "lr": lr}
    if method == "l0_target":
        params["gate_lr_mult"] = 30.0
    values = [perplexity(method, sparsity), 32.0 * (1 - sparsity)] if state == TrialState.COMPLETE else None
    distributions = {name: SPACE[name] for name in params}
    return create_trial(state=state, params=params, distributions=distributions, values=values)


STARTUP = [pruned("importance", s) for s in (0.875, 0.46, 0.67)]
STARTUP += [pruned("l0_target", s) for s in (0.26, 0.77)]


def test_the_proposal_is_what_every_pruned_trial_shares_and_inside_its_ranges():
    """With the dense control among the trials, the intersection of all COMPLETE trials' parameters
    would be empty (Optuna's GPSampler would sample at random): the proposer leaves it out."""
    proposal = GPProposer(seed=0)([DENSE, *STARTUP])
    assert proposal is not None and set(proposal) == {"method", "sparsity", "lr"}  # not gate_lr_mult
    assert proposal["method"] in ("importance", "l0_target")
    assert 0.05 <= proposal["sparsity"] <= 0.875 and 1e-3 <= proposal["lr"] <= 6e-3


def test_too_few_trials_or_nothing_shared_leaves_the_choice_to_the_studys_sampler():
    assert GPProposer(seed=0)([DENSE]) is None
    assert GPProposer(seed=0)([DENSE, STARTUP[0]]) is None  # one point: nothing to model
    running_only = [DENSE, pruned("importance", 0.5, state=TrialState.RUNNING)]
    assert GPProposer(seed=0)(running_only) is None
    sparsity_only = {"sparsity": SPACE["sparsity"]}
    only_own_knobs = [  # two trials with no parameter in common
        create_trial(values=[1.2, 16.0], params={"lr": 3e-3}, distributions={"lr": SPACE["lr"]}),
        create_trial(values=[1.1, 24.0], params={"sparsity": 0.25}, distributions=sparsity_only),
    ]
    assert GPProposer(seed=0)([DENSE, *only_own_knobs]) is None


def test_a_seed_gives_the_same_proposal():
    trials = [DENSE, *STARTUP, pruned("importance", 0.5, state=TrialState.RUNNING)]
    assert GPProposer(seed=3)(trials) == GPProposer(seed=3)(trials)


def test_proposals_go_where_the_front_improves():
    """Told each proposal's synthetic result, the process keeps to l0_target, better at every
    size, and spreads it over the sizes, as the hypervolume asks (at random, each proposal would
    be importance half the time; all 8 l0_target by chance: 1 in 256)."""
    proposer, trials = GPProposer(seed=0), [DENSE, *STARTUP]
    proposals = []
    for _ in range(8):
        point = proposer(trials)
        proposals.append((point["method"], point["sparsity"]))
        trials.append(pruned(point["method"], point["sparsity"], point["lr"]))
    assert {method for method, _ in proposals} == {"l0_target"}, proposals
    sizes = [sparsity for _, sparsity in proposals]
    assert max(sizes) - min(sizes) > 0.3, proposals


def stopped(method: str, sparsity: float, rung_ppl: float | None):
    """A trial the scheduler stopped at a rung, as the driver records it."""
    params = {"method": method, "sparsity": sparsity, "lr": 3e-3}
    attrs = {} if rung_ppl is None else {"rung_val_perplexity": rung_ppl, "n_params": 32.0 * (1 - sparsity)}
    distributions = {name: SPACE[name] for name in params}
    return create_trial(state=TrialState.PRUNED, params=params, distributions=distributions, user_attrs=attrs)


def test_a_stopped_trial_is_modelled_at_its_rung_no_worse_than_the_worst_complete_one():
    worst = max(t.values[0] for t in STARTUP)
    near = as_modelled(stopped("l0_target", 0.5, rung_ppl=1.6), worst)
    assert near.state == TrialState.COMPLETE and near.values == [1.6, 16.0]
    assert near.params == {"method": "l0_target", "sparsity": 0.5, "lr": 3e-3}
    far = as_modelled(stopped("l0_target", 0.5, rung_ppl=30.0), worst)
    assert far.values == [worst, 16.0]  # the reference point stays where the final results put it
    assert as_modelled(stopped("l0_target", 0.5, rung_ppl=None), worst) is None  # no rung recorded
    assert as_modelled(STARTUP[0], worst) is None  # only stopped trials are converted


def test_stopped_trials_steer_the_proposals_away():
    """Without the stopped trials the first proposal is l0_target at 0.59, in the middle (the
    test above). With l0_target stopped at 0.35-0.7, a little worse at its rung than importance
    there, the first proposals leave that region."""
    trials = [DENSE, *STARTUP]
    trials += [stopped("l0_target", s, perplexity("importance", s) + 0.05) for s in (0.35, 0.5, 0.6, 0.7)]
    proposer = GPProposer(seed=0)
    for _ in range(2):
        point = proposer(trials)
        assert point["method"] == "importance" or not 0.3 < point["sparsity"] < 0.75, point
        trials.append(pruned(point["method"], point["sparsity"], point["lr"]))


def test_the_driver_runs_the_proposal_after_the_startup(tmp_path):
    """The default study's space: after a start-up of 3, each trial takes the GP's method,
    sparsity, lr and distill (marked as proposed), and the study's sampler the rest."""
    from helpers import default_study_driver, worker_result

    proposals = []

    class Recording(GPProposer):
        def __call__(self, trials):
            proposals.append(super().__call__(trials))
            return proposals[-1]

    driver = default_study_driver(tmp_path, startup=4, spread_trials=3, proposer=Recording(seed=0))
    dense = driver.next_config("dense")["hparams"]
    driver.finish("dense", worker_result({**dense, "sparsity": 0.0}, 4.60), None)
    for name, ppl in zip(["s0", "s1", "s2"], [6.27, 4.80, 5.00]):
        driver.finish(name, worker_result(driver.next_config(name)["hparams"], ppl), None)
    assert proposals == []  # the start-up is the sweep's
    for n in range(3):
        hparams = driver.next_config(f"p{n}")["hparams"]
        assert proposals[-1] is not None
        assert {k: hparams[k] for k in proposals[-1]} == proposals[-1]
        driver.finish(f"p{n}", worker_result(hparams, 5.0), None)
    trials = driver.study.get_trials(deepcopy=False)
    assert [t.user_attrs.get("proposed_by") for t in trials] == [None] * 4 + ["gp"] * 3
