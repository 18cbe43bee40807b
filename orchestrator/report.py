"""Looking at a study: its status, the front's hypervolume, plots, the dashboard note."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import optuna
import pandas as pd
from optuna.trial import FrozenTrial, TrialState

from orchestrator.errors import UserError
from orchestrator.export import Replicated, trials_over_seeds
from orchestrator.frontier import hypervolume, pareto_front
from orchestrator.records import TrialRecord, dense_control, perplexity_ratio, references_of
from trainers.atomic import write_atomically

SPARSITY_BANDS = ((0.0, 0.0), (0.0, 0.25), (0.25, 0.5), (0.5, 0.75), (0.75, 1.0))


def dense_reference(trials: list[FrozenTrial]) -> tuple[float, int] | None:
    """(perplexity, params) of the dense control, the point every front is measured against."""
    control = dense_control(trials)
    return (control.values[0], int(control.values[1])) if control else None


def normalised_hypervolume(points: list[tuple[float, float]], dense: tuple[float, int]) -> float:
    """Hypervolume with perplexity / dense and params / dense, reference (2 x dense ppl, dense params)."""
    scaled = [(ppl / dense[0], params / dense[1]) for ppl, params in points]
    return hypervolume(scaled, (2.0, 1.0))


@dataclass
class StudyStatus:
    name: str
    states: dict[str, int]
    target: int | None
    front_size: int
    best_by_band: list[BandBest]
    dense: tuple[float, int] | None
    hypervolume_history: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0
    remaining_s: float | None = None
    dense_checkpoint_ppl: float | None = None  # the pretrained model's own, before any trial
    dense_checkpoint_bpb: float | None = None
    stopped_early: int = 0  # PRUNED trials
    saved_steps: int = 0  # fine-tuning steps the stopped trials did not take
    stopped_budget_steps: int = 0  # fine-tuning steps they would have taken
    last_failure: tuple[int, str] | None = None  # (trial number, "Type: message")
    seed_spread: SeedSpread | None = None  # the front's replicates (launch-study replicate)


class BandBest(NamedTuple):
    """The trial of a sparsity band with the lowest validation perplexity (what the study
    selects by), and what it scores where nothing selected: the test split, and its ratio to the
    dense control's test score and to its matched reference's (``launch-study reference``)."""

    band: str
    val_perplexity: float
    trial: int
    bits_per_byte: float | None
    test_perplexity: float | None  # None: no test split
    lineage_steps: int | None
    vs_control: float | None  # test (else validation) perplexity / the dense control's
    vs_reference: float | None  # ... / its matched reference's; None: none recorded


@dataclass
class SeedSpread:
    """How much the front's points move from one seed to another (``launch-study replicate``)."""

    points: int  # front points measured at more than one seed
    seeds: tuple[int, int]  # the fewest and the most seeds of those points
    median_range: float  # a point's highest perplexity over its lowest, minus 1: the median point's
    widest: tuple[float, int]  # the same for the point that moves most, and its trial number
    off_front: list[int]  # trials that are not on the front when each point is taken at its mean
    dense: tuple[int, float, float, float] | None  # the dense control: seeds, mean, lowest, highest


def seed_spread(
    front: list[FrozenTrial], control: FrozenTrial | None, replicates: Replicated
) -> SeedSpread | None:
    """The front's spread over seeds, and the dense control's, or None while none of the front's
    points was replicated."""
    seeds = trials_over_seeds(front, replicates)
    measured = seeds["seeds"] > 1
    if not measured.any():
        return None
    ranges = (seeds["val_perplexity_max"] / seeds["val_perplexity_min"] - 1)[measured]
    widest = ranges.idxmax()
    dense = None
    if control is not None:
        row = trials_over_seeds([control], replicates).iloc[0]
        if row["seeds"] > 1:
            dense = (
                int(row["seeds"]),
                row["val_perplexity_mean"],
                row["val_perplexity_min"],
                row["val_perplexity_max"],
            )
    return SeedSpread(
        points=int(measured.sum()),
        seeds=(int(seeds["seeds"][measured].min()), int(seeds["seeds"].max())),
        median_range=float(ranges.median()),
        widest=(float(ranges[widest]), int(seeds["trial_number"][widest])),
        off_front=[int(n) for n in seeds["trial_number"][seeds["on_front_by_mean"].eq(False)]],
        dense=dense,
    )


def _in_band(sparsity: float, low: float, high: float) -> bool:
    """(low, high], or exactly low for the band (0, 0) of the dense models."""
    return sparsity == low if low == high else low < sparsity <= high


