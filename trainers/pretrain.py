"""Dense pretraining, done once per (corpus, model config, pretraining config) and cached on disk."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from trainers.data import Corpus, eval_windows
from trainers.export import CONFIG, CorruptModel, load_model, read_config, save_model
from trainers.families import FamilyConfig, PrunableModel, build_model
from trainers.hparams import PretrainConfig
from trainers.training import Progress, Schedule, final_scores, fit, mean_loss, pick_device


@dataclass(frozen=True)
class DenseCheckpoint:
    path: Path  # the model's folder (trainers/export.py's format), absolute
    model_config: FamilyConfig
    val_perplexity: float
    seconds: float  # time the pretraining took when it ran
    reused: bool  # True when this call found it on disk
    bits_per_byte: float | None = None  # None: a checkpoint written before it was measured


def checkpoint_key(
    corpus_digest: str, model_cfg: FamilyConfig, pretrain: PretrainConfig | None, source: str = ""
) -> str:
    """Names the cached dense model; ``source`` identifies the weights a pretrained model (a
    user's folder) starts from, and is left out when empty so built-in keys stay as they were."""
    named = {"corpus": corpus_digest, "model": model_cfg.to_dict()}
    named["pretrain"] = asdict(pretrain) if pretrain is not None else None
    if source:
        named["source"] = source
    blob = json.dumps(named, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class UntilConverged:
    """Warm-up, a constant learning rate until the validation loss plateaus, then a linear
    cool-down to zero (``PretrainConfig`` says the rule). ``lr_at`` and ``after_step`` plug into
    ``fit``; ``curve`` keeps (step, validation loss) of every evaluation."""

    def __init__(self, cfg: PretrainConfig, evaluate: Callable[[], float]) -> None:
        self.cfg, self.evaluate = cfg, evaluate
        self.curve: list[tuple[int, float]] = []
        self.converged_at: int | None = None  # steps when the rule fired (or the cap was reached)
        self.total: int | None = None  # steps including the cool-down, once known

    def lr_at(self, step: int) -> float:
        cfg = self.cfg
        if step < cfg.warmup_steps:
            return cfg.lr * (step + 1) / cfg.warmup_steps
        if self.converged_at is None:
            return cfg.lr
        return cfg.lr * max(0.0, (self.total - step) / (self.total - self.converged_at))

    def plateaued(self) -> bool:
        """Relative improvement over the last ``converge_window`` steps below the tolerance."""
        step, loss = self.curve[-1]
        earlier = [value for at, value in self.curve if at <= step - self.cfg.converge_window]
        return bool(earlier) and (earlier[-1] - loss) < self.cfg.converge_tolerance * earlier[-1]

    def after_step(self, step: int) -> bool:
        cfg = self.cfg
        if self.converged_at is not None:
            if step >= self.total:
                self.curve.append((step, self.evaluate()))
                return True
            return False
        if step % cfg.eval_every == 0 or step >= cfg.steps:
            self.curve.append((step, self.evaluate()))
            if step >= cfg.steps or self.plateaued():
                self.converged_at = step
                self.total = step + max(1, round(cfg.cooldown * step))
        return False

    @property
    def max_steps(self) -> int:
        """An upper bound for ``fit``'s loop: the cap and its cool-down."""
        return self.cfg.steps + max(1, round(self.cfg.cooldown * self.cfg.steps))


def _read_checkpoint(
    folder: Path, model_cfg: FamilyConfig, notice: Callable[[str], None]
) -> DenseCheckpoint | None:
    """The checkpoint in ``folder``, if there is a sound one (checksums verified); its path
    absolute, since trial workers run in folders of Ray's. A corrupt one is reported and
    ignored: the caller trains it again rather than fail every trial on it."""
    if not folder.is_dir():
        return None
    try:
        meta = read_config(folder)
    except CorruptModel as err:
        notice(f"dense checkpoint not used: {err}")
        return None
    # Whole, but not written by pretraining (an exported trial copied in by hand, say).
    missing = [key for key in ("val_perplexity", "seconds") if not isinstance(meta.get(key), (int, float))]
    if missing:
        notice(f"dense checkpoint not used: {folder / CONFIG} records no {missing[0]}")
        return None
    return DenseCheckpoint(
        folder.resolve(),
        model_cfg,
        meta["val_perplexity"],
        meta["seconds"],
        reused=True,
        bits_per_byte=meta.get("bits_per_byte"),
    )


def ensure_dense_checkpoint(
    corpus: Corpus,
    model_cfg: FamilyConfig,
    pretrain: PretrainConfig | None,
    artifacts_dir: Path,
    *,
    eval_tokens: int,
    device: str = "auto",
    progress: Progress | None = None,
    shipped_dir: Path | None = None,
    notice: Callable[[str], None] = lambda message: None,
    initial: Callable[[], PrunableModel] | None = None,
    source: str = "",
) -> DenseCheckpoint:
    """The cached dense model: under ``artifacts_dir``, else one shipped for this very key in
    ``shipped_dir`` (the study file's ``checkpoints/``), else made now and cached: ``initial()``
    (default: a fresh model of ``model_cfg``; a user's pretrained model, whose weights
    ``source`` names) trained by ``pretrain``, or only scored when ``pretrain`` is None."""
    key = checkpoint_key(corpus.digest, model_cfg, pretrain, source)
    folder = Path(artifacts_dir) / "dense" / key
    for candidate in (folder, Path(shipped_dir) / key if shipped_dir else None):
        found = candidate and _read_checkpoint(candidate, model_cfg, notice)
        if found:
            return found

    torch.manual_seed(pretrain.seed if pretrain else 0)
    model = (initial or (lambda: build_model(model_cfg)))().to(pick_device(device))
    windows = eval_windows(corpus.val, model_cfg.block_size, eval_tokens)
    schedule = None
    if pretrain is not None and pretrain.until_converged:
        schedule = UntilConverged(pretrain, lambda: mean_loss(model, windows))
    start = time.perf_counter()
    if pretrain is not None:
        _pretrain(model, corpus, pretrain, schedule, progress)
    seconds = time.perf_counter() - start
    ppl, bpb = final_scores(model, windows, corpus.tokenizer)

    meta = {
        "val_perplexity": ppl,
        "bits_per_byte": bpb,
        "seconds": seconds,
        "pretrain": asdict(pretrain) if pretrain is not None else None,
        "corpus_digest": corpus.digest,
        "source": source,
    }
    if schedule:
        meta |= {
            "converged_at": schedule.converged_at,
            "steps_trained": schedule.total,
            "curve": schedule.curve,  # (step, validation loss)
        }
    save_model(model, corpus.tokenizer, folder, extra=meta)  # checksummed, renamed into place
    return DenseCheckpoint(folder.resolve(), model_cfg, ppl, seconds, reused=False, bits_per_byte=bpb)


def _pretrain(
    model: PrunableModel,
    corpus: Corpus,
    pretrain: PretrainConfig,
    schedule: UntilConverged | None,
    progress: Progress | None,
) -> None:
    fit(
        model,
        corpus.train,
        torch.Generator().manual_seed(pretrain.seed),
        Schedule(
            steps=schedule.max_steps if schedule else pretrain.steps,
            batch_size=pretrain.batch_size,
            lr=pretrain.lr,
            warmup_steps=pretrain.warmup_steps,
            weight_decay=pretrain.weight_decay,
            phase="pretrain",
            lr_at=schedule.lr_at if schedule else None,
        ),
        progress=progress,
        after_step=schedule.after_step if schedule else None,
    )


def load_dense(checkpoint: DenseCheckpoint, device: torch.device) -> PrunableModel:
    model, _ = load_model(checkpoint.path, device=str(device))
    return model.train()
