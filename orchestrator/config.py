"""Study files (``studies/*.toml``) -> a validated ``StudyConfig``; every error names file and key."""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.errors import UserError, closest
from orchestrator.preflight import check_study_name
from orchestrator.search_space import SearchSpace, check_value
from trainers.families import SHARED_MODEL_KEYS, families, family
from trainers.hparams import PretrainConfig, TrialBudget, TrialHParams
from trainers.knobs import bounded, choice, field_specs
from trainers.tokenizers import KINDS

# Optuna samplers a study may use (orchestrator/runner.py builds them): TPE per parameter, TPE
# modelling the parameters jointly (grouped by the method's define-by-run branch), and two that
# propose what the pruned trials share: the Gaussian-process sampler (orchestrator/gp_proposals.py)
# and NSGA-II with the start-up as its first generation (orchestrator/nsga2_proposals.py). In the
# study itself those two would see the dense control, which has no parameters, and sample at random.
SAMPLERS = ("tpe", "tpe_multivariate", "gp", "nsga2")


def _model_specs() -> dict[str, dict]:
    """[model]'s keys: ``family``, the ones every family takes, and each family's own (its spec
    names the families that take it: ``families``)."""
    specs = {
        "family": {
            "type": str,
            "default": "gpt",
            "choices": tuple(families()),
            "doc": "gpt or all_attention (built in), or hf (a Hugging Face causal LM)",
        },
        **SHARED_MODEL_KEYS,
    }
    for name, declared in families().items():
        for key, spec in declared.keys.items():
            if key in specs and "families" in specs[key]:
                specs[key]["families"] = (*specs[key]["families"], name)
            else:
                specs[key] = {**spec, "families": (name,)}
    return specs


MODEL_SPECS = _model_specs()
# [model] as studies made before the families declared their own keys recorded it: every study's
# setup digest (``setup_digest``) is taken over these keys, so those studies keep theirs.
RECORDED_MODEL_DEFAULTS = {"n_persistent": 64, "path": "", "architecture": "", "n_kv_head": 0}
MAX_HEADS = 65536  # attention heads in a model built from sizes (Llama 3.1 405B has 126 x 128)


@dataclass(frozen=True)
class StudySettings:
    name: str = bounded("", kind=str, doc="the Optuna study's name")
    n_trials: int = bounded(12, 1, doc="COMPLETE trials the study ends with")
    max_concurrent: int = bounded(1, 1, doc="trials running at once")
    # numpy's and Optuna's samplers take 32 bits; the sampler's is this plus the trials asked
    seed: int = bounded(
        0, 0, 2**31 - 1, doc="every trial's batches; the sampler's, plus the trials asked before"
    )
    cpus_per_trial: float = bounded(2.0, 0.0, doc="CPUs Ray Tune reserves for each trial")
    gpus_per_trial: float = bounded(0.0, 0.0, doc="GPUs Ray Tune reserves for each trial")
    max_retries: int = bounded(1, 0, doc="Tune retries of a trial whose worker died")
    max_failed_trials: int = bounded(5, 0, doc="FAIL trials a run tolerates before it stops")
    # at most a day: a driver whose death goes unnoticed longer holds its study for no one
    lease_seconds: float = bounded(60.0, 1.0, 86400.0, doc="a driver silent this long loses the study")
    startup_trials: int = bounded(
        0, 0, doc="trials spread over sparsity before the sampler models (0: n/2 + 1, <= one per size)"
    )
    sampler: str = choice(
        "tpe", SAMPLERS, doc="how Optuna chooses after the start-up (docs/explanation/search.md)"
    )
    gap_fill_every: int = bounded(
        0,
        0,
        doc="after the start-up, every N-th trial fills the front's widest gap (0: none)",
    )
    warm_start: bool = bounded(
        False,
        doc="a trial prunes the front's next larger model, not the dense one (docs/explanation/search.md)",
    )
    artifacts: str = bounded(
        "",
        kind=str,
        doc="where models go, as --artifacts: a folder or s3://bucket/prefix (docs/howto/clusters.md)",
    )


