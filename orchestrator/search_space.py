"""The ``[search]`` table: each hyperparameter fixed, a range, or a list of choices.

    sparsity = { low = 0.0, high = 0.9 }          # a range (add log = true, or step = ...)
    schedule_shape = ["linear", "cubic"]          # choices
    gate_init = 2.0                               # fixed

Values are suggested define-by-run on an Optuna trial; fixed ones are not suggested, so they stay
out of the sampler's space but are passed to every trial. The ``[startup]`` table fixes settings
for the start-up sweep only (``SearchSpace.with_startup``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import optuna

from orchestrator.errors import UserError, closest
from trainers.gates import check_reachable, heads_to_keep


def _describe_bounds(spec: dict) -> str:
    low, high = spec.get("low"), spec.get("high")
    if high is None:
        return f"{'>' if spec.get('low_open') else '>='} {low}"
    return f"in {'(' if spec.get('low_open') else '['}{low}, {high}{')' if spec.get('high_open') else ']'}"


def check_value(where: str, value: Any, spec: dict) -> Any:
    """One value against its spec (type, bounds, choices); returns it converted (int -> float)."""
    kind = spec.get("type") or type(spec.get("default"))
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, kind)
    if not ok:
        raise UserError(f"{where}: expected {kind.__name__}, got {value!r}")
    if kind is float and not math.isfinite(value):
        raise UserError(f"{where}: {value!r} is not a finite number")
    choices = spec.get("choices")
    if choices and value not in choices:
        raise UserError(f"{where}: {value!r} is not one of {', '.join(map(str, choices))}")
    low, high = spec.get("low"), spec.get("high")
    if low is not None and (value < low or (spec.get("low_open") and value <= low)):
        raise UserError(f"{where}: {value!r} must be {_describe_bounds(spec)}")
    if high is not None and (value > high or (spec.get("high_open") and value >= high)):
        raise UserError(f"{where}: {value!r} must be {_describe_bounds(spec)}")
    return value


@dataclass(frozen=True)
class Range:
    low: float
    high: float
    log: bool = False
    step: float | None = None
    integer: bool = False

    def suggest(self, trial: optuna.Trial, name: str) -> Any:
        if self.integer:
            return trial.suggest_int(
                name, int(self.low), int(self.high), log=self.log, step=int(self.step or 1)
            )
        return trial.suggest_float(name, self.low, self.high, log=self.log, step=self.step)

    def values(self) -> list[float]:
        return [self.low, self.high]

    def holds(self, value: Any) -> bool:
        """A value the sampler could choose: inside the range and, with a step, on its grid."""
        if not isinstance(value, (int, float)) or not self.low <= value <= self.high:
            return False
        if self.step or self.integer:
            steps = (value - self.low) / (self.step or 1)
            return math.isclose(steps, round(steps), abs_tol=1e-9)
        return True


@dataclass(frozen=True)
class Choices:
    options: tuple

    def suggest(self, trial: optuna.Trial, name: str) -> Any:
        return trial.suggest_categorical(name, list(self.options))

    def values(self) -> list:
        return list(self.options)

    def holds(self, value: Any) -> bool:
        return value in self.options


@dataclass(frozen=True)
class Fixed:
    value: Any

    def suggest(self, trial: optuna.Trial, name: str) -> Any:
        return self.value

    def values(self) -> list:
        return [self.value]

    def holds(self, value: Any) -> bool:
        return value == self.value


RANGE_KEYS = ("low", "high", "log", "step")


@dataclass(frozen=True)
class SearchSpace:
    entries: dict[str, Range | Choices | Fixed]
    # hyperparameter -> the methods it applies to (None: every method)
    applies_to: dict[str, tuple | None] = field(default_factory=dict)
    defaults: dict[str, Any] = field(default_factory=dict)  # the trainer's own values
    startup: dict[str, Any] = field(default_factory=dict)  # [startup]: the start-up sweep's settings
    # The model's heads (``for_model``); 0 while unknown: the start-up then spreads sparsity alone.
    total_heads: int = 0

    @classmethod
    def from_table(cls, where: str, table: Any, specs: dict[str, dict]) -> SearchSpace:
        if not isinstance(table, dict):
            raise UserError(f"{where}: must be a table")
        entries: dict[str, Range | Choices | Fixed] = {}
        for name, value in table.items():
            if name not in specs:
                raise UserError(f"{where}: unknown hyperparameter {name!r}{closest(name, specs)}")
            spec, at = specs[name], f"{where} {name}"
            if isinstance(value, dict):
                entries[name] = _range(at, value, spec)
            elif isinstance(value, list):
                if not value:
                    raise UserError(f"{at}: an empty list of choices")
                entries[name] = Choices(tuple(check_value(at, v, spec) for v in value))
            else:
                entries[name] = Fixed(check_value(at, value, spec))
        for name, spec in specs.items():
            entries.setdefault(name, Fixed(spec["default"]))
        applies = {name: spec.get("methods") for name, spec in specs.items()}
        return cls(entries, applies, {name: spec["default"] for name, spec in specs.items()})

    def suggest(self, trial: optuna.Trial, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        """The value of every hyperparameter that applies to this trial's method (define-by-run);
        ``overrides`` are taken as they are, not suggested (the dense control)."""
        overrides = overrides or {}
        method = overrides.get("method") or self.entries["method"].suggest(trial, "method")
        values = {"method": method}
        for name, entry in self.entries.items():
            if name in values:
                continue
            if name in overrides:
                values[name] = overrides[name]
            elif self.applies(name, method):
                values[name] = entry.suggest(trial, name)
            # else: another method's knob, left out (not in the sampler's space, nor the record)
        return values

    def control_point(self) -> dict[str, Any]:
        """The dense control's hyperparameters, with nothing sampled: a value the study file
        fixes applies to it as to every trial, a searched one takes the trainer's default (lr
        3e-4, no distillation; not ``[startup]``'s). The reference every ratio is taken against
        so stays put from study to study. Only the knobs that apply to ``dense`` are kept, as
        ``suggest`` does."""
        values = {"method": "dense", "sparsity": 0.0}
        for name, entry in self.entries.items():
            if name not in values and self.applies(name, "dense"):
                values[name] = entry.value if isinstance(entry, Fixed) else self.defaults[name]
        return values

    def applies(self, name: str, method: str) -> bool:
        """Whether hyperparameter ``name`` is one of ``method``'s knobs (else it is left out of
        that method's trials, their record and the sampler's space)."""
        methods = self.applies_to.get(name)
        return methods is None or method in methods

    def sweep_point(self, method: str, index: int, **values: Any) -> dict[str, Any]:
        """Every hyperparameter of the ``index``-th start-up trial with ``method`` swept instead
        (its fixed values included, other methods' knobs left out, ``[startup]``'s settings for
        ``method``): a single-method sweep over the study's own spread, the study's start-up run
        on when it sweeps one method (``bench.frontier``)."""
        point = self.start_point(index, method)
        if point is None:
            raise ValueError("the study has no start-up sweep ([search] sparsity is not a linear range)")
        fixed = {name: entry.value for name, entry in self.entries.items() if isinstance(entry, Fixed)}
        point = {**fixed, **point, "method": method, **values}
        return {name: value for name, value in point.items() if self.applies(name, method)}

    def spread(self, name: str, index: int) -> float | None:
        """The ``index``-th of a sequence of values that cover ``name``'s range evenly at every
        length: its high end first, then the middle, the quarters, ... (van der Corput, base 2).
        A short study's first trials so span the whole range instead of a random cluster of it.
        None when ``name`` is not a float range."""
        entry = self.entries.get(name)
        if not isinstance(entry, Range) or entry.integer or entry.log or entry.step:
            return None
        fraction, denominator, i = 0.0, 1.0, index
        while i:
            denominator *= 2
            fraction += (i % 2) / denominator
            i //= 2
        return entry.high - (entry.high - entry.low) * fraction

    def for_model(self, layer_heads: Sequence[int]) -> SearchSpace:
        """This space for a model with these heads per layer: its start-up spread then gives
        every trial a head count no earlier start-up trial had (``start_sparsity``)."""
        return replace(self, total_heads=sum(layer_heads))

    def start_sparsity(self, index: int) -> float | None:
        """The ``index``-th start-up trial's sparsity: the even spread's, passing over a value that
        keeps as many heads as an earlier one did (the model's heads known, ``for_model``). A
        target is met exactly, to the head (``trainers.gates.heads_to_keep``), so such a value
        would run the earlier trial's size again: on the default study's 32 heads the plain
        spread repeats one from its 19th value and needs 32 to cover the 27 sizes; this takes
        27, and its first 18 are the plain spread's (smaller models part from it sooner: the
        smoke study's 8 heads at the 5th). Once every size has had its trial, the sizes come
        round again in the same order. A size of which the range holds only a sliver (under a
        16th of a head's width in sparsity, at an end of the range) may be passed over."""
        if not self.total_heads:
            return self.spread("sparsity", index)
        values = self._first_value_of_each_size()
        return values[index % len(values)] if values else None

    def start_sizes(self) -> int:
        """How many head counts the start-up spread reaches (0 while the model's heads are not
        known, or sparsity is not a linear range): the most start-up trials that each add a new
        size to the front (``orchestrator.runner.startup_trials``)."""
        return len(self._first_value_of_each_size()) if self.total_heads else 0

    def _first_value_of_each_size(self) -> list[float]:
        sizes: dict[int, float] = {}  # head count -> the first spread value that keeps it
        # A spread of 2^m values is a grid of the range's width / 2^m: with 2^m at least 16x
        # the heads, every size the range holds more than a sliver of is on it.
        scan = 2 ** math.ceil(math.log2(16 * self.total_heads))
        for i in range(scan):
            value = self.spread("sparsity", i)
            if value is None:
                return []
            sizes.setdefault(heads_to_keep(self.total_heads, value), value)
        return list(sizes.values())

    def start_point(self, index: int, method: str | None = None) -> dict[str, Any] | None:
        """Fixed values for the ``index``-th start-up trial, a sweep over sparsity: sparsity from
        the even spread, a new head count each (``start_sparsity``); the method
        ``startup_methods`` names, taken in turn when it names more than one, so that the front
        still gets a new size from every trial until each size has one (with two methods the
        spread's order gives the first the upper half of the range and the second the lower
        half, on the default study for its first 26 trials: list first the method for heavy
        pruning); ``method`` given, that one instead at every index, a single-method sweep
        (``sweep_point``); a setting ``[startup]`` names, where it applies to the trial's
        method, as it says; every other searched number at its default where its range holds
        it (the papers' values), every other list of choices at the default if listed, else its
        first entry. Put first the method you would sweep without a search (the default study:
        importance, BENCHMARKS.md), and in ``[startup]`` what a default does not get right for a
        pruned model (the default study: its learning rate). The sampler explores the other
        methods and numbers after the start-up. None when sparsity is not a float range or no
        searched method takes a target."""
        sparsity = self.start_sparsity(index)
        methods = self.startup_methods()
        if sparsity is None or not methods:
            return None
        method = method or methods[index % len(methods)]
        point: dict[str, Any] = {"sparsity": sparsity}
        for name, entry in self.entries.items():
            default = self.defaults.get(name)
            if name == "sparsity" or isinstance(entry, Fixed):  # a fixed value is every trial's
                continue
            if name == "method":
                point[name] = method
            elif name in self.startup and self.applies(name, method):
                point[name] = self.startup[name]
            elif entry.holds(default):
                point[name] = default
            elif isinstance(entry, Choices):
                point[name] = entry.options[0]
        return point

    def startup_methods(self) -> tuple[str, ...]:
        """The methods the start-up sweeps, in turn: ``[startup] method`` (one, or a list), else
        the first listed in ``[search] method`` that takes a sparsity target; none when none
        does. More than one shows the sampler each listed method's results before it models
        them (on the default study that measured a tie with importance alone; BENCHMARKS.md)."""
        if "method" in self.startup:
            listed = self.startup["method"]
            return (listed,) if isinstance(listed, str) else tuple(listed)
        methods = self.entries.get("method", Fixed(self.defaults.get("method"))).values()
        swept = [m for m in methods if self.applies("sparsity", m)]
        return tuple(swept[:1])

    def with_startup(self, where: str, table: Any, specs: dict[str, dict]) -> SearchSpace:
        """This space with ``[startup]``'s settings for the start-up sweep, checked against
        ``[search]``: each must be a value the sampler could have chosen (inside its range, among
        its choices, equal to a fixed value), so that TPE models the start-up's results like any
        other trial's, and must apply to one of the start-up's methods (``method`` may list
        several, each taking a sparsity target). Sparsity is the spread's, not a setting."""
        if not isinstance(table, dict):
            raise UserError(f"{where}: must be a table")
        values: dict[str, Any] = {}
        for name, value in table.items():
            if name not in specs:
                hint = "; the number of start-up trials is [study] startup_trials" if "trials" in name else ""
                raise UserError(f"{where}: unknown hyperparameter {name!r}{closest(name, specs)}{hint}")
            if name == "sparsity":
                raise UserError(f"{where} sparsity: the start-up spreads it over [search]'s range; remove it")
            if name == "method":
                listed = value if isinstance(value, list) else [value]
                if not listed:
                    raise UserError(f"{where} method: an empty list; name at least one method")
                values[name] = tuple(check_value(f"{where} method", m, specs[name]) for m in listed)
                twice = sorted({m for m in listed if listed.count(m) > 1})
                if twice:
                    raise UserError(f"{where} method: {twice[0]!r} listed twice; name each method once")
            else:
                values[name] = check_value(f"{where} {name}", value, specs[name])
        space = replace(self, startup=values)
        methods = space.startup_methods()
        sweeps = space.start_point(0) is not None
        for name in sorted(values, key=lambda n: n != "method"):  # the method first: the others apply to it
            at, entry = f"{where} {name}", self.entries[name]
            if name != "method" and methods and not any(self.applies(name, m) for m in methods):
                swept = _names(methods)
                raise UserError(f"{at}: does not apply to {swept}, the start-up's method(s); remove it")
            for value in values[name] if name == "method" else (values[name],):
                if name == "method" and not self.applies("sparsity", value):
                    raise UserError(f"{at}: {value!r} takes no sparsity target, which the start-up sweeps")
                if isinstance(entry, Fixed) and value != entry.value:
                    raise UserError(
                        f"{at}: {value!r}, but [search] gives every trial {entry.value!r}; set both alike "
                        f"(--set startup.{name}=...) or search {name}"
                    )
                if not entry.holds(value):
                    allowed = _describe(entry)
                    raise UserError(f"{at}: {value!r} is not a value [search] {name} allows ({allowed})")
            if not sweeps and not isinstance(entry, Fixed):
                raise UserError(
                    f"{at}: the study has no start-up sweep ([search] sparsity is not a linear range, or "
                    "no searched method takes a sparsity target); remove it"
                )
        return space

    def searched(self) -> list[str]:
        return [n for n, e in self.entries.items() if not isinstance(e, Fixed)]

    def check_reachable(self, where: str, heads_per_layer: list[int]) -> None:
        """The highest sparsity the space can ask for must leave min_heads_per_layer heads."""
        highest = max(self.entries["sparsity"].values())
        fewest = min(self.entries["min_heads_per_layer"].values())
        try:
            check_reachable(heads_per_layer, highest, fewest)
        except ValueError as err:
            raise UserError(f"{where} sparsity: {err}") from None
        # The first start-up trial asks for the highest sparsity with its own minimum per layer.
        first = self.start_point(0) or {}
        if "min_heads_per_layer" in first:
            try:
                check_reachable(heads_per_layer, first["sparsity"], first["min_heads_per_layer"])
            except ValueError as err:
                raise UserError(f"{where} sparsity, the start-up's first trial: {err}") from None


def _names(methods: tuple[str, ...]) -> str:
    return " or ".join(repr(m) for m in methods)


def _describe(entry: Range | Choices | Fixed) -> str:
    if isinstance(entry, Range):
        grid = f" in steps of {entry.step:g}" if entry.step else ""
        return f"{'integers ' if entry.integer else ''}from {entry.low:g} to {entry.high:g}{grid}"
    return f"one of {list(entry.values())}"


def _range(at: str, table: dict, spec: dict) -> Range:
    kind = spec.get("type") or type(spec.get("default"))
    if kind not in (int, float):
        raise UserError(f"{at}: a range needs a numeric hyperparameter; give a list of choices")
    for key in table:
        if key not in RANGE_KEYS:
            raise UserError(f"{at}: unknown range key {key!r}; use low, high, log, step")
    if "low" not in table or "high" not in table:
        raise UserError(f"{at}: a range needs both low and high")
    low, high = check_value(f"{at} low", table["low"], spec), check_value(f"{at} high", table["high"], spec)
    if low >= high:
        raise UserError(f"{at}: low {low} must be below high {high}")
    log = table.get("log", False)
    if not isinstance(log, bool):
        raise UserError(f"{at}: log must be true or false")
    if log and low <= 0:
        raise UserError(f"{at}: a log range needs low > 0")
    step = table.get("step")
    if step is not None and (
        isinstance(step, bool) or not isinstance(step, (int, float)) or not 0 < step < math.inf  # nan too
    ):
        raise UserError(f"{at}: step must be a positive number")
    if step is not None and step > high - low:
        raise UserError(f"{at}: step {step:g} is wider than the range ({high - low:g})")
    if step is not None and kind is int and not float(step).is_integer():
        raise UserError(f"{at}: the step of an integer range must be a whole number")
    if step is not None and log and not (kind is int and step == 1):
        raise UserError(f"{at}: a range takes log or step, not both")  # Optuna refuses them mid-run
    if step is not None and not math.isclose((high - low) / step, round((high - low) / step), abs_tol=1e-9):
        # Optuna would move high down to the grid, with a warning in the middle of the run
        raise UserError(f"{at}: high - low ({high - low:g}) must be a whole number of steps of {step:g}")
    return Range(float(low), float(high), log, step, integer=kind is int)
