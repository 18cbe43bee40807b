"""The even spread of a range that a study's start-up trials take their sparsity from."""

from __future__ import annotations

import pytest

from orchestrator.config import load_study_config
from orchestrator.search_space import Choices, Fixed, Range, SearchSpace
from trainers.gates import heads_to_keep


def test_spread_starts_at_the_high_end_and_halves_the_gaps():
    space = SearchSpace({"sparsity": Range(0.0, 0.8)})
    values = [space.spread("sparsity", i) for i in range(8)]
    assert values == pytest.approx([0.8, 0.4, 0.6, 0.2, 0.7, 0.3, 0.5, 0.1])


def test_every_prefix_of_the_spread_covers_the_range():
    space = SearchSpace({"sparsity": Range(0.05, 0.875)})
    values = [space.spread("sparsity", i) for i in range(16)]
    assert all(0.05 <= v <= 0.875 for v in values)
    assert len(set(values)) == 16
    for n in (2, 4, 8, 16):  # n points leave no gap wider than the range / (n / 2)
        points = sorted([0.05, *values[:n]])
        assert max(b - a for a, b in zip(points, points[1:])) <= 0.825 / (n / 2) + 1e-12


def test_a_start_up_that_knows_the_models_heads_gives_every_trial_a_new_head_count():
    """The default study's range keeps 4 to 30 of 32 heads: the plain spread repeats a size at
    its 19th value and covers the 27 sizes only at its 32nd; with the heads known, 27 start-up
    trials cover them, the first 18 as before, then the sizes come round again in order."""
    from helpers import REPO

    plain = load_study_config(REPO / "studies" / "tinyshakespeare.toml").search
    sized = plain.for_model([8, 8, 8, 8])

    def kept(space, n):
        return [heads_to_keep(32, space.start_point(i)["sparsity"]) for i in range(n)]

    assert len(set(kept(plain, 19))) == 18  # the plain spread's 19th value repeats a size
    assert len(set(kept(plain, 31))) < 27
    assert sorted(kept(sized, 27)) == list(range(4, 31))
    assert kept(sized, 18) == kept(plain, 18)
    assert kept(sized, 30)[27:] == kept(sized, 3)
    assert [sized.start_point(i)["sparsity"] for i in range(18)] == [
        plain.start_point(i)["sparsity"] for i in range(18)
    ]


def test_a_start_up_spread_comes_round_again_once_every_size_has_a_trial():
    """Four heads over [0.25, 0.75]: three sizes (1 to 3 kept; the plain spread's 3rd to 7th
    values keep 2 or 1), then the same values again."""
    space = SearchSpace({"sparsity": Range(0.25, 0.75)}, total_heads=4)
    values = [space.start_sparsity(i) for i in range(6)]
    assert [heads_to_keep(4, v) for v in values] == [1, 2, 3, 1, 2, 3]
    assert values[3:] == values[:3]


@pytest.mark.parametrize(
    "entry", [Fixed(0.5), Choices((0.25, 0.5)), Range(1e-4, 1e-2, log=True), Range(1, 4, integer=True)]
)
def test_no_spread_for_anything_but_a_linear_float_range(entry):
    assert SearchSpace({"sparsity": entry}).spread("sparsity", 0) is None


def test_start_points_sweep_the_first_listed_method_with_everything_else_at_defaults():
    targets = ("l0_target", "random", "importance")
    space = SearchSpace(
        {
            "sparsity": Range(0.0, 0.8),
            "lr": Range(3e-4, 3e-3, log=True),
            "gate_lr_mult": Range(20.0, 200.0),
            "method": Choices(("l0_penalty", "random", "l0_target")),
            "distill": Choices((True, False)),
            "schedule_shape": Choices(("cubic", "exp")),
            "freeze_weights": Fixed(False),
        },
        applies_to={"sparsity": targets},
        defaults={
            "sparsity": 0.5,
            "lr": 1e-3,
            "gate_lr_mult": 10.0,
            "method": "l0_target",
            "distill": False,
            "schedule_shape": "linear",
            "freeze_weights": False,
        },
    )
    # gate_lr_mult's default 10 is outside [20, 200]: sampled. The method: the first listed that
    # takes a sparsity target (l0_penalty does not); a switch at its default (listed second); a
    # list without the default at its first entry.
    first = {"lr": 1e-3, "method": "random", "distill": False, "schedule_shape": "cubic"}
    assert space.start_point(0) == {"sparsity": 0.8, **first}
    assert space.start_point(1) == {"sparsity": 0.4, **first}
    assert SearchSpace({"sparsity": Fixed(0.5)}).start_point(0) is None