def study_status(study: optuna.Study, replicates: Replicated | None = None) -> StudyStatus:
    trials = study.get_trials(deepcopy=False)
    states: dict[str, int] = {}
    for t in trials:
        states[t.state.name] = states.get(t.state.name, 0) + 1
    done = sorted((t for t in trials if t.state == TrialState.COMPLETE), key=lambda t: t.datetime_complete)
    dense = dense_reference(done)
    control, references = dense_control(done), references_of(study)
    history: list[float] = []
    if dense:
        for i in range(1, len(done) + 1):
            history.append(normalised_hypervolume([(t.values[0], t.values[1]) for t in done[:i]], dense))
    best = []
    for low, high in SPARSITY_BANDS:
        band = [
            t
            for t in done
            if (low < t.user_attrs["sparsity"] <= high) or (low == high == t.user_attrs["sparsity"])
        ]
        if band:
            top = min(band, key=lambda t: t.values[0])
            label = "dense" if low == high else f"({low:.2f}, {high:.2f}]"
            best.append(band_best(label, top, control, references))
    started = [t.datetime_start for t in trials if t.datetime_start]
    finished = [t.datetime_complete for t in trials if t.datetime_complete]
    elapsed = (max(finished) - min(started)).total_seconds() if started and finished else 0.0
    target = study.user_attrs.get("n_trials_target")
    remaining = None
    if target and done:
        walls = [t.user_attrs.get("wall_seconds", 0.0) for t in done]
        concurrency = max(1, study.user_attrs.get("max_concurrent", 1))
        finished = len(done) + states.get(TrialState.PRUNED.name, 0)
        remaining = max(0, target - finished) * (sum(walls) / len(walls)) / concurrency
    front = pareto_front(done, key=lambda t: (t.values[0], t.values[1]))
    stopped = [t for t in trials if t.state == TrialState.PRUNED]
    return StudyStatus(
        study.study_name,
        states,
        target,
        len(front),
        best,
        dense,
        history,
        elapsed,
        remaining,
        dense_checkpoint_ppl=study.user_attrs.get("dense_val_perplexity"),
        dense_checkpoint_bpb=study.user_attrs.get("dense_bits_per_byte"),
        stopped_early=len(stopped),
        saved_steps=sum(t.user_attrs.get("saved_steps", 0) for t in stopped),
        stopped_budget_steps=sum(t.user_attrs.get("finetune_steps", 0) for t in stopped),
        last_failure=last_failure(trials),
        seed_spread=seed_spread(front, dense_control(done), replicates or Replicated.none()),
    )


def band_best(
    label: str, trial: FrozenTrial, control: FrozenTrial | None, references: dict[int, dict]
) -> BandBest:
    """``BandBest`` of ``trial``: its ratios on the test split where both sides have one, else on
    validation."""
    attrs = trial.user_attrs
    test = attrs.get("test_perplexity")
    vs_control = vs_reference = None
    if control is not None:
        their_test = control.user_attrs.get("test_perplexity")
        vs_control = perplexity_ratio(test, trial.values[0], their_test, control.values[0])
    reference = references.get(trial.number)
    if reference is not None:
        their = (reference["test_perplexity"], reference["val_perplexity"])
        vs_reference = perplexity_ratio(test, trial.values[0], *their)
    return BandBest(
        label, trial.values[0], trial.number, attrs.get("bits_per_byte"), test,
        attrs.get("lineage_steps"), vs_control, vs_reference,
    )  # fmt: skip


def last_failure(trials: list) -> tuple[int, str] | None:
    """The latest FAIL trial and why it failed, as recorded."""
    failed = [t for t in trials if t.state == TrialState.FAIL]
    if not failed:
        return None
    trial = failed[-1]
    return trial.number, trial.user_attrs.get("error", "no cause recorded")


