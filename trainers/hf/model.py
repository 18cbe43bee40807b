"""The ``hf`` family's model: a transformers causal LM behind the project's prunable-model seam
(``HFModelConfig``, ``HFLanguageModel``), read from and written to standard Hugging Face folders.
What differs between architectures is in their own modules (``architectures.py``)."""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import (
    AttentionInterface,
    AutoConfig,
    AutoModelForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
)
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.utils import cached_file

from trainers.hf.architectures import architecture, architectures, grouped_query
from trainers.hf.export_keys import BLOCK_SIZE_KEY, EXPORT_KEYS, HEADS_KEY, KV_HEADS_KEY

ATTENTION = "headprune"  # the attention implementation name our models run under

WEIGHT_SUFFIXES = (".safetensors", ".bin")


class ModelNotFound(ValueError):
    """A model that is neither a local folder nor in the local Hugging Face cache (nothing here
    downloads: a study must not stall on, or silently depend on, the network)."""


def headprune_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Scaled dot-product attention for query heads that each name their key/value head, with an
    optional gate per query head; what transformers' sdpa attention computes otherwise.

    query is (B, Hq, Tq, d), key and value (B, Hkv, Tk, d) after any cache update; returns
    (B, Tq, Hq, d), the layout every attention module reshapes before its output projection."""
    kv_index = getattr(module, "headprune_kv_index", None)
    if kv_index is not None:  # pruned: uneven groups, one kv head per query head
        key, value = key.index_select(1, kv_index), value.index_select(1, kv_index)
    elif key.shape[1] != query.shape[1]:  # dense grouped-query attention: consecutive query heads share
        group = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(group, dim=1), value.repeat_interleave(group, dim=1)
    q_length = query.shape[2]
    causal = getattr(module, "is_causal", True) if is_causal is None else is_causal
    # As transformers' sdpa: the flag only without a mask and not while decoding one token.
    causal = q_length > 1 and attention_mask is None and causal
    if causal and key.shape[2] > q_length:  # prefill of a preallocated cache: the rest is empty
        key, value = key[:, :, :q_length], value[:, :, :q_length]
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=causal
    )
    out = out.transpose(1, 2)
    gate = getattr(module, "headprune_gate", None)
    if gate is not None:
        out = out * gate.to(out.dtype).reshape(1, 1, -1, 1)
    return out.contiguous(), None


# masking_utils builds no mask at all for an implementation it does not know; ours takes sdpa's.
AttentionInterface.register(ATTENTION, headprune_attention)
AttentionMaskInterface.register(ATTENTION, sdpa_mask)


def _size(hf_config: dict, which: int) -> int:
    """Layers (0), query heads (1), width (2) or positions (3), under the architecture's key."""
    return int(hf_config[architecture(hf_config["model_type"]).size_keys[which]])