def startup_space(startup: dict) -> SearchSpace:
    from orchestrator.config import field_specs
    from trainers.hparams import TrialHParams

    table = {
        "method": ["importance", "l0_target", "random"],
        "sparsity": {"low": 0.1, "high": 0.9},
        "lr": {"low": 1e-4, "high": 1e-2, "log": True},
        "distill": [False, True],
        "gate_lr_mult": {"low": 10.0, "high": 100.0, "log": True},
        "min_heads_per_layer": 1,
    }
    specs = field_specs(TrialHParams)
    space = SearchSpace.from_table("s.toml: [search]", table, specs)
    return space.with_startup("s.toml: [startup]", startup, specs)


def test_startup_table_sets_the_sweeps_settings_and_nothing_else():
    """[startup] lr = 3e-3 (a pruned model's rate, not the dense control's 3e-4): the sweep
    takes it; the other knobs keep the default rule, the dense control and the sampler's space
    are untouched."""
    plain, tuned = startup_space({}), startup_space({"lr": 3e-3})
    assert plain.start_point(0)["lr"] == 3e-4  # the trainer's default
    assert tuned.start_point(0) == {**plain.start_point(0), "lr": 3e-3}
    assert tuned.start_point(1)["sparsity"] == plain.start_point(1)["sparsity"]
    assert tuned.control_point() == plain.control_point()
    # a [startup] value equal to a fixed one is every trial's, not a start-up setting
    assert "min_heads_per_layer" not in startup_space({"min_heads_per_layer": 1}).start_point(0)
    swept = startup_space({"method": "l0_target", "gate_lr_mult": 20.0}).start_point(0)
    assert (swept["method"], swept["gate_lr_mult"]) == ("l0_target", 20.0)


def test_a_start_up_of_several_methods_takes_them_in_turn_each_with_its_own_settings():
    """[startup] method = ["importance", "l0_target"]: trial i sweeps the i-th sparsity of the
    one-method spread with the methods in turn, so the sampler sees both before it models them;
    a setting applies to the trials of the methods it is a knob of (gate_lr_mult: l0_target's
    only), the others keep the default rule."""
    one = startup_space({"distill": True})
    both = startup_space({"method": ["importance", "l0_target"], "distill": True, "gate_lr_mult": 20.0})
    points = [both.start_point(i) for i in range(4)]
    assert [p["method"] for p in points] == ["importance", "l0_target", "importance", "l0_target"]
    assert [p["sparsity"] for p in points] == [one.start_point(i)["sparsity"] for i in range(4)]
    assert all(p["distill"] is True for p in points)
    assert [p["gate_lr_mult"] for p in points] == [30.0, 20.0, 30.0, 20.0]  # importance: not its knob
    # a sweep of one method (bench.frontier) gets that method's settings at every index
    assert [both.sweep_point("l0_target", i)["gate_lr_mult"] for i in range(2)] == [20.0, 20.0]
    assert "gate_lr_mult" not in both.sweep_point("importance", 1)