@dataclass(frozen=True)
class EarlyStopping:
    """Pareto-aware early stopping (``orchestrator/early_stopping.py``): trials compared at rungs
    of their fine-tuning budget, the top 1 / reduction_factor by Pareto rank going on."""

    enabled: bool = bounded(False, doc="stop trials at rungs by Pareto rank")
    reduction_factor: float = bounded(3.0, 1.5, doc="1 / the share of trials a rung lets go on")
    min_fraction: float = bounded(1.0 / 9.0, 0.0, 1.0, high_open=True, doc="the first rung")
    eval_tokens: int = bounded(
        0, 0, doc="validation tokens a rung scores, spread over the trial's slice (0: all of it)"
    )
    margin: float = bounded(
        0.0, 0.0, 1.0, doc="a trial within this fraction of a smaller trial's rung perplexity goes on"
    )

    def rungs(self) -> list[float]:
        """The fractions of the fine-tuning budget at which trials are compared: the end excluded,
        and anything within 1% of it (a rung there decides nothing, the trial has done its steps;
        the default study's 0.111 x 3 x 3 = 0.999 once gave a third rung on the last step, which
        recorded whole trials as PRUNED)."""
        if not self.enabled:
            return []
        fractions, fraction = [], self.min_fraction
        while fraction < 0.99:
            fractions.append(fraction)
            fraction *= self.reduction_factor
        return fractions


CORPUS_FILES = ("path", "train_path", "val_path", "test_path")  # [corpus]'s keys that name files


@dataclass(frozen=True)
class CorpusSettings:
    """One text split contiguously, or separate train, validation and test files (paths
    relative to the study file). The test split is selected on by nothing: the study chooses on
    validation and reports both (trainers/data.py)."""

    path: str = bounded("", kind=str, doc="one text, split contiguously: training, validation, test")
    train_path: str = bounded("", kind=str, doc="the training text, with val_path (instead of path)")
    val_path: str = bounded("", kind=str, doc="the validation text the study selects on, with train_path")
    test_path: str = bounded("", kind=str, doc="optional, with train_path and val_path")
    val_fraction: float = bounded(
        0.1,
        0.0,
        1.0,
        low_open=True,
        high_open=True,
        doc="the part of path before the test split that validates",
    )  # 0: nothing validates
    test_fraction: float = bounded(
        0.0, 0.0, 1.0, high_open=True, doc="the last part of path, after validation; 0: no test split"
    )
    tokenizer: str = choice("char", KINDS, doc="char; bpe (trained on the training split); model (beside it)")
    vocab_size: int = bounded(1024, 257, doc="the BPE tokenizer's vocabulary (256 bytes + merges)")

    def load_kwargs(self, base: Path) -> dict[str, Any]:
        """Arguments for ``Corpus.load`` with paths resolved against ``base``."""
        paths = {k: base / v for k in CORPUS_FILES if (v := getattr(self, k))}
        return {
            **paths,
            "val_fraction": self.val_fraction,
            "test_fraction": self.test_fraction,
            "tokenizer": self.tokenizer,
            "vocab_size": self.vocab_size,
        }


@dataclass(frozen=True)
class StudyConfig:
    source: Path
    study: StudySettings
    corpus: CorpusSettings
    model: dict[str, Any]  # [model] as written, defaults filled in (vocab_size comes from the corpus)
    pretrain: PretrainConfig | None  # None: a user's pretrained model is pruned as it is
    budget: TrialBudget
    search: SearchSpace
    early_stopping: EarlyStopping = field(default_factory=EarlyStopping)
    raw: dict[str, Any] = field(default_factory=dict)  # the merged TOML, stored with the study


SECTIONS = ("study", "corpus", "model", "pretrain", "trial", "search", "startup", "early_stopping")


def _table(where: str, table: Any, specs: dict[str, dict]) -> dict[str, Any]:
    """Check a TOML table against its specs; returns the values with defaults filled in."""
    if not isinstance(table, dict):
        raise UserError(f"{where}: must be a table")
    for key in table:
        if key not in specs:
            raise UserError(f"{where}: unknown key {key!r}{closest(key, specs)}")
    values = {}
    for key, spec in specs.items():
        if key in table:
            values[key] = check_value(f"{where} {key}", table[key], spec)
        else:
            values[key] = spec["default"]
    return values


def _parse_override(item: str) -> tuple[list[str], Any]:
    """``section.key=value``; the value is read as TOML (numbers, booleans, lists), else a string."""
    if "=" not in item:
        raise UserError(f"--set {item!r}: expected section.key=value")
    key, text = item.split("=", 1)
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        value = text
    path = key.strip().split(".")
    if len(path) != 2 or not all(path):
        raise UserError(f"--set {item!r}: the key must be section.key, e.g. trial.prune_steps")
    return path, value


