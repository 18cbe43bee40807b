"""The language models whose attention heads are pruned, in one file (after nanoGPT's model.py).

Two families share every piece but the block (methods.md section 2):

- ``gpt``: pre-LayerNorm blocks of causal multi-head attention and a 4x MLP.
- ``all_attention``: no MLP; each head owns ``n_persistent`` key and value vectors that join the
  context's keys and values before one softmax, so every non-embedding parameter belongs to a head.

Every head's output can be multiplied by a gate before the heads are concatenated and projected
(methods.md section 1). ``LanguageModel.prune_heads`` removes heads physically: a layer may keep any number of
heads, so the config records the count per layer.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

import torch
import torch.nn as nn
import torch.nn.functional as F

from trainers.families import SHARED_MODEL_KEYS, ModelFamily, register_family

BUILT_IN = ("gpt", "all_attention")  # the families of this file (trainers/families.py has all)


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    block_size: int = 128
    n_layer: int = 4
    n_head: int = 8
    d_model: int = 128
    family: str = "gpt"
    n_persistent: int = 64  # all_attention only: persistent key/value vectors per head
    dropout: float = 0.0
    # Heads per layer after physical pruning; empty means n_head in every layer.
    heads_per_layer: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.family not in BUILT_IN:
            raise ValueError(f"model family must be one of {BUILT_IN}, got {self.family!r}")
        if self.d_model % self.n_head:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_head ({self.n_head})")
        if self.heads_per_layer and len(self.heads_per_layer) != self.n_layer:
            raise ValueError("heads_per_layer needs one count per layer")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_head

    @property
    def layer_heads(self) -> tuple[int, ...]:
        return self.heads_per_layer or (self.n_head,) * self.n_layer

    @property
    def persistent_keys(self) -> int:
        """Keys a head attends to besides the context's: all_attention's persistent vectors."""
        return self.n_persistent if self.family == "all_attention" else 0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ModelConfig:
        return cls(**{**data, "heads_per_layer": tuple(data.get("heads_per_layer", ()))})


class Attention(nn.Module):
    """Causal multi-head attention with one gate per head on its output."""

    def __init__(self, cfg: ModelConfig, n_head: int) -> None:
        super().__init__()
        self.n_head, self.d_head = n_head, cfg.d_head
        self.persistent = cfg.family == "all_attention"
        inner = n_head * self.d_head
        # Rows are laid out [q heads | k heads | v heads], d_head rows per head.
        self.qkv = nn.Linear(cfg.d_model, 3 * inner)
        self.proj = nn.Linear(inner, cfg.d_model)
        if self.persistent:
            n = cfg.n_persistent
            self.n_persistent = n
            self.persistent_k = nn.Parameter(torch.randn(n_head, n, self.d_head) / math.sqrt(self.d_head))
            self.persistent_v = nn.Parameter(torch.randn(n_head, n, self.d_head) / math.sqrt(n))
            # Shim et al.'s scales of the persistent keys and values, one multiply for both: a
            # buffer (it follows the model's device and dtype), not saved (it is not a weight).
            scales = torch.tensor([math.sqrt(self.d_head), math.sqrt(n)]).view(2, 1, 1, 1)
            self.register_buffer("persistent_scale", scales, persistent=False)
        self.dropout = cfg.dropout
        self._masks: dict[tuple, torch.Tensor] = {}

    def _mask(self, T: int, like: torch.Tensor) -> torch.Tensor:
        """Additive mask over [context ; persistent] (0 where a position may attend, -inf where
        not), built once per length and dtype: a boolean mask costs two ``where`` per call."""
        key = (T, like.device, like.dtype)
        if key not in self._masks:
            allowed = torch.ones(T, T + self.n_persistent, dtype=torch.bool, device=like.device)
            allowed[:, :T] = torch.ones(T, T, dtype=torch.bool, device=like.device).tril()
            mask = torch.zeros(allowed.shape, dtype=like.dtype, device=like.device)
            self._masks = {key: mask.masked_fill(~allowed, float("-inf"))}  # one length at a time
        return self._masks[key]

    def forward(self, x: torch.Tensor, gate: torch.Tensor | None = None) -> torch.Tensor:
        B, T, _ = x.shape
        if self.n_head == 0:  # every head removed: only the projection's bias is left
            return self.proj.bias.expand(B, T, -1)
        # (3, B, H, T, d): views of the one projection's output, no copy.
        qkv = self.qkv(x).view(B, T, 3, self.n_head, self.d_head).permute(2, 0, 3, 1, 4)
        p = self.dropout if self.training else 0.0
        if self.persistent:
            # Shim et al.'s code scales persistent keys by sqrt(d_h) and values by sqrt(N); the
            # softmax runs over [context ; persistent], only the context part causally masked.
            # Keys and values are joined to their persistent vectors in one copy: at batch 1 the
            # number of operations, not their size, sets the time.
            persistent = torch.stack([self.persistent_k, self.persistent_v]) * self.persistent_scale
            k, v = torch.cat([qkv[1:], persistent.unsqueeze(1).expand(-1, B, -1, -1, -1)], dim=3)
            y = F.scaled_dot_product_attention(qkv[0], k, v, attn_mask=self._mask(T, x), dropout_p=p)
        else:
            q, k, v = qkv
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
        y = y.transpose(1, 2).reshape(B, T, self.n_head * self.d_head)
        if gate is None:
            return self.proj(y)
        # z_h multiplies head h before the projection. Scaling W_O's columns instead of the
        # activations is the same product and touches d_model x inner numbers, not B x T x inner.
        weight = self.proj.weight * gate.repeat_interleave(self.d_head).to(self.proj.weight.dtype)
        return F.linear(y, weight, self.proj.bias)

    def scaled_persistent(self) -> torch.Tensor:
        """The persistent keys and values as the softmax sees them, (2, n_head, n_persistent, d)."""
        return torch.stack([self.persistent_k, self.persistent_v]).mul_(self.persistent_scale)

    def infer(self, x: torch.Tensor, B: int, T: int, persistent: torch.Tensor | None = None) -> torch.Tensor:
        """``forward`` without gates or dropout on a (B*T, d_model) input, for
        ``LanguageModel._infer``: the attention output as (B*T, d_model). ``persistent``:
        ``scaled_persistent()``, which the model may have computed for every layer at once."""
        if self.n_head == 0:
            return self.proj.bias
        H, d = self.n_head, self.d_head
        qkv = F.linear(x, self.qkv.weight, self.qkv.bias).view(B, T, 3, H, d).permute(2, 0, 3, 1, 4)
        if self.persistent:  # as forward; narrow/select rather than indexing: fewer microseconds
            persistent = self.scaled_persistent() if persistent is None else persistent
            k, v = torch.cat([qkv.narrow(0, 1, 2), persistent.unsqueeze(1).expand(-1, B, -1, -1, -1)], dim=3)
            y = F.scaled_dot_product_attention(qkv.select(0, 0), k, v, attn_mask=self._mask(T, x))
        else:
            q, k, v = qkv
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.linear(y.transpose(1, 2).reshape(B * T, H * d), self.proj.weight, self.proj.bias)


def _layer_norm(ln: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, ln.normalized_shape, ln.weight, ln.bias, ln.eps)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.proj = nn.Linear(4 * cfg.d_model, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, n_head: int) -> None:
        super().__init__()
        self.ln_attn = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg, n_head)
        self.has_mlp = cfg.family == "gpt"
        if self.has_mlp:
            self.ln_mlp = nn.LayerNorm(cfg.d_model)
            self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, gate: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        attn_out = self.attn(self.ln_attn(x), gate)
        x = x + attn_out
        if self.has_mlp:
            x = x + self.mlp(self.ln_mlp(x))
        return x, attn_out


class LanguageModel(nn.Module):
    """Decoder-only character model with tied input/output embeddings and learned positions."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.block_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, h) for h in cfg.layer_heads)
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(
        self,
        idx: torch.Tensor,
        head_gates: list[torch.Tensor] | None = None,
        return_attn: bool = False,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Logits (B, T, vocab); with ``return_attn`` also each layer's attention output."""
        T = idx.shape[1]
        if self.cfg.block_size < T:
            raise ValueError(f"sequence of {T} tokens is longer than block_size {self.cfg.block_size}")
        if head_gates is None and not return_attn and not self.training and not torch.is_grad_enabled():
            return self._infer(idx), []
        x = self.tok_emb(idx) + self.pos_emb.weight[:T]  # positions 0..T-1: a view, no lookup
        attn_outputs = []
        for i, block in enumerate(self.blocks):
            x, attn_out = block(x, None if head_gates is None else head_gates[i])
            if return_attn:
                attn_outputs.append(attn_out)
        return self.head(self.ln_f(x)), attn_outputs

    def _infer(self, idx: torch.Tensor) -> torch.Tensor:
        """The logits of ``forward`` when nothing needs gradients, gates or the attention outputs
        (evaluation, generation, a pruned model in use), bit for bit the same numbers.

        At batch 1 the matrices are small and the time goes to the number of operations and the
        Python around them, the same for every head count: this fixed cost is what kept a pruned
        model's speed-up below its FLOPs ratio. So the same kernels run without the modules'
        calls, on a (B*T, d_model) residual stream updated in place (no autograd to keep the old
        values for), the MLP and the projections added into it as they come."""
        B, T = idx.shape
        x = F.embedding(idx, self.tok_emb.weight)
        x += self.pos_emb.weight[:T]
        x = x.view(B * T, -1)
        for block, persistent in zip(self.blocks, self._scaled_persistent()):
            x += block.attn.infer(_layer_norm(block.ln_attn, x), B, T, persistent)
            if block.has_mlp:
                mlp = block.mlp
                h = F.gelu(F.linear(_layer_norm(block.ln_mlp, x), mlp.fc.weight, mlp.fc.bias))
                x += F.linear(h, mlp.proj.weight, mlp.proj.bias)
        return F.linear(_layer_norm(self.ln_f, x), self.head.weight).view(B, T, -1)

    def _scaled_persistent(self) -> list[torch.Tensor | None]:
        """Each layer's ``Attention.scaled_persistent()`` (None for the gpt family): where every
        layer keeps as many heads (a dense model, an even pruning) one stack and one multiply for
        all of them, two operations where one per layer would be twice as many as layers."""
        attentions = [block.attn for block in self.blocks]
        if self.cfg.family != "all_attention":
            return [None] * len(attentions)
        tensors = [t for a in attentions for t in (a.persistent_k, a.persistent_v)]
        if len({t.shape for t in tensors}) > 1:
            return [a.scaled_persistent() for a in attentions]
        stacked = torch.stack(tensors).view(len(attentions), 2, *tensors[0].shape)
        # every layer's scales are the same two numbers (d_head and n_persistent are the model's)
        return list(stacked.mul_(attentions[0].persistent_scale).unbind(0))

    def loss(
        self, idx: torch.Tensor, targets: torch.Tensor, head_gates: list[torch.Tensor] | None = None
    ) -> torch.Tensor:
        logits, _ = self(idx, head_gates)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    def count_parameters(self) -> tuple[int, int]:
        """(total, non-embedding) parameters; tied weights count once, embeddings are tokens +
        positions."""
        total = sum(p.numel() for p in self.parameters())
        embedding = self.tok_emb.weight.numel() + self.pos_emb.weight.numel()
        return total, total - embedding

    def saved_state(self) -> dict[str, torch.Tensor]:
        """The weights to write to disk: the output head shares the token embedding, stored once."""
        return {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items() if k != "head.weight"}

    def load_saved_state(self, state: dict[str, torch.Tensor]) -> None:
        self.load_state_dict({**state, "head.weight": state["tok_emb.weight"]})

    @torch.no_grad()
    def prune_heads(self, keep: list[list[int]], head_scale: list[float] | None = None) -> LanguageModel:
        """A new model holding only the heads in ``keep`` (indices per layer), same outputs as the
        masked model. ``head_scale`` folds a per-layer constant on the surviving heads (attention
        output scaling) into the output projection."""
        cfg = self.cfg
        if len(keep) != cfg.n_layer:
            raise ValueError(f"keep needs one list per layer ({cfg.n_layer}), got {len(keep)}")
        pruned_cfg = replace(cfg, heads_per_layer=tuple(len(k) for k in keep))
        pruned = LanguageModel(pruned_cfg).to(next(self.parameters()).device)
        outside_attention = {k: v for k, v in self.state_dict().items() if ".attn." not in k}
        pruned.load_state_dict(outside_attention, strict=False)  # attention is sliced below
        d = cfg.d_head
        for layer, (src, dst) in enumerate(zip(self.blocks, pruned.blocks)):
            heads = sorted(keep[layer])
            src_h, inner = src.attn.n_head, src.attn.n_head * d
            if any(h < 0 or h >= src_h for h in heads) or len(set(heads)) != len(heads):
                raise ValueError(f"layer {layer}: head indices {heads} are not distinct heads of {src_h}")
            cols = torch.tensor([h * d + i for h in heads for i in range(d)], dtype=torch.long)
            rows = torch.cat([cols + part * inner for part in range(3)])
            dst.attn.qkv.weight.copy_(src.attn.qkv.weight[rows.to(src.attn.qkv.weight.device)])
            dst.attn.qkv.bias.copy_(src.attn.qkv.bias[rows.to(src.attn.qkv.bias.device)])
            scale = 1.0 if head_scale is None else head_scale[layer]
            dst.attn.proj.weight.copy_(src.attn.proj.weight[:, cols.to(src.attn.proj.weight.device)] * scale)
            dst.attn.proj.bias.copy_(src.attn.proj.bias)
            if src.attn.persistent:
                idx = torch.tensor(heads, dtype=torch.long, device=src.attn.persistent_k.device)
                dst.attn.persistent_k.copy_(src.attn.persistent_k[idx])
                dst.attn.persistent_v.copy_(src.attn.persistent_v[idx])
        return pruned


class BuiltInFamily(ModelFamily):
    """``gpt`` and ``all_attention``: built from the sizes, saved in the project's own format."""

    keys = {
        "n_persistent": {
            "type": int,
            "default": 64,
            "low": 1,
            "doc": "all_attention: persistent key/value vectors per head (not for hf)",
        }
    }

    def __init__(self, name: str) -> None:
        self.name = name

    def model_config(self, model: dict, vocab_size: int, user_model: str | None) -> ModelConfig:
        sizes = {key: model[key] for key in (*SHARED_MODEL_KEYS, *self.keys)}
        return ModelConfig(vocab_size=vocab_size, family=self.name, **sizes)

    def config_from_dict(self, data: dict) -> ModelConfig:
        return ModelConfig.from_dict(data)

    def build_model(self, cfg: ModelConfig) -> LanguageModel:
        return LanguageModel(cfg)


for _name in BUILT_IN:
    register_family(BuiltInFamily(_name))