@pytest.mark.parametrize(
    "startup, fragment",
    [
        ({"method": ["importance", "l0_penalty"]}, "'l0_penalty' takes no sparsity target"),
        ({"method": []}, "an empty list"),
        ({"method": ["importance", "l0_target", "importance"]}, "'importance' listed twice"),
        (
            {"method": ["importance", "random"], "gate_lr_mult": 20.0},
            "does not apply to 'importance' or 'random'",
        ),
        ({"lr": 0.1}, "not a value [search] lr allows (from 0.0001 to 0.01)"),
        ({"method": "topk"}, "not a value [search] method allows (one of ['importance'"),
        ({"method": "l0_penalty"}, "takes no sparsity target"),
        ({"min_heads_per_layer": 2}, "[search] gives every trial 1; set both alike"),
        ({"sparsity": 0.5}, "spreads it over"),
        ({"gate_lr_mult": 20.0}, "does not apply to 'importance'"),
        ({"lrr": 1e-3}, "did you mean 'lr'"),
        ({"trials": 4}, "[study] startup_trials"),
        ({"distill": "yes"}, "expected bool"),
    ],
)
def test_startup_table_refuses_what_the_sampler_could_not_have_chosen(startup, fragment):
    from orchestrator.errors import UserError

    with pytest.raises(UserError, match=r"s\.toml: \[startup\]") as err:
        startup_space(startup)
    assert fragment in str(err.value)


def test_startup_values_must_lie_on_a_stepped_ranges_grid():
    """A value between a stepped range's points is one the sampler never chooses (Optuna would
    warn and take it anyway): refused, as is a stepped default (it is sampled instead)."""
    from orchestrator.config import field_specs
    from orchestrator.errors import UserError
    from trainers.hparams import TrialHParams

    specs = field_specs(TrialHParams)
    table = {"sparsity": {"low": 0.1, "high": 0.5}, "min_heads_per_layer": {"low": 0, "high": 4, "step": 2}}
    space = SearchSpace.from_table(
        "[search]", {**table, "lr": {"low": 1e-3, "high": 5e-3, "step": 1e-3}}, specs
    )
    assert (
        space.with_startup("[startup]", {"lr": 4e-3, "min_heads_per_layer": 2}, specs).start_point(0)["lr"]
        == 4e-3
    )
    for bad in ({"lr": 3.5e-3}, {"min_heads_per_layer": 3}):
        with pytest.raises(UserError, match="in steps of"):
            space.with_startup("[startup]", bad, specs)
    assert "min_heads_per_layer" not in space.start_point(0)  # the default 1 is off the grid: sampled


def test_startup_settings_without_a_start_up_sweep_are_refused_unless_they_match_every_trial():
    """With sparsity fixed there is no sweep: a [startup] lr would do nothing (refused), one
    equal to the lr every trial takes is harmless (bench.scaling fixes the default study so)."""
    from orchestrator.config import field_specs
    from orchestrator.errors import UserError
    from trainers.hparams import TrialHParams

    specs = field_specs(TrialHParams)
    space = SearchSpace.from_table("[search]", {"sparsity": 0.5, "lr": 1e-3, "distill": [False, True]}, specs)
    space.with_startup("[startup]", {"lr": 1e-3}, specs)
    with pytest.raises(UserError, match="no start-up sweep"):
        space.with_startup("[startup]", {"distill": True}, specs)
    with pytest.raises(ValueError, match="no start-up sweep"):
        space.sweep_point("random", 0)


def test_a_sweep_point_is_the_start_up_with_another_method():
    """bench.frontier's sweeps: the default study's start-up (its spread, [startup] lr, fixed
    values) with the method replaced and only that method's knobs kept."""
    from helpers import REPO

    space = load_study_config(REPO / "studies" / "tinyshakespeare.toml").search
    start = space.start_point(1)
    random = space.sweep_point("random", 1)
    assert (random["method"], random["sparsity"], random["lr"]) == ("random", start["sparsity"], 3e-3)
    assert "gate_lr_mult" not in random and "importance_step" not in random
    gated = space.sweep_point("l0_target", 1)
    assert gated["schedule_shape"] == "linear" and gated["gate_lr_mult"] == 30.0  # fixed; the default
    swept_alike = {k: v for k, v in start.items() if space.applies(k, "importance")}
    assert swept_alike.items() <= space.sweep_point("importance", 1).items()  # the start-up's own trial


