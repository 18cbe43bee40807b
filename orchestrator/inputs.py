"""What a study trains on, prepared before its database is touched and shared by every command
that trains for it (run, replicate, reference): the corpus tokenized, the model's config (by
its family), and the dense checkpoint (cached, shipped beside the study file, a user's model,
or pretrained now; on an object store, read and written through this machine's cache)."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

from orchestrator.artifacts import (
    fetch,
    is_remote,
    join,
    local_cache,
    publish,
    stored_digest,
)
from orchestrator.config import StudyConfig, user_model
from orchestrator.errors import UserError
from orchestrator.progress import say
from trainers.data import Corpus, CorpusError
from trainers.export import WEIGHTS, CorruptModel, read_config
from trainers.families import FamilyConfig, family
from trainers.pretrain import DenseCheckpoint, checkpoint_key, ensure_dense_checkpoint


def prepare_inputs(cfg: StudyConfig, cache_dir: Path | None = None) -> tuple[Corpus, FamilyConfig]:
    """Everything that can be checked before the database is touched: the corpus tokenized (ids
    and a trained BPE cached under ``cache_dir``) and the model's config (a user's model's
    config read, not its weights), each by the model's family."""
    where = f"{cfg.source}: [model]"
    model_family = family(cfg.model["family"])
    starts_from = user_model(cfg)
    if starts_from:  # read and checked before anything is tokenized
        try:
            model_family.check_user_model(starts_from, cfg.model["block_size"])
        except ValueError as err:
            raise UserError(f"{where} {err}") from None
    try:
        corpus = Corpus.load(
            **cfg.corpus.load_kwargs(cfg.source.parent),
            block_size=cfg.model["block_size"],
            model_path=starts_from,
            cache_dir=cache_dir,
        )
    except CorpusError as err:
        raise UserError(f"{cfg.source}: [corpus] {err}") from None
    except OSError as err:  # the cache folder (the pre-flight checks --artifacts before this)
        raise UserError(f"{cfg.source}: [corpus] cannot write its cache under {cache_dir}: {err}") from None
    try:
        model_cfg = model_family.model_config(cfg.model, corpus.vocab_size, starts_from)
    except ValueError as err:
        raise UserError(f"{where} {err}") from None
    if model_cfg.vocab_size < corpus.vocab_size:
        hint = (
            "the tokenizer beside the model does not belong to it"
            if cfg.corpus.tokenizer == "model"
            else "use [corpus] tokenizer = 'model', the model's own"
        )
        raise UserError(
            f"{where} the model's vocabulary ({model_cfg.vocab_size}) is smaller than the tokenizer's "
            f"({corpus.vocab_size}): {hint}"
        )
    cfg.search.check_reachable(f"{cfg.source}: [search]", list(model_cfg.layer_heads))
    floor = model_family.min_heads_per_layer
    if min(cfg.search.entries["min_heads_per_layer"].values()) < floor:
        raise UserError(
            f"{cfg.source}: [search] min_heads_per_layer: the {model_family.name} family keeps at least "
            f"{floor} head a layer"
        )
    return corpus, model_cfg


def corpus_cache(artifacts: str) -> Path:
    """Where the corpus's trained BPE and token ids are cached: under a local ``--artifacts``,
    in this machine's cache for an object store (they are made again from the corpus at will)."""
    return local_cache() / "corpus" if is_remote(artifacts) else Path(artifacts) / "cache"


def dense_location(artifacts: str, dense: DenseCheckpoint) -> str:
    """Where the dense checkpoint is stored: ``<artifacts>/dense/<key>`` (its folder's name is
    its key wherever it was found)."""
    return join(artifacts, "dense", dense.path.name)


def _pull_dense(location: str, folder: Path) -> bool:
    """The store's dense checkpoint for this key into this machine's cache (``folder``, where
    ``ensure_dense_checkpoint`` finds it), unless a sound copy of the same weights is there.
    The store's copy wins over another one cached here (made for another store, say). Returns
    whether the store holds a sound copy: False for none, or one that fails its checksums,
    which the caller then replaces."""
    digest = stored_digest(location)
    if digest is None:
        return False
    with contextlib.suppress(CorruptModel, KeyError):
        if read_config(folder)["sha256"][WEIGHTS] == digest:
            return True
    try:
        downloaded = fetch(location)
    except CorruptModel as err:
        say(f"dense checkpoint on the store not used: {err}")
        return False
    shutil.rmtree(folder, ignore_errors=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    downloaded.rename(folder)
    return True


def study_dense_checkpoint(
    cfg: StudyConfig, corpus: Corpus, model_cfg: FamilyConfig, artifacts: str | Path, progress=None
) -> DenseCheckpoint:
    """The study's dense checkpoint: cached under ``artifacts``, shipped in ``checkpoints/``
    beside the study file, pretrained now, or a user's model (``[model] path``) scored and
    copied into the cache (pretrained further only if ``[pretrain] steps`` says so). With an
    object store, it is read from there through this machine's cache, or uploaded there once
    made (``dense/<key>``); the workers fetch it by its weights' digest."""
    artifacts = str(artifacts)
    initial, source = None, ""
    starts_from = user_model(cfg)
    if starts_from:
        model_family = family(model_cfg.family)
        source = model_family.user_model_digest(starts_from)

        def initial():
            try:
                return model_family.load_user_model(starts_from, model_cfg.block_size)
            except ValueError as err:
                raise UserError(f"{cfg.source}: [model] {err}") from None

    local, stored = Path(artifacts), True
    if is_remote(artifacts):
        local = local_cache()
        key = checkpoint_key(corpus.digest, model_cfg, cfg.pretrain, source)
        stored = _reaching(
            artifacts, lambda: _pull_dense(join(artifacts, "dense", key), local / "dense" / key)
        )
    dense = ensure_dense_checkpoint(
        corpus,
        model_cfg,
        cfg.pretrain,
        local,
        eval_tokens=cfg.budget.eval_tokens,
        device=cfg.budget.device,
        progress=progress,
        shipped_dir=cfg.source.parent / "checkpoints",
        notice=say,
        initial=initial,
        source=source,
    )
    if not stored:  # made here, or found cached or shipped: uploaded once, for every node
        _reaching(artifacts, lambda: publish(dense.path, dense_location(artifacts, dense)))
    return dense


def _reaching(artifacts: str, work):
    """``work()``, an object store's failure (it answered the pre-flight check, and stopped) a
    ``UserError`` of one line rather than a traceback."""
    try:
        return work()
    except OSError as err:
        raise UserError(f"--artifacts {artifacts}: {err}") from None