@dataclass(frozen=True)
class HFModelConfig:
    hf_config: dict  # the dense model's transformers config, ``config.to_dict()`` (JSON)
    block_size: int  # the training and evaluation window in tokens (<= the model's positions)
    family: str = "hf"
    heads_per_layer: tuple[int, ...] = ()  # query heads kept per layer; () = dense
    # Per layer, for each kept query head, its kv head's index among the layer's kept kv heads; () = dense.
    kv_heads_per_layer: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        # As JSON would give it back (``id2label``'s int keys become strings), so that a config read
        # from disk equals the one written and the checkpoint named after it is found again.
        object.__setattr__(self, "hf_config", json.loads(json.dumps(self.hf_config)))
        if self.family != "hf":
            raise ValueError(f"HFModelConfig is the 'hf' family's config, got family {self.family!r}")
        architecture(self.architecture)  # one the family supports (ValueError otherwise)
        if not 1 <= self.block_size <= self.max_positions:
            raise ValueError(
                f"block_size {self.block_size} must be from 1 to the model's {self.max_positions} positions"
            )
        if self.n_head % self.n_kv_head:
            raise ValueError(f"n_head ({self.n_head}) is not a multiple of n_kv_head ({self.n_kv_head})")
        if bool(self.heads_per_layer) != bool(self.kv_heads_per_layer):
            raise ValueError("heads_per_layer and kv_heads_per_layer are given together or not at all")
        if self.heads_per_layer:
            self._check_pruned_shapes()

    def _check_pruned_shapes(self) -> None:
        if len(self.heads_per_layer) != self.n_layer or len(self.kv_heads_per_layer) != self.n_layer:
            raise ValueError(
                f"heads_per_layer and kv_heads_per_layer need one entry per layer ({self.n_layer})"
            )
        for layer, (heads, kv) in enumerate(zip(self.heads_per_layer, self.kv_heads_per_layer)):
            if not 1 <= heads <= self.n_head or len(kv) != heads:
                raise ValueError(
                    f"layer {layer}: {heads} heads with kv heads {kv} (1 to {self.n_head} heads)"
                )
            # Every kept kv head serves some query head (else it would be dead weight), and no more
            # query heads than its group in the dense model.
            if sorted(set(kv)) != list(range(len(set(kv)))) or len(set(kv)) > self.n_kv_head:
                raise ValueError(
                    f"layer {layer}: kv head indices {kv} are not 0..k-1 with k <= {self.n_kv_head}"
                )
            group = self.n_head // self.n_kv_head
            if any(kv.count(k) > group for k in set(kv)):
                raise ValueError(f"layer {layer}: a kv head serves more than its {group} query heads in {kv}")

    def _size(self, which: int) -> int:
        return _size(self.hf_config, which)

    @property
    def architecture(self) -> str:
        return self.hf_config.get("model_type", "")

    @property
    def n_layer(self) -> int:
        return self._size(0)

    @property
    def n_head(self) -> int:  # query heads per layer of the dense model
        return self._size(1)

    @property
    def d_model(self) -> int:
        return self._size(2)

    @property
    def max_positions(self) -> int:
        return self._size(3)

    @property
    def n_kv_head(self) -> int:  # key/value heads per layer of the dense model
        return self.hf_config.get("num_key_value_heads") or self.n_head

    @property
    def d_head(self) -> int:
        return self.hf_config.get("head_dim") or self.d_model // self.n_head

    @property
    def vocab_size(self) -> int:
        return int(self.hf_config["vocab_size"])

    @property
    def layer_heads(self) -> tuple[int, ...]:
        return self.heads_per_layer or (self.n_head,) * self.n_layer

    def layer_kv_heads(self, layer: int) -> tuple[int, ...]:
        """The kv head of each of the layer's query heads now (dense: groups of consecutive heads)."""
        if self.kv_heads_per_layer:
            return self.kv_heads_per_layer[layer]
        group = self.n_head // self.n_kv_head
        return tuple(h // group for h in range(self.n_head))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> HFModelConfig:
        return cls(
            **{
                **data,
                "heads_per_layer": tuple(data.get("heads_per_layer", ())),
                "kv_heads_per_layer": tuple(tuple(kv) for kv in data.get("kv_heads_per_layer", ())),
            }
        )


def architecture_config(
    name: str,
    *,
    vocab_size: int,
    n_layer: int,
    n_head: int,
    d_model: int,
    block_size: int,
    n_kv_head: int | None = None,
    dropout: float = 0.0,
) -> dict:
    """The transformers config (as ``to_dict()``) of a fresh small model: MLP 4x d_model, exactly
    ``block_size`` positions, ``dropout`` everywhere the architecture has it (default none), no
    special tokens (the project's tokenizers give them no meaning)."""
    if name not in architectures():
        raise ValueError(f"architecture {name!r} is not one of {tuple(architectures())}")
    arch = architecture(name)
    if d_model % n_head:
        raise ValueError(f"d_model ({d_model}) must be divisible by n_head ({n_head})")
    if n_kv_head not in (None, n_head) and not arch.grouped_query:
        raise ValueError(
            f"grouped-query attention (n_kv_head) is for {', '.join(grouped_query())}, not {name}"
        )
    no_tokens = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
    sizes = arch.config_sizes(n_layer, n_head, d_model, block_size, n_kv_head, dropout)
    config = AutoConfig.for_model(name, vocab_size=vocab_size, initializer_range=0.02, **sizes, **no_tokens)
    return config_dict(config)


def config_dict(config: PretrainedConfig) -> dict:
    """A transformers config as the JSON dict ``HFModelConfig.hf_config`` holds, less where it was
    read from and by which transformers: the same model's config is then the same on every machine
    (a study's cached checkpoint is named after it)."""
    config = json.loads(config.to_json_string(use_diff=False))
    return {k: v for k, v in config.items() if k not in ("_name_or_path", "transformers_version")}


def _local_folder(path_or_name: str | Path) -> Path:
    """The folder holding a model: ``path_or_name`` itself, or its snapshot in the local Hugging
    Face cache (never fetched)."""
    if Path(path_or_name).is_dir():
        return Path(path_or_name)
    try:
        return Path(cached_file(str(path_or_name), "config.json", local_files_only=True)).parent
    except (OSError, ValueError):  # not cached, or not even a valid repository name
        raise ModelNotFound(
            f"model '{path_or_name}' is not a local folder nor in the Hugging Face cache; "
            f"fetch it first with: hf download {path_or_name}"
        ) from None


def _first_line(err: Exception) -> str:
    """An error from transformers in one line: its first, else its type's name."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _read_folder_config(folder: Path) -> dict:
    """config.json of a model folder, of a supported architecture (ValueError otherwise)."""
    try:
        config = config_dict(AutoConfig.from_pretrained(folder, local_files_only=True))
    except (OSError, ValueError) as err:  # a folder without a (sound) config.json is not a model
        raise ValueError(f"{folder}: no readable model config ({_first_line(err)})") from None
    if config.get("model_type") not in architectures():
        raise ValueError(
            f"{folder}: model_type {config.get('model_type')!r} is not supported; "
            f"the hf family supports {tuple(architectures())}"
        )
    return config


def read_pretrained_config(path_or_name: str | Path) -> dict:
    """A dense model's transformers config (``to_dict()``, the ``hf_config`` of ``HFModelConfig``),
    without reading its weights: ``ModelNotFound`` if it is not here, ValueError if it is not a
    supported architecture or a pruned export (whose shapes a dense config would not describe)."""
    cfg = _folder_cfg(_read_folder_config(_local_folder(path_or_name)))
    if cfg.heads_per_layer:
        raise ValueError(f"{path_or_name} is a pruned export, not a dense model to start a study from")
    return cfg.hf_config


def check_weights(path_or_name: str | Path) -> None:
    """The model's weight files are there and whole (each safetensors file's header read and its
    size checked against it), so a study fails before it starts, not when it loads them."""
    from safetensors import safe_open

    folder = _local_folder(path_or_name)
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES))
    if not files:
        raise ValueError(f"{path_or_name}: no weight files ({', '.join(WEIGHT_SUFFIXES)}) in {folder}")
    for path in files:
        if path.suffix != ".safetensors":
            continue
        try:
            with safe_open(str(path), framework="pt") as weights:
                weights.keys()
        except Exception as err:  # safetensors raises its own error types for a cut or foreign file
            raise ValueError(f"{path} is not a readable safetensors file ({err})") from None


def weights_digest(path_or_name: str | Path) -> str:
    """SHA-256 over a model's weight files (names and bytes): names the weights a study started
    from, so a cached dense checkpoint is reused only for the same weights."""
    folder = _local_folder(path_or_name)
    digest = hashlib.sha256()
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES))
    if not files:
        raise ValueError(f"{path_or_name}: no weight files ({', '.join(WEIGHT_SUFFIXES)}) in {folder}")
    for path in files:
        digest.update(path.name.encode() + b"\0")
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def _set_kv_index(attention: nn.Module, kv: tuple[int, ...], n_kv: int) -> None:
    """Record which kv head each query head reads, unless the standard mapping (equal groups of
    consecutive query heads) already says so: a gather per call is not free."""
    group = len(kv) // n_kv
    if len(kv) % n_kv == 0 and kv == tuple(h // group for h in range(len(kv))):
        if hasattr(attention, "headprune_kv_index"):
            delattr(attention, "headprune_kv_index")
        return
    device = next(attention.parameters()).device
    # A buffer follows the model across devices; not persistent: the config records the mapping.
    attention.register_buffer("headprune_kv_index", torch.tensor(kv, device=device), persistent=False)


def _check_keep(keep: list[list[int]], layer_heads: tuple[int, ...]) -> list[list[int]]:
    if len(keep) != len(layer_heads):
        raise ValueError(f"keep needs one list per layer ({len(layer_heads)}), got {len(keep)}")
    checked = []
    for layer, (heads, n) in enumerate(zip(keep, layer_heads)):
        heads = sorted(int(h) for h in heads)
        if not heads:
            raise ValueError(f"layer {layer}: the hf family needs at least one head per layer")
        if heads[0] < 0 or heads[-1] >= n or len(set(heads)) != len(heads):
            raise ValueError(f"layer {layer}: head indices {heads} are not distinct heads of {n}")
        checked.append(heads)
    return checked


class HFLanguageModel(nn.Module):
    """A transformers causal LM (``self.hf``) presented as the project's prunable model."""

    def __init__(self, cfg: HFModelConfig, hf: PreTrainedModel | None = None) -> None:
        """A model of ``cfg``'s shapes, freshly initialised (weights of a pruned one then come from
        ``load_saved_state``), or wrapping ``hf``, a model that already has those shapes."""
        super().__init__()
        self.cfg = cfg
        if hf is None:
            config = AutoConfig.for_model(**cfg.hf_config)
            hf = AutoModelForCausalLM.from_config(config, attn_implementation=ATTENTION, dtype=torch.float32)
            if cfg.heads_per_layer:  # any heads of the right count: the weights are about to be loaded
                for attention, heads, kv in zip(
                    self._attention(hf), cfg.heads_per_layer, cfg.kv_heads_per_layer
                ):
                    architecture(cfg.architecture).keep_heads(
                        attention, cfg.d_head, list(range(heads)), sorted(set(kv)), 1.0
                    )
        else:
            hf.set_attn_implementation(ATTENTION)
        self.hf = hf
        for layer, attention in enumerate(self._attention(hf)):
            kv = cfg.layer_kv_heads(layer)
            width = self._output_projection(attention).weight.numel() // cfg.d_model
            if width != len(kv) * cfg.d_head:
                raise ValueError(
                    f"layer {layer} of the model has {width // cfg.d_head} heads, the config {len(kv)}"
                )
            _set_kv_index(attention, kv, len(set(kv)))
        if cfg.heads_per_layer:  # the transformers config says what it holds (``load_pruned`` reads it)
            for key, value in _export_keys(cfg).items():
                setattr(hf.config, key, value)

    def _attention(self, hf: PreTrainedModel | None = None) -> list[nn.Module]:
        return architecture(self.cfg.architecture).attention_modules(self.hf if hf is None else hf)

    def _output_projection(self, attention: nn.Module) -> nn.Module:
        return getattr(attention, architecture(self.cfg.architecture).output_projection)

    @classmethod
    def from_architecture(cls, architecture: str, **sizes) -> HFLanguageModel:
        """A fresh small model of one of ``architectures()``; ``sizes`` are ``architecture_config``'s
        keywords (vocab_size, n_layer, n_head, d_model, block_size, n_kv_head)."""
        hf_config = architecture_config(architecture, **sizes)
        return cls(HFModelConfig(hf_config=hf_config, block_size=sizes["block_size"]))

    @classmethod
    def from_pretrained(cls, path_or_name: str | Path, block_size: int) -> HFLanguageModel:
        """A model from a local folder (``save_pretrained``, a pruned export included) or from the
        local Hugging Face cache, in float32 (pruning compares outputs to 1e-4)."""
        folder = _local_folder(path_or_name)
        return _load_folder(folder, _folder_cfg(_read_folder_config(folder), block_size))

    def forward(
        self, idx: torch.Tensor, head_gates: list[torch.Tensor] | None = None, return_attn: bool = False
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Logits (B, T, vocab); each head's output times its gate before the output projection;
        with ``return_attn`` also each layer's attention output after the projection."""
        T = idx.shape[1]
        if self.cfg.block_size < T:
            raise ValueError(f"sequence of {T} tokens is longer than block_size {self.cfg.block_size}")
        modules = self._attention()
        if head_gates is not None and len(head_gates) != len(modules):
            raise ValueError(f"head_gates needs one tensor per layer ({len(modules)}), got {len(head_gates)}")
        attn_outputs: list[torch.Tensor] = []
        hooks = []
        try:
            if head_gates is not None:
                for layer, (attention, gate, heads) in enumerate(
                    zip(modules, head_gates, self.cfg.layer_heads)
                ):
                    if gate.numel() != heads:
                        raise ValueError(f"layer {layer}: {gate.numel()} gates for {heads} heads")
                    attention.headprune_gate = gate
            if return_attn:
                for attention in modules:
                    projection = self._output_projection(attention)
                    hooks.append(
                        projection.register_forward_hook(lambda _m, _i, out: attn_outputs.append(out))
                    )
            logits = self.hf(input_ids=idx, use_cache=False).logits
        finally:  # a gate left behind would scale the next, ungated call
            for attention in modules:
                attention.headprune_gate = None
            for hook in hooks:
                hook.remove()
        return logits, attn_outputs

    def loss(
        self, idx: torch.Tensor, targets: torch.Tensor, head_gates: list[torch.Tensor] | None = None
    ) -> torch.Tensor:
        logits, _ = self(idx, head_gates)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    @torch.no_grad()
    def prune_heads(
        self, keep: list[list[int]], head_scale: list[float | None] | None = None
    ) -> HFLanguageModel:
        """A new model holding only the query heads in ``keep`` (per layer, current numbering) and
        the key/value heads they read, computing what the masked model computes. ``head_scale``
        (per layer) folds a constant on the surviving heads into the output projection."""
        cfg = self.cfg
        keep = _check_keep(keep, cfg.layer_heads)
        if head_scale is not None and len(head_scale) != cfg.n_layer:
            raise ValueError(f"head_scale needs one value per layer ({cfg.n_layer}), got {len(head_scale)}")
        hf = copy.deepcopy(self.hf)  # everything but attention is kept as it is, ties included
        kv_heads_per_layer = []
        for layer, (attention, heads) in enumerate(zip(self._attention(hf), keep)):
            kv_now = cfg.layer_kv_heads(layer)
            kv_kept = sorted({kv_now[h] for h in heads})
            scale = 1.0 if head_scale is None or head_scale[layer] is None else float(head_scale[layer])
            architecture(cfg.architecture).keep_heads(attention, cfg.d_head, heads, kv_kept, scale)
            kv_heads_per_layer.append(tuple(kv_kept.index(kv_now[h]) for h in heads))
        pruned_cfg = replace(
            cfg, heads_per_layer=tuple(len(h) for h in keep), kv_heads_per_layer=tuple(kv_heads_per_layer)
        )
        return type(self)(pruned_cfg, hf)

    def _embeddings(self) -> list[nn.Parameter]:
        """The token embedding and the architecture's others (GPT-2's learned positions)."""
        return [
            self.hf.get_input_embeddings().weight,
            *architecture(self.cfg.architecture).extra_embeddings(self.hf),
        ]

    def count_parameters(self) -> tuple[int, int]:
        """(total, non-embedding) parameters; tied weights count once, an untied output head is
        non-embedding."""
        total = sum(p.numel() for p in self.hf.parameters())
        return total, total - sum(p.numel() for p in self._embeddings())

    def _saved_names(self) -> list[str]:
        """state_dict names, each tensor once: a tied output head is its input embedding."""
        seen, names = set(), []
        for name, tensor in self.hf.state_dict(keep_vars=True).items():
            if id(tensor) not in seen:
                seen.add(id(tensor))
                names.append(name)
        return names

    def saved_state(self) -> dict[str, torch.Tensor]:
        """The weights to write to disk (safetensors refuses tensors that share memory)."""
        state = self.hf.state_dict()
        return {name: state[name].detach().cpu().contiguous() for name in self._saved_names()}

    def load_saved_state(self, state: dict[str, torch.Tensor]) -> None:
        """Weights from ``saved_state`` of a model of the same config; a tied head gets them through
        the embedding it shares."""
        expected = set(self._saved_names())
        if set(state) != expected:
            missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
            raise ValueError(
                f"weights do not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}"
            )
        self.hf.load_state_dict(state, strict=False)


def _export_keys(cfg: HFModelConfig) -> dict:
    return {
        HEADS_KEY: list(cfg.layer_heads),
        KV_HEADS_KEY: [list(cfg.layer_kv_heads(layer)) for layer in range(cfg.n_layer)],
        BLOCK_SIZE_KEY: cfg.block_size,
    }


def _folder_cfg(config: dict, block_size: int | None = None) -> HFModelConfig:
    """The ``HFModelConfig`` of a folder's config.json: a dense model's, or an export's (the dense
    config plus our keys). ``block_size`` defaults to the export's, else the model's positions."""
    dense = {k: v for k, v in config.items() if k not in EXPORT_KEYS}
    block_size = block_size or config.get(BLOCK_SIZE_KEY) or _size(dense, 3)
    cfg = HFModelConfig(hf_config=dense, block_size=block_size)
    heads = tuple(config.get(HEADS_KEY, ()))
    kv = tuple(tuple(k) for k in config.get(KV_HEADS_KEY, ()))
    if heads and (heads != cfg.layer_heads or kv != tuple(map(cfg.layer_kv_heads, range(cfg.n_layer)))):
        cfg = replace(cfg, heads_per_layer=heads, kv_heads_per_layer=kv)
    return cfg


def _load_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The tensors of a ``save_pretrained`` folder, one safetensors file or several with an index."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (folder / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise ValueError(f"{folder}: no model.safetensors (load_pruned reads safetensors exports only)")
    state: dict[str, torch.Tensor] = {}
    for name in files:
        state.update(load_file(str(folder / name)))
    return state


def _load_folder(folder: Path, cfg: HFModelConfig) -> HFLanguageModel:
    """The model in ``folder``: a dense one through transformers' own loader (any checkpoint's
    tensor names), a pruned one (shapes transformers cannot build) built here and filled."""
    if not cfg.heads_per_layer:
        check_weights(folder)
        try:
            hf, info = AutoModelForCausalLM.from_pretrained(
                folder,
                local_files_only=True,
                attn_implementation=ATTENTION,
                dtype=torch.float32,
                output_loading_info=True,
            )
        except (RuntimeError, OSError) as err:  # tensors of other shapes, files transformers cannot read
            raise ValueError(f"{folder}: the weights cannot be loaded ({_first_line(err)})") from None
        # transformers initialises what the files lack at random and only warns: a study would then
        # prune a random model. (It does not list a tied output head as missing: an untied one
        # absent from the files is as random as any other tensor.)
        missing = sorted(info.get("missing_keys", ()))
        mismatched = sorted(str(k[0] if isinstance(k, tuple) else k) for k in info.get("mismatched_keys", ()))
        if missing or mismatched:
            raise ValueError(
                f"{folder}: the weights do not fit its config.json (missing {missing[:3]}, "
                f"of other shapes {mismatched[:3]})"
            )
        return HFLanguageModel(cfg, hf)
    model = HFLanguageModel(cfg)
    state = _load_weights(folder)
    expected, known = set(model._saved_names()), set(model.hf.state_dict())
    # save_pretrained leaves out a tied head; anything else missing or extra means another model,
    # or one written by ``model.hf.save_pretrained`` under historical tensor names.
    if not expected <= set(state) <= known:
        raise ValueError(
            f"{folder}: weights do not fit its config (missing {sorted(expected - set(state))[:3]}, "
            f"unexpected {sorted(set(state) - known)[:3]}); pruned models are written by save_pretrained here"
        )
    model.load_saved_state({name: state[name] for name in expected})
    return model


def save_pretrained(model: HFLanguageModel, folder: str | Path) -> Path:
    """Write ``model`` as a standard Hugging Face folder (safetensors); its config.json is the
    dense model's plus ``headprune_heads_per_layer``, ``headprune_kv_heads`` and
    ``headprune_block_size``, what ``load_pruned`` needs to build the pruned shapes."""
    folder = Path(folder)
    for key, value in _export_keys(model.cfg).items():
        setattr(model.hf.config, key, value)
    # A pruned model's tensors keep the names the model has in this version of transformers (not a
    # checkpoint's historical ones: GPT-NeoX's lm_head would be written as embed_out), the names
    # ``load_pruned`` reads back without transformers' loader, which cannot build per-layer head
    # counts. A dense model is written as transformers writes any checkpoint.
    model.hf.save_pretrained(folder, save_original_format=not model.cfg.heads_per_layer)
    return folder


def load_pruned(folder: str | Path, device: str | torch.device = "cpu") -> PreTrainedModel:
    """The transformers model of a ``save_pretrained`` export, pruned shapes and weights, running
    the ``headprune`` attention (registered by importing this module), in eval mode."""
    folder = Path(folder)
    return _load_folder(folder, _folder_cfg(_read_folder_config(folder))).hf.to(device).eval()