def test_an_unreachable_start_up_minimum_is_named():
    from orchestrator.config import field_specs
    from orchestrator.errors import UserError
    from trainers.hparams import TrialHParams

    specs = field_specs(TrialHParams)
    table = {"sparsity": {"low": 0.1, "high": 0.75}, "min_heads_per_layer": {"low": 1, "high": 3}}
    space = SearchSpace.from_table("[search]", table, specs).with_startup(
        "[startup]", {"min_heads_per_layer": 3}, specs
    )
    with pytest.raises(UserError, match="the start-up's first trial: .*min_heads_per_layer=3"):
        space.check_reachable("[search]", [8, 8, 8, 8])


def test_a_startup_method_without_a_sparsity_target_is_refused():
    """l0_penalty among [search]'s methods (so not refused as unlisted): refused as the sweep's."""
    from orchestrator.config import field_specs
    from orchestrator.errors import UserError
    from trainers.hparams import TrialHParams

    specs = field_specs(TrialHParams)
    space = SearchSpace.from_table("[search]", {"method": ["l0_penalty", "random"]}, specs)
    with pytest.raises(UserError, match="takes no sparsity target"):
        space.with_startup("[startup]", {"method": "l0_penalty"}, specs)


@pytest.mark.parametrize("method", [Choices(("l0_penalty", "dense")), Fixed("l0_penalty")])
def test_no_start_up_sweep_when_no_method_takes_a_sparsity_target(method):
    space = SearchSpace(
        {"sparsity": Range(0.1, 0.9), "method": method},
        applies_to={"sparsity": ("l0_target", "random")},
        defaults={"method": "l0_target"},
    )
    assert space.start_point(0) is None


def test_the_first_start_up_trial_must_be_reachable_with_its_own_minimum_per_layer():
    """``min_heads_per_layer = [3, 2]`` (the default, 1, not listed: the start-up takes 3) is
    checked for what the first start-up trial asks for (the highest sparsity with 3 per layer),
    not only for the fewest listed."""
    from orchestrator.config import field_specs
    from orchestrator.errors import UserError
    from trainers.hparams import TrialHParams

    table = {"sparsity": {"low": 0.1, "high": 0.75}, "min_heads_per_layer": [3, 2]}
    space = SearchSpace.from_table("[search]", table, field_specs(TrialHParams))
    assert space.start_point(0)["min_heads_per_layer"] == 3
    with pytest.raises(UserError, match=r"\[search\] sparsity"):
        space.check_reachable("[search]", [8, 8, 8, 8])  # 75% of 32 leaves 8: not 3 per layer
    SearchSpace.from_table(
        "[search]", {**table, "min_heads_per_layer": [2, 3]}, field_specs(TrialHParams)
    ).check_reachable("[search]", [8, 8, 8, 8])


def test_dense_control_takes_defaults_whatever_is_searched():
    """Every knob searched (ranges and choices, distillation among them), one fixed: the
    control gets the trainer's default for each searched one and the fixed value as set."""
    from orchestrator.config import field_specs
    from trainers.hparams import TrialHParams

    table = {
        "method": ["l0_target", "topk", "random"],
        "sparsity": {"low": 0.1, "high": 0.9},
        "lr": {"low": 1e-4, "high": 1e-2, "log": True},
        "distill": [True, False],
        "distill_logit": {"low": 0.5, "high": 2.0},
        "gate_lr_mult": {"low": 20.0, "high": 200.0},
        "min_heads_per_layer": 2,
    }
    space = SearchSpace.from_table("s.toml: [search]", table, field_specs(TrialHParams))
    control = space.control_point()
    defaults = TrialHParams()
    assert control["method"] == "dense" and control["sparsity"] == 0.0
    assert (control["lr"], control["distill"], control["distill_logit"]) == (
        defaults.lr,
        defaults.distill,
        defaults.distill_logit,
    )
    assert control["min_heads_per_layer"] == 2  # fixed by the study file: applies to it too
    assert "gate_lr_mult" not in control  # a gate method's knob: not the dense method's
    TrialHParams(**control)  # a complete, valid set


