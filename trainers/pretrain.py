"""Dense pretraining, done once per (corpus, model config, pretraining config) and cached on disk."""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from trainers.data import CharCorpus, eval_windows
from trainers.hparams import PretrainConfig
from trainers.model import LanguageModel, ModelConfig
from trainers.training import Progress, fit, mean_loss, pick_device


@dataclass(frozen=True)
class DenseCheckpoint:
    path: Path  # the state dict (load with weights_only=True)
    model_config: ModelConfig
    val_perplexity: float
    seconds: float  # time the pretraining took when it ran
    reused: bool  # True when this call found it on disk


def checkpoint_key(corpus_digest: str, model_cfg: ModelConfig, pretrain: PretrainConfig) -> str:
    blob = json.dumps(
        {"corpus": corpus_digest, "model": model_cfg.to_dict(), "pretrain": asdict(pretrain)},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def ensure_dense_checkpoint(
    corpus: CharCorpus,
    model_cfg: ModelConfig,
    pretrain: PretrainConfig,
    artifacts_dir: Path,
    *,
    eval_tokens: int,
    device: str = "auto",
    progress: Progress | None = None,
) -> DenseCheckpoint:
    """The cached dense model, training it first if no run has yet."""
    folder = Path(artifacts_dir) / "dense" / checkpoint_key(corpus.digest, model_cfg, pretrain)
    weights, meta_file = folder / "model.pt", folder / "meta.json"
    if weights.is_file() and meta_file.is_file():
        meta = json.loads(meta_file.read_text())
        return DenseCheckpoint(weights, model_cfg, meta["val_perplexity"], meta["seconds"], reused=True)

    torch.manual_seed(pretrain.seed)
    model = LanguageModel(model_cfg).to(pick_device(device))
    start = time.perf_counter()
    fit(
        model,
        corpus.train,
        steps=pretrain.steps,
        batch_size=pretrain.batch_size,
        lr=pretrain.lr,
        warmup_steps=pretrain.warmup_steps,
        weight_decay=pretrain.weight_decay,
        generator=torch.Generator().manual_seed(pretrain.seed),
        progress=progress,
        phase="pretrain",
    )
    seconds = time.perf_counter() - start
    ppl = math.exp(mean_loss(model, eval_windows(corpus.val, model_cfg.block_size, eval_tokens)))

    folder.mkdir(parents=True, exist_ok=True)
    # Write to temporary names, then rename: a run killed mid-write leaves no half checkpoint.
    tmp_weights, tmp_meta = folder / "model.pt.tmp", folder / "meta.json.tmp"
    torch.save({k: v.cpu() for k, v in model.state_dict().items()}, tmp_weights)
    meta = {
        "val_perplexity": ppl,
        "seconds": seconds,
        "model": model_cfg.to_dict(),
        "pretrain": asdict(pretrain),
        "corpus_digest": corpus.digest,
    }
    tmp_meta.write_text(json.dumps(meta, indent=2))
    os.replace(tmp_weights, weights)
    os.replace(tmp_meta, meta_file)
    return DenseCheckpoint(weights, model_cfg, ppl, seconds, reused=False)


def load_dense(checkpoint: DenseCheckpoint, device: torch.device) -> LanguageModel:
    model = LanguageModel(checkpoint.model_config)
    model.load_state_dict(torch.load(checkpoint.path, map_location="cpu", weights_only=True))
    return model.to(device)
