"""One trial: dense checkpoint -> prune -> remove heads physically -> fine-tune -> evaluate.

Or, warm-started (``TrialIO.parent``), the same from a larger model an earlier trial of the
study pruned and fine-tuned: iterative pruning (docs/methods.md, warm starts).

A trial is a plain function of (setup, hyperparameters, where its models go, its rungs): named
phases (``prepare``, ``choose_heads``, ``fine_tune``, ``score``, ``save``) passing a
``TrialInProgress`` along; it knows nothing of Optuna, Ray or databases and can be run and
tested alone.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from trainers.data import Corpus, eval_windows, rung_windows
from trainers.distillation import PeerDistillation
from trainers.export import WEIGHTS, CorruptModel, load_model, read_config, save_model
from trainers.families import PrunableModel
from trainers.gates import check_reachable, heads_to_keep
from trainers.hparams import TARGET_METHODS, TrialBudget, TrialHParams
from trainers.pretrain import DenseCheckpoint, load_dense
from trainers.pruning import PruneContext, PruneOutcome, plain_loss, prune
from trainers.training import (
    Learner,
    Progress,
    Schedule,
    final_scores,
    fit,
    mean_loss,
    pick_device,
    tokens_per_second,
)


@dataclass(frozen=True)
class TrialSetup:
    """What every trial of a study shares."""

    corpus: Corpus
    dense: DenseCheckpoint
    budget: TrialBudget
    seed: int = 0


@dataclass(frozen=True)
class RungReport:
    """The pruned model's validation perplexity part-way through its fine-tuning, for a
    scheduler that may stop the trial there (``run_trial``'s ``rungs``)."""

    rung: int  # index into the rungs
    step: int  # fine-tuning steps done
    steps: int  # fine-tuning steps in the trial's whole budget
    val_perplexity: float
    n_params: int
    cpu_seconds: float  # the trial's CPU time so far (see TrialResult.cpu_seconds)
    tokens: int = 0  # validation tokens scored (rung_windows): points scored on others do not compare


@dataclass
class TrialResult:
    val_perplexity: float  # per token of the study's tokenizer
    n_params: int  # of the physically pruned model
    n_params_nonembed: int
    sparsity: float  # achieved: heads removed / heads
    heads_per_layer: list[int]
    kept_heads: list[list[int]]
    method: str
    tokens_per_s: float  # inference throughput of the pruned model
    phase_seconds: dict[str, float] = field(default_factory=dict)
    curve: list[list[float]] = field(default_factory=list)  # [rung, fine-tuning step, perplexity]
    # CPU time of the trial's process while it ran (all its threads): what benchmarks at equal
    # compute count, since wall time depends on what else the machine runs. On a GPU it leaves
    # out the device's time.
    cpu_seconds: float = 0.0
    # The validation text's bits per byte: unlike perplexity, comparable across tokenizers.
    bits_per_byte: float = 0.0
    # The test split's scores (None: the corpus has none). Nothing selects on them: the study
    # chooses by validation and reports both (trainers/data.py).
    test_perplexity: float | None = None
    test_bits_per_byte: float | None = None
    # The training this model has had since the dense checkpoint, its parents' first: one entry
    # per trial, {"lr": peak rate, "steps": [weight-training steps of each phase]} (a phase is
    # one warm-up-free cosine schedule). What a matched dense reference replays
    # (trainers/reference.py); None: a parent saved by a version that did not record it.
    lineage: list[dict] | None = None
    lineage_steps: int | None = None  # all the steps of ``lineage``

    def to_dict(self) -> dict:
        return asdict(self)


AFTER_PRUNE = "after_prune"  # the checkpoint a retried trial resumes from


class TransientTrialError(RuntimeError):
    """A failure that running the same trial again may not meet (a resource that was busy, a
    file another process was writing). Everything else a trial raises is deterministic: the same
    configuration fails the same way, so it is recorded and not retried."""


# What the orchestrator retries besides a worker that died: a GPU's memory is shared with the
# other trials on it, so running out of it says more about them than about this trial.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (TransientTrialError, torch.cuda.OutOfMemoryError)


def _resume_point(dirs: list[Path], hp: TrialHParams, identity: dict, device: torch.device):
    """(model, outcome, seconds, batch generator state) saved after the pruning phase by an
    earlier try of this trial, so the retry continues exactly where that one was. Only a
    checkpoint of the same trial counts: the same hyperparameters, and the same seed and dense
    model (``identity``), since a folder may hold a trial of an earlier study of that name."""
    for folder in dirs:
        checkpoint = folder / AFTER_PRUNE
        if not checkpoint.is_dir():
            continue
        try:  # a checkpoint cut short or altered is not resumed from: the pruning is redone
            meta = read_config(checkpoint)
            if meta.get("hparams") != hp.to_dict() or _without_paths(meta.get("identity")) != identity:
                continue
            model, _ = load_model(checkpoint, device=str(device))
        except CorruptModel:
            continue
        outcome = PruneOutcome(meta["keep"], None, meta["trained_steps"])  # scale is already folded in
        generator_state = torch.tensor(meta["generator_state"], dtype=torch.uint8)
        return model.train(), outcome, meta["prune_seconds"], generator_state
    return None


def _without_paths(recorded: dict | None) -> dict | None:
    """A recorded identity as this version writes it: earlier ones also named the dense model's
    and the parent's folders, which their weights' digests (kept) identify better."""
    if not isinstance(recorded, dict):
        return recorded
    return {key: value for key, value in recorded.items() if key not in ("dense", "parent")}


@dataclass(frozen=True)
class Parent:
    """A warm start: the pruned, fine-tuned model an earlier trial saved (``save_dir``)."""

    model: torch.nn.Module
    kept_heads: list[list[int]]  # its heads, as indices of the dense model's
    identity: dict  # what a retry's checkpoint must match: the folder and its weights
    lineage: list[dict] | None = None  # its training since the dense model (TrialResult.lineage)


def check_parent(folder: Path, dense_weights: str | None, verify: bool = True) -> dict:
    """The config of a model folder a trial may start from, or a ``ValueError`` naming the folder
    and what is wrong: files cut short or altered (``CorruptModel``; ``verify=False``: the caller
    has just checked them), or a model not pruned from the dense checkpoint whose weights' digest
    is ``dense_weights`` (another study's, another dense model's, or saved by a version that did
    not record its heads)."""
    meta = read_config(folder, verify)
    if meta.get("dense_weights") != dense_weights or not isinstance(meta.get("kept_heads"), list):
        raise ValueError(f"{folder}: not a model pruned from this study's dense checkpoint")
    return meta


def load_parent(folder: Path, dense_heads: list[int], digest: str | None, device: torch.device) -> Parent:
    """The model a trial saved in ``folder``, pruned from the dense model whose weights' digest is
    ``digest`` (``check_parent``), its heads a subset of ``dense_heads``, layer by layer."""
    model, _ = load_model(folder, device=str(device))  # its files checked against their checksums
    meta = check_parent(folder, digest, verify=False)  # so not hashed a second time here
    kept = meta["kept_heads"]
    sizes_match = [len(k) for k in kept] == list(model.cfg.layer_heads)
    if not sizes_match or any(len(k) > n or max(k, default=0) >= n for k, n in zip(kept, dense_heads)):
        raise ValueError(f"{folder}: its kept heads do not fit the dense model's {dense_heads}")
    # By content, not by path: a node of a cluster reads the parent from a cache of its own.
    identity = {"parent_weights": meta["sha256"][WEIGHTS]}
    return Parent(model.train(), kept, identity, meta.get("lineage"))


def target_from(parent_heads: list[int], dense_heads: list[int], hp: TrialHParams) -> TrialHParams:
    """``hp`` for pruning a parent that keeps ``parent_heads``: ``sparsity`` is a fraction of the
    dense model's heads, so the heads removed from the parent are those the target keeps fewer
    of. A parent keeping no more heads than the target is a ``ValueError``: nothing to remove."""
    if hp.method not in TARGET_METHODS:
        raise ValueError(f"method {hp.method!r} takes no sparsity target: it cannot start from a parent")
    keep, have = heads_to_keep(sum(dense_heads), hp.sparsity), sum(parent_heads)
    if keep >= have:
        raise ValueError(f"the parent keeps {have} heads, the target {keep}: nothing to remove")
    return replace(hp, sparsity=1.0 - keep / have)


def dense_weights(dense: DenseCheckpoint) -> str | None:
    """The digest of the dense checkpoint's weights: a checkpoint found corrupt and trained again
    at the same path is another model."""
    return read_config(dense.path, verify=False).get("sha256", {}).get(WEIGHTS)


def evaluation_windows(setup: TrialSetup) -> tuple[torch.Tensor, torch.Tensor]:
    """The study's evaluation slice, the same for every trial: a trial's final perplexity
    scores all of it, a rung ``rung_windows`` of it."""
    return eval_windows(setup.corpus.val, setup.dense.model_config.block_size, setup.budget.eval_tokens)


def lineage_steps(lineage: list[dict]) -> int:
    """The weight updates of a lineage (``TrialResult.lineage``): every phase of every entry."""
    return sum(sum(entry["steps"]) for entry in lineage)


def test_windows(setup: TrialSetup) -> tuple[torch.Tensor, torch.Tensor]:
    """The test split's slice, as large as the validation one (``eval_tokens``); scored once,
    at a trial's end, and read by no choice the study makes."""
    if setup.corpus.test is None:
        raise ValueError("the corpus has no test split")
    return eval_windows(setup.corpus.test, setup.dense.model_config.block_size, setup.budget.eval_tokens)


@dataclass(frozen=True)
class TrialIO:
    """Where a trial's models go and come from, and who hears of its progress. With
    ``save_dir``, the pruned model is written there, and a checkpoint after pruning that a retry
    (``resume_dirs``: earlier attempts' folders) continues from. With ``parent`` (a ``save_dir``
    of an earlier trial on the same dense checkpoint, ``load_parent``), the trial starts from that
    model and removes heads from those it kept, down to the same target; distillation's teacher
    stays the dense model. ``on_checkpoint`` is given each folder written under ``save_dir`` as
    soon as it is whole (the after-pruning checkpoint; the caller handles the model itself): a
    worker uploads it to an object store there."""

    save_dir: Path | None = None
    resume_dirs: Sequence[Path] = ()
    parent: Path | None = None
    on_checkpoint: Callable[[Path], None] | None = None
    progress: Progress | None = None


@dataclass(frozen=True)
class RungPlan:
    """When a trial is scored before its end, and who is told. At each fraction of the
    fine-tuning budget (counted in weight updates since the trial began, ``prune_steps +
    fraction x finetune_steps``: the same for every method) the validation slice is scored
    (``eval_tokens`` of it, spread over it; 0: all) and passed to ``report`` (which may never
    return: a scheduler stopping the trial)."""

    fractions: Sequence[float] = ()
    report: Callable[[RungReport], None] | None = None
    eval_tokens: int = 0


@dataclass
class TrialInProgress:
    """What each phase of a trial leaves to the next."""

    setup: TrialSetup
    hp: TrialHParams
    io: TrialIO
    cpu_start: float
    generator: torch.Generator
    loss_fn: Callable
    identity: dict  # what a retry must match to resume (the dense weights, the seed, the budget)
    model: PrunableModel  # the dense model, the parent, then the pruned one
    prune_hp: TrialHParams  # as ``hp``, the target taken from the parent's size when warm-started
    started_from: list[list[int]]  # the dense model's heads the model holds, per layer
    lineage: list[dict] | None  # None: a parent of a version that recorded none
    device: torch.device
    outcome: PruneOutcome | None = None
    seconds: dict[str, float] = field(default_factory=dict)


@dataclass
class FineTuned:
    steps: int  # weight updates of the fine-tuning
    curve: list[list[float]]  # [rung, step, perplexity] at each rung reached
    n_params: int
    n_params_nonembed: int


@dataclass
class Scores:
    val_perplexity: float
    bits_per_byte: float
    test_perplexity: float | None
    test_bits_per_byte: float | None
    tokens_per_s: float


def run_trial(
    setup: TrialSetup, hp: TrialHParams, io: TrialIO = TrialIO(), rungs: RungPlan = RungPlan()
) -> TrialResult:
    """Prepare, choose the heads (and remove them), fine-tune with rungs, score, save."""
    trial = prepare(setup, hp, io)
    choose_heads(trial)
    tuned = fine_tune(trial, rungs)
    return save(trial, tuned, score(trial))


def prepare(setup: TrialSetup, hp: TrialHParams, io: TrialIO) -> TrialInProgress:
    """The device, the seeded batches, the model the trial starts from (the dense model or its
    parent) and the loss (with peer distillation, the dense model as teacher); a target that
    cannot be reached fails here, before any training."""
    cpu_start = time.process_time()
    heads = list(setup.dense.model_config.layer_heads)
    if hp.method in TARGET_METHODS:
        check_reachable(heads, hp.sparsity, hp.min_heads_per_layer)
    device = pick_device(setup.budget.device)
    torch.manual_seed(setup.seed)
    # Every trial draws the same batches: differences between trials come from hyperparameters.
    generator = torch.Generator().manual_seed(setup.seed)
    dense = load_dense(setup.dense, device) if io.parent is None or hp.distill else None
    loss_fn = PeerDistillation(dense, hp.distill_layer, hp.distill_logit) if hp.distill else plain_loss
    identity = {  # the dense model by its weights' digest: on a cluster each node has its own copy
        "seed": setup.seed,
        "dense_weights": dense_weights(setup.dense),
        "budget": asdict(setup.budget),
    }
    trial = TrialInProgress(
        setup,
        hp,
        io,
        cpu_start,
        generator,
        loss_fn,
        identity,
        dense,
        hp,
        [list(range(n)) for n in heads],
        [],
        device,
    )
    if io.parent is not None:
        warm = load_parent(Path(io.parent), heads, identity["dense_weights"], device)
        trial.model, trial.started_from, trial.lineage = warm.model, warm.kept_heads, warm.lineage
        trial.prune_hp = target_from(list(warm.model.cfg.layer_heads), heads, hp)
        identity.update(warm.identity)
    return trial


def choose_heads(trial: TrialInProgress) -> None:
    """The method chooses the heads to keep and they are removed, or an earlier attempt's
    choice is resumed; with ``save_dir``, the pruned model is checkpointed for a retry."""
    setup, budget, io = trial.setup, trial.setup.budget, trial.io
    resumed = _resume_point([Path(d) for d in io.resume_dirs], trial.hp, trial.identity, trial.device)
    if resumed:
        trial.model, trial.outcome, trial.seconds["prune"], generator_state = resumed
        trial.generator.set_state(generator_state)
        trial.seconds["prune_resumed"] = 1.0
    else:
        start = time.perf_counter()
        context = PruneContext(
            trial.model,
            setup.corpus.train,
            trial.prune_hp,
            steps=budget.prune_steps,
            batch_size=budget.batch_size,
            generator=trial.generator,
            loss_fn=trial.loss_fn,
            progress=io.progress,
        )
        trial.outcome = prune(context)
        trial.model = trial.model.prune_heads(trial.outcome.keep, trial.outcome.head_scale)
        trial.seconds["prune"] = time.perf_counter() - start
    if io.save_dir is not None:  # a resumed trial keeps one too: a retry of the retry resumes from it
        meta = {
            "hparams": trial.hp.to_dict(),
            "identity": trial.identity,
            "keep": trial.outcome.keep,
            "trained_steps": trial.outcome.trained_steps,
            "prune_seconds": trial.seconds["prune"],
            "generator_state": trial.generator.get_state().tolist(),
        }
        save_model(trial.model, setup.corpus.tokenizer, Path(io.save_dir) / AFTER_PRUNE, extra=meta)
        if io.on_checkpoint is not None:
            io.on_checkpoint(Path(io.save_dir) / AFTER_PRUNE)


def fine_tune(trial: TrialInProgress, rungs: RungPlan) -> FineTuned:
    """The pruned model trained at the trial's rate, scored at each rung on the way."""
    setup, budget, model, outcome = trial.setup, trial.setup.budget, trial.model, trial.outcome
    start = time.perf_counter()
    # Methods that trained no weights while pruning get those steps here: equal budgets for all.
    steps = budget.finetune_steps + budget.prune_steps - outcome.trained_steps
    scored_at_rungs = rung_windows(evaluation_windows(setup), rungs.eval_tokens)
    total, nonembed = model.count_parameters()  # fixed once the heads are removed
    curve: list[list[float]] = []
    rung_at: dict[int, int] = {}  # fine-tuning step -> rung (two rungs on one step: the first)
    for rung, fraction in enumerate(rungs.fractions):
        # Every method's weights have had as many updates at a rung: prune_steps + fraction x
        # finetune_steps since the trial began. As a fraction of each trial's own fine-tuning, a
        # gated method (100 updates while choosing) met importance (none) after 133 updates to 44.
        # A fraction below 1 that rounding (a tiny fine-tuning budget) puts on the last step or
        # past it is dropped: it would judge a trial that has done all its training, and could
        # record it PRUNED. A caller asking for 1 (a score of the model the trial ends with) gets it.
        step = round(budget.prune_steps + fraction * budget.finetune_steps) - outcome.trained_steps
        if 1 <= step < steps or (fraction >= 1 and step == steps):
            rung_at.setdefault(step, rung)

    def at_rung(step: int) -> bool:
        if step in rung_at:
            ppl = math.exp(mean_loss(model, scored_at_rungs))
            curve.append([rung_at[step], step, ppl])
            if rungs.report is not None:
                cpu = time.process_time() - trial.cpu_start
                tokens = scored_at_rungs[1].numel()
                rungs.report(RungReport(rung_at[step], step, steps, ppl, total, cpu, tokens))
        return False

    if steps:
        fit(
            model,
            setup.corpus.train,
            trial.generator,
            Schedule(steps, budget.batch_size, trial.hp.lr, phase="finetune"),
            Learner(loss_fn=trial.loss_fn),
            progress=trial.io.progress,
            after_step=at_rung if rung_at else None,
        )
    trial.seconds["finetune"] = time.perf_counter() - start
    return FineTuned(steps, curve, total, nonembed)


def score(trial: TrialInProgress) -> Scores:
    """Validation (and test, where the corpus has a split for it) perplexity and bits per byte,
    and the model's speed."""
    setup, model = trial.setup, trial.model
    start = time.perf_counter()
    windows = evaluation_windows(setup)
    ppl, bpb = final_scores(model, windows, setup.corpus.tokenizer)
    test_ppl = test_bpb = None
    if setup.corpus.test is not None:
        test_ppl, test_bpb = final_scores(model, test_windows(setup), setup.corpus.tokenizer)
    speed = tokens_per_second(model, windows[0][: setup.budget.batch_size])
    trial.seconds["eval"] = time.perf_counter() - start
    return Scores(ppl, bpb, test_ppl, test_bpb, speed)


def save(trial: TrialInProgress, tuned: FineTuned, scores: Scores) -> TrialResult:
    """The trial's lineage extended, its model written (with ``save_dir``), its result."""
    hp, outcome, io = trial.hp, trial.outcome, trial.io
    lineage = trial.lineage
    if lineage is not None:
        phases = [n for n in (outcome.trained_steps, tuned.steps) if n]
        lineage = [*lineage, {"lr": hp.lr, "steps": phases}]
    started_from = trial.started_from
    kept_heads = [[started_from[layer][i] for i in sorted(k)] for layer, k in enumerate(outcome.keep)]
    if io.save_dir is not None:
        extra = {
            "hparams": hp.to_dict(),
            "val_perplexity": scores.val_perplexity,
            "bits_per_byte": scores.bits_per_byte,
            "lineage": lineage,
        }
        if scores.test_perplexity is not None:
            extra.update(test_perplexity=scores.test_perplexity, test_bits_per_byte=scores.test_bits_per_byte)
        # what a later trial warm-started from this one checks (load_parent)
        extra.update(kept_heads=kept_heads, dense_weights=trial.identity["dense_weights"])
        if io.parent is not None:
            extra["parent_weights"] = trial.identity["parent_weights"]
        save_model(trial.model, trial.setup.corpus.tokenizer, io.save_dir, extra=extra)
    n_kept = sum(len(k) for k in outcome.keep)
    heads = trial.setup.dense.model_config.layer_heads
    return TrialResult(
        val_perplexity=scores.val_perplexity,
        bits_per_byte=scores.bits_per_byte,
        n_params=tuned.n_params,
        n_params_nonembed=tuned.n_params_nonembed,
        sparsity=1.0 - n_kept / sum(heads),
        heads_per_layer=[len(k) for k in outcome.keep],
        kept_heads=kept_heads,
        method=hp.method,
        tokens_per_s=scores.tokens_per_s,
        phase_seconds=trial.seconds,
        curve=tuned.curve,
        cpu_seconds=time.process_time() - trial.cpu_start,
        test_perplexity=scores.test_perplexity,
        test_bits_per_byte=scores.test_bits_per_byte,
        lineage=lineage,
        lineage_steps=None if lineage is None else lineage_steps(lineage),
    )