def test_the_start_up_spread_follows_the_runs_n_trials_and_the_study_files_override():
    from helpers import REPO

    from orchestrator.runner import startup_trials

    cfg = load_study_config(REPO / "studies" / "tinyshakespeare.toml")  # n_trials = 18
    sized = cfg.search.for_model([8, 8, 8, 8])  # 27 head counts in the range
    assert startup_trials(cfg, 4, sized) == 3  # a run of --n-trials 4, not the file's 18
    assert startup_trials(cfg, 18, sized) == 10  # the default study's own run
    assert startup_trials(cfg, 40, sized) == 21  # half the run, beyond the old cap of 10
    assert startup_trials(cfg, 100, sized) == 27  # at most one trial per size
    assert startup_trials(cfg, 100, cfg.search) == 10  # the model's heads not known: the old cap
    overridden = load_study_config(REPO / "studies" / "tinyshakespeare.toml", ["study.startup_trials=6"])
    assert startup_trials(overridden, 4, sized) == 6


def test_the_default_studys_start_up_is_a_sweep_of_its_first_method_then_the_sampler_chooses(tmp_path):
    """Through the driver that Tune's searcher asks: the dense control, then the start-up trials
    (importance, listed first in the default study, at [startup]'s lr and distillation, the
    defaults and the spread's sparsities), then trials the sampler chooses (their settings
    sampled, not the defaults)."""
    from helpers import default_study_driver

    driver = default_study_driver(tmp_path, startup=3, spread_trials=3)
    asked = [driver.next_config(f"t{i}")["hparams"] for i in range(12)]
    assert asked[0]["method"] == "dense"
    start_up = asked[1:4]
    assert [h["method"] for h in start_up] == ["importance"] * 3
    assert [h["sparsity"] for h in start_up] == [0.875, 0.4625, 0.66875]
    # [startup] lr = 3e-3 (a pruned model's rate) and distill = true; the dense control keeps the
    # defaults, 3e-4 and no distillation
    assert all(h["lr"] == 3e-3 and h["distill"] is True for h in start_up)
    assert asked[0]["lr"] == 3e-4 and asked[0]["distill"] is False
    later = asked[4:]
    assert len({h["lr"] for h in later}) == len(later) and 3e-3 not in {h["lr"] for h in later}  # sampled
    assert len({h["method"] for h in later}) > 1  # the sampler explores the other methods


def test_the_driver_gives_each_start_up_trial_a_head_count_of_its_own(tmp_path):
    """Through the driver, on the default study's 32 heads: 20 start-up trials, 20 sizes (the
    plain spread would run 11 heads twice, at its 3rd and 19th values)."""
    from helpers import default_study_driver

    driver = default_study_driver(tmp_path, startup=20, spread_trials=20, n_trials=30)
    asked = [driver.next_config(f"t{i}")["hparams"] for i in range(21)][1:]
    assert len({heads_to_keep(32, h["sparsity"]) for h in asked}) == 20


def test_a_retried_start_up_trial_does_not_skip_the_next_point_of_the_spread(tmp_path):
    """A start-up trial that failed and is asked again (``retry_of``, as the driver does after a
    crash) repeats its own point; the next new trial takes the next sparsity, not the one after."""
    from helpers import default_study_driver
    from optuna.trial import TrialState

    driver = default_study_driver(tmp_path, startup=4, spread_trials=4)
    first = [driver.next_config(f"t{i}")["hparams"] for i in range(3)]  # dense, 0.875, 0.4625
    failed = driver.study.trials[2]
    driver.study.tell(failed.number, state=TrialState.FAIL)
    driver.study.enqueue_trial(failed.params, user_attrs={"retry_of": failed.number})
    retry, after = (driver.next_config(f"t{i}")["hparams"] for i in (3, 4))
    assert retry["sparsity"] == first[2]["sparsity"] == 0.4625
    assert after["sparsity"] == 0.66875  # the spread's third point, as without the failure