def load_study_config(path: str | Path, overrides: list[str] = ()) -> StudyConfig:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"study file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"cannot read study file {path}: {err}") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise UserError(f"{path}: TOML syntax error: {err}") from None
    overridden = {}
    for item in overrides:
        (section, key), value = _parse_override(item)
        raw.setdefault(section, {})
        if not isinstance(raw[section], dict):
            raise UserError(f"{path}: [{section}] must be a table")
        raw[section][key] = value
        overridden[item] = _mentions(section, key)
    try:
        return config_from_raw(path, raw)
    except UserError as err:  # a value --set gave is not the file's: say where it came from
        given = [item for item, mention in overridden.items() if mention.search(str(err))]
        if given:
            raise UserError(f"{err} (given by --set {given[0]})") from None
        raise


def _mentions(section: str, key: str) -> re.Pattern:
    """How config_from_raw's messages name a --set key: "[trial] prune_steps ..." for a bad
    value, "[trial]: unknown key 'prune_step'" (or hyperparameter) for a misspelt key, "unknown
    section [traial]" for a misspelt section."""
    s, k = re.escape(section), re.escape(key)
    return re.compile(
        rf"\[{s}\] {k}\b|\[{s}\]: unknown (key|hyperparameter) {re.escape(repr(key))}|unknown section \[{s}\]"
    )


def config_from_raw(path: Path, raw: dict[str, Any]) -> StudyConfig:
    """A study file's merged TOML (``--set`` values applied) checked and resolved, defaults
    filled in; ``path`` names the file in messages and anchors its relative paths. Also reads
    back the configuration a study stored (``StudyConfig.raw``)."""
    for section in raw:
        if section not in SECTIONS:
            raise UserError(f"{path}: unknown section [{section}]{closest(section, SECTIONS)}")

    study = _table(f"{path}: [study]", raw.get("study", {}), field_specs(StudySettings))
    if not study["name"]:
        raise UserError(f"{path}: [study] name is required")
    check_study_name(study["name"], f"{path}: [study] name")
    corpus = _table(f"{path}: [corpus]", raw.get("corpus", {}), field_specs(CorpusSettings))
    if not corpus["path"] and not (corpus["train_path"] and corpus["val_path"]):
        raise UserError(f"{path}: [corpus] needs path, or both train_path and val_path")
    if corpus["path"] and (corpus["train_path"] or corpus["val_path"]):
        given = "train_path" if corpus["train_path"] else "val_path"
        raise UserError(
            f"{path}: [corpus] path and {given} both given: one file split (path), or two files "
            "(train_path and val_path), not both"
        )
    if corpus["test_path"] and not corpus["train_path"]:
        raise UserError(f"{path}: [corpus] test_path goes with train_path and val_path")
    if corpus["test_fraction"] and not corpus["path"]:
        raise UserError(f"{path}: [corpus] test_fraction splits path; with separate files give test_path")
    held_out = corpus["val_fraction"] + corpus["test_fraction"]
    if held_out >= 1.0:
        raise UserError(
            f"{path}: [corpus] val_fraction + test_fraction is {held_out:g}: nothing left to train on"
        )
    model = _check_model(path, raw.get("model", {}), corpus)
    pretrain = _table(f"{path}: [pretrain]", raw.get("pretrain", {}), field_specs(PretrainConfig))
    # A user's model is the dense checkpoint as it is, unless [pretrain] asks for more training.
    starts_from = family(model["family"]).user_model(model, path.parent)
    keep_as_is = bool(starts_from) and "steps" not in raw.get("pretrain", {})
    if keep_as_is and corpus["tokenizer"] != "model":  # its ids would mean other text to it
        raise UserError(
            f"{path}: [corpus] tokenizer = {corpus['tokenizer']!r} with [model] path: the model was "
            "trained on its own tokenizer's ids; use tokenizer = 'model', or set [pretrain] steps to "
            "train it on these"
        )
    budget = _table(f"{path}: [trial]", raw.get("trial", {}), field_specs(TrialBudget))
    specs = field_specs(TrialHParams)
    search = SearchSpace.from_table(f"{path}: [search]", raw.get("search", {}), specs)
    search = search.with_startup(f"{path}: [startup]", raw.get("startup", {}), specs)
    if not starts_from:  # a user's model's heads are known once its config is read
        search.check_reachable(f"{path}: [search]", [model["n_head"]] * model["n_layer"])
    early = _table(f"{path}: [early_stopping]", raw.get("early_stopping", {}), field_specs(EarlyStopping))
    if early["min_fraction"] <= 0:
        raise UserError(f"{path}: [early_stopping] min_fraction must be above 0")
    return StudyConfig(
        source=path,
        study=StudySettings(**study),
        corpus=CorpusSettings(**corpus),
        model=model,
        pretrain=None if keep_as_is else PretrainConfig(**pretrain),
        budget=TrialBudget(**budget),
        search=search,
        early_stopping=EarlyStopping(**early),
        raw=raw,
    )