def format_status(status: StudyStatus) -> str:
    lines = [f"study {status.name!r}"]
    states = ", ".join(f"{k.lower()} {v}" for k, v in sorted(status.states.items())) or "no trials"
    goal = f" (target: {status.target} finished, complete or pruned)" if status.target else ""
    lines.append(f"  trials: {states}{goal}")
    lines.append(f"  front: {status.front_size} trials")
    if status.dense_checkpoint_ppl is not None:
        ppl = status.dense_checkpoint_ppl
        bits = f", {status.dense_checkpoint_bpb:.4f} bits/byte" if status.dense_checkpoint_bpb else ""
        lines.append(f"  dense checkpoint: perplexity {ppl:.3f}{bits} (as pretrained, before any trial)")
    if status.dense:
        lines.append(f"  dense control: perplexity {status.dense[0]:.3f}, {status.dense[1]:,} parameters")
    if status.stopped_early:
        share = status.saved_steps / max(1, status.stopped_budget_steps)
        lines.append(
            f"  stopped early: {status.stopped_early} trials (PRUNED), {status.saved_steps:,} fine-tuning "
            f"steps saved ({share:.0%} of theirs)"
        )
    spread = status.seed_spread
    if spread:
        off = f"; off the front by their mean: trials {spread.off_front}" if spread.off_front else ""
        low, high = spread.seeds
        lines.append(
            f"  replicated: {spread.points} of the front's points, {low if low == high else f'{low}-{high}'} "
            "seeds each"
        )
        lines.append(
            f"  spread over seeds (highest / lowest perplexity - 1): {spread.median_range:.1%} at the "
            f"median point, {spread.widest[0]:.1%} at most (trial {spread.widest[1]}){off}"
        )
        if spread.dense:
            n, mean, lowest, highest = spread.dense
            lines.append(
                f"  dense control over {int(n)} seeds: perplexity {mean:.3f} (mean), "
                f"{lowest:.3f}-{highest:.3f}"
            )
    if any(best.test_perplexity is None for best in status.best_by_band):
        lines.append(
            "  no test split: the perplexities below are the validation split's, which the study selected on"
        )
    for best in status.best_by_band:
        bits = f", {best.bits_per_byte:.4f} bits/byte" if best.bits_per_byte is not None else ""
        scores = f"perplexity {best.val_perplexity:.3f}{bits}"
        if best.test_perplexity is not None:
            test = best.test_perplexity
            scores = f"test perplexity {test:.3f} (validation {best.val_perplexity:.3f}{bits})"
        ratios = ""
        if best.vs_control is not None and best.band != "dense":
            ratios = f"; {best.vs_control:.3f}x the dense control"
            if best.vs_reference is not None:
                ratios += f", {best.vs_reference:.3f}x its matched reference ({best.lineage_steps:,} steps)"
        lines.append(f"  best at sparsity {best.band:>13}: {scores} (trial {best.trial}){ratios}")
    if status.hypervolume_history:
        trail = " ".join(f"{h:.3f}" for h in status.hypervolume_history)
        latest = status.hypervolume_history[-1]
        lines.append(f"  hypervolume (normalised, ref 2 x dense ppl, dense params): {latest:.4f}")
        lines.append(f"  hypervolume after each complete trial: {trail}")
    lines.append(f"  elapsed: {status.elapsed_s / 60:.1f} min")
    if status.remaining_s is not None:
        lines.append(f"  estimated remaining: {status.remaining_s / 60:.1f} min")
    if status.last_failure:
        number, error = status.last_failure
        lines.append(f"  last failure: trial {number}: {error}")
    return "\n".join(lines)


def study_front_note(study: optuna.Study, replicates: Replicated | None = None) -> str:
    """``front_note`` of a study read whole (``launch-study replicate``, the end of a run)."""
    trials = study.get_trials(deepcopy=False)
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    front = pareto_front(done, key=lambda t: (t.values[0], t.values[1]))
    stopped = sum(t.state == TrialState.PRUNED for t in trials)
    return front_note(front, len(done), stopped, dense_control(done), replicates)


def front_note(
    front: list[FrozenTrial],
    complete: int,
    stopped: int,
    control: FrozenTrial | None,
    replicates: Replicated | None = None,
) -> str:
    """Markdown for the dashboard: the current front, one row per trial, with each point's
    perplexity over its seeds once ``launch-study replicate`` has measured them; ``complete``
    and ``stopped`` count the study's COMPLETE and PRUNED trials, ``control`` is its COMPLETE
    dense control (a driver passes what it keeps, ``study_trials.StudyTrials``)."""
    front = sorted(front, key=lambda t: t.values[1])
    seeds = trials_over_seeds(front, replicates or Replicated.none())
    replicated = bool(len(front)) and bool((seeds["seeds"] > 1).any())

    def method(trial: FrozenTrial) -> str:
        return "**dense control**" if trial.user_attrs.get("dense_control") else trial.user_attrs["method"]

    def over_seeds(i: int) -> str:
        row = seeds.iloc[i]
        if not replicated:
            return ""
        off = pd.notna(row["on_front_by_mean"]) and not row["on_front_by_mean"]
        mark = " (off the front by its mean)" if off else ""
        return (
            f" {row['val_perplexity_mean']:.3f} [{row['val_perplexity_min']:.3f}, "
            f"{row['val_perplexity_max']:.3f}], {row['seeds']} seeds{mark} |"
        )

    rows = [
        f"| {r.trial_number} | {method(t)} | {r.sparsity:.3f} | {r.val_perplexity:.3f} |{over_seeds(i)}"
        f" {r.bits_per_byte or float('nan'):.4f} | {r.n_params:,} | {r.heads_per_layer} |"
        for i, t in enumerate(front)
        for r in [TrialRecord.from_trial(t)]
    ]
    control_line = (
        [
            f"Dense control: trial {control.number}, val perplexity {control.values[0]:.3f} "
            "(nothing removed, nothing sampled: the reference of every ratio).",
            "",
        ]
        if control
        else []
    )
    return "\n".join(
        [
            f"## Pareto front ({len(front)} of {complete} complete trials)",
            "",
            *control_line,
            *([f"{stopped} trials stopped early by Pareto rank (PRUNED).", ""] if stopped else []),
            "| trial | method | sparsity | val perplexity |"
            + (" over seeds: mean [lowest, highest] |" if replicated else "")
            + " bits per byte | parameters | heads per layer |",
            "| --- | --- | --- | --- |" + (" --- |" if replicated else "") + " --- | --- | --- |",
            *rows,
        ]
    )