def _check_model(path: Path, table: Any, corpus: dict[str, Any]) -> dict[str, Any]:
    """[model]: the keys its family takes (checked by the family), and sizes that fit together.
    The values: the shared keys and the family's own, defaults filled in."""
    where = f"{path}: [model]"
    if not isinstance(table, dict):
        raise UserError(f"{where}: must be a table")
    spec = MODEL_SPECS["family"]
    declared = family(
        check_value(f"{where} family", table["family"], spec) if "family" in table else spec["default"]
    )
    own = {"family": MODEL_SPECS["family"], **SHARED_MODEL_KEYS, **declared.keys}
    for key in table:
        if key not in own and key in MODEL_SPECS:
            takers = " or ".join(repr(f) for f in MODEL_SPECS[key]["families"])
            raise UserError(f"{where} {key} applies to family = {takers} only")
    model = _table(where, table, own)
    try:
        declared.check_table(model, set(table))
    except ValueError as err:
        raise UserError(f"{where} {err}") from None
    if not declared.user_model(model, path.parent):  # a model built from the sizes
        heads = model["n_layer"] * model["n_head"]
        if heads > MAX_HEADS:  # [n_head] * n_layer is listed and scanned: refused before it is built
            raise UserError(
                f"{where} n_layer x n_head is {heads:,} heads; at most {MAX_HEADS:,} (4x the largest "
                "open models')"
            )
        if model["d_model"] % model["n_head"]:
            raise UserError(
                f"{where} d_model {model['d_model']} is not divisible by n_head {model['n_head']}"
            )
        if corpus["tokenizer"] == "model":
            raise UserError(
                f"{path}: [corpus] tokenizer = 'model' needs [model] path (the tokenizer beside it)"
            )
    return model


def user_model(cfg: StudyConfig) -> str | None:
    """The model of the user's the study starts from (its family's say), or None."""
    return family(cfg.model["family"]).user_model(cfg.model, cfg.source.parent)


# The sections that decide what a trial trains and how it is scored, and the keys of them that
# only say how a trial runs (a replicate may use others: the same measurement).
MEASUREMENT_SECTIONS = ("corpus", "model", "pretrain", "trial")
EXECUTION_ONLY = {("trial", "threads"), ("trial", "device")}


def measurement_settings(cfg: StudyConfig) -> dict[str, dict[str, Any]]:
    """What a trial's result depends on besides its hyperparameters, defaults filled in (a
    default written out is the default): ``MEASUREMENT_SECTIONS`` but ``EXECUTION_ONLY``, and
    ``[study] seed`` (every trial's batches)."""
    corpus = asdict(cfg.corpus)
    for key, unset in (("test_path", ""), ("test_fraction", 0.0)):  # as studies made before them
        if corpus[key] == unset:
            del corpus[key]
    resolved = {
        "corpus": corpus,
        "model": {**RECORDED_MODEL_DEFAULTS, **cfg.model},
        "pretrain": asdict(cfg.pretrain) if cfg.pretrain else {},
        "trial": asdict(cfg.budget),
    }
    settings = {
        section: {k: v for k, v in values.items() if (section, k) not in EXECUTION_ONLY}
        for section, values in resolved.items()
    }
    return {**settings, "study": {"seed": cfg.study.seed}}


def setup_digest(cfg: StudyConfig, dense_val_perplexity: float | None) -> str:
    """A short digest of what a trial is measured under: ``measurement_settings`` and the dense
    checkpoint's perplexity. Each COMPLETE trial and each replicate carries it: results under
    another digest (a study resumed with other trial settings) do not average together."""
    setup = {"settings": measurement_settings(cfg), "dense": dense_val_perplexity}
    return hashlib.sha256(json.dumps(setup, sort_keys=True, default=str).encode()).hexdigest()[:16]