def plot_paths(output: Path) -> list[Path]:
    """The files ``plot_front`` writes: the front, and the head map beside it (PNG files when
    ``output`` has no suffix, as matplotlib would write them)."""
    output = output if output.suffix else output.with_suffix(".png")
    return [output, output.with_name(output.stem + "_heads" + output.suffix)]


def check_plot_format(output: Path) -> None:
    """``output``'s suffix, if it has one, is an image format matplotlib writes (checked before
    anything is written: matplotlib would say so only once the CSV is out)."""
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    if output.suffix and output.suffix.lstrip(".").lower() not in formats:
        shown = ", ".join(sorted(formats))
        raise UserError(f"--plot {output}: not an image format matplotlib writes (one of {shown})")


def plot_front(study: optuna.Study, output: Path) -> list[Path]:
    """The front PNG (perplexity against parameters, every trial in grey, the front as a line, one
    colour per method, the dense control starred) and a head map PNG beside it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    front = sorted(pareto_front(done, key=lambda t: (t.values[0], t.values[1])), key=lambda t: t.values[1])
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    ax.scatter(
        [t.values[1] for t in done], [t.values[0] for t in done], color="0.75", s=25, label="all trials"
    )
    ax.plot(
        [t.values[1] for t in front], [t.values[0] for t in front], color="0.2", lw=1, drawstyle="steps-post"
    )
    methods = sorted({t.user_attrs["method"] for t in front})
    colours = plt.get_cmap("tab10")
    for i, method in enumerate(methods):
        pts = [t for t in front if t.user_attrs["method"] == method]
        ax.scatter(
            [t.values[1] for t in pts],
            [t.values[0] for t in pts],
            color=colours(i),
            s=45,
            label=f"front: {method}",
            zorder=3,
        )
    dense = dense_reference(done)
    if dense:
        ax.scatter([dense[1]], [dense[0]], marker="*", s=220, color="black", label="dense control", zorder=4)
    spread = max(t.values[1] for t in done) / max(1, min(t.values[1] for t in done))
    if spread > 10:
        ax.set_xscale("log")
    ax.set_xlabel("parameters (physically pruned model)")
    ax.set_ylabel("validation perplexity")
    ax.set_title(f"{study.study_name}: perplexity against parameters")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    front_path, heads = plot_paths(output)
    save_figure(fig, front_path)
    plt.close(fig)
    _plot_head_maps(front, heads, plt, study.user_attrs.get("config", {}).get("model", {}).get("n_head"))
    return [front_path, heads]


def save_figure(fig, output: Path) -> None:
    """The figure at ``output`` (one of ``plot_paths``, so it has a suffix) in the format that
    suffix names, written whole or not at all."""
    write_atomically(output, lambda tmp: fig.savefig(tmp, format=output.suffix.lstrip(".")))


def _plot_head_maps(front: list[FrozenTrial], output: Path, plt, n_head: int | None) -> None:
    """One small layers x heads grid per front point: dark = kept, light = removed."""
    n = max(1, len(front))
    cols = min(4, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.6 * cols, 2.2 * rows), dpi=120, squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, t in zip(axes.flat, front):
        kept = t.user_attrs["kept_heads"]
        kept = json.loads(kept) if isinstance(kept, str) else kept
        n_heads = n_head or max(max(k) + 1 for k in kept if k)
        grid = [[1.0 if h in set(layer) else 0.0 for h in range(n_heads)] for layer in kept]
        ax.imshow(grid, cmap="Greys", vmin=-0.3, vmax=1.0, aspect="auto")
        ax.set_title(f"#{t.number} ppl {t.values[0]:.2f}\n{sum(map(len, kept))} heads", fontsize=7)
        ax.axis("on")
        ax.set_xticks([])
        ax.set_yticks(range(len(kept)))
        ax.tick_params(labelsize=6)
    fig.suptitle("heads kept (dark) per layer, front trials", fontsize=9)
    fig.tight_layout()
    save_figure(fig, output)
    plt.close(fig)
