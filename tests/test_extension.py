"""The README's walk, held true: a pruning method and a model family defined in this file alone
(each registered where ``HEADPRUNE_PLUGINS`` names this module: trainers/plugins.py) run a
smoke study, and a trial's model exports.

This module imports nothing of the project but the two registries, the knobs and the gates, as
a plugin must: the registries import it while they are being filled.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from trainers.families import SHARED_MODEL_KEYS, ModelFamily, register_family
from trainers.gates import select_heads
from trainers.knobs import bounded
from trainers.plugins import plugin_modules
from trainers.pruning.registry import Method, PruneContext, PruneOutcome, register

# -- the method: keep the first heads of every layer, or the last -------------------------------


def keep_in_order(context: PruneContext) -> PruneOutcome:
    """Heads ranked by their index (from the end with ``keep_last``), the exact budget kept."""
    heads = context.heads
    order = torch.cat([torch.arange(n, 0, -1, dtype=torch.float) for n in heads])
    scores = -order if context.hp.keep_last else order
    keep = select_heads(scores, heads, context.hp.sparsity, context.hp.min_heads_per_layer)
    return PruneOutcome(keep, None, trained_steps=0)


IN_ORDER = Method(
    "in_order",
    keep_in_order,
    removes_target=True,
    knobs={"keep_last": bounded(False, doc="keep the last heads of a layer, not the first")},
    doc="the first (or last) heads of every layer",
)

# -- the family: one attention layer, no MLP -----------------------------------------------------


@dataclass(frozen=True)
class OneLayerConfig:
    vocab_size: int
    block_size: int
    n_head: int
    d_model: int
    family: str = "one_layer"
    heads_per_layer: tuple[int, ...] = field(default=())

    @property
    def layer_heads(self) -> tuple[int, ...]:
        return self.heads_per_layer or (self.n_head,)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> OneLayerConfig:
        return cls(**{**data, "heads_per_layer": tuple(data.get("heads_per_layer", ()))})


class OneLayer(nn.Module):
    """Token and position embeddings, one causal attention layer with a gate per head, tied output."""

    def __init__(self, cfg: OneLayerConfig) -> None:
        super().__init__()
        self.cfg, (heads,) = cfg, cfg.layer_heads
        self.d_head = cfg.d_model // cfg.n_head
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.block_size, cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * heads * self.d_head)
        self.proj = nn.Linear(heads * self.d_head, cfg.d_model)

    def forward(self, idx, head_gates=None, return_attn=False):
        B, T = idx.shape
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(T, device=idx.device))
        q, k, v = self.qkv(x).view(B, T, 3, -1, self.d_head).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, heads, T, d_head)
        if head_gates is not None:
            y = y * head_gates[0].view(1, -1, 1, 1)
        attn = self.proj(y.transpose(1, 2).reshape(B, T, -1))
        return (x + attn) @ self.tok_emb.weight.T, [attn] if return_attn else []

    def loss(self, idx, targets, head_gates=None):
        logits, _ = self(idx, head_gates)
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    @torch.no_grad()
    def prune_heads(self, keep, head_scale=None):
        heads = sorted(keep[0])
        pruned = OneLayer(replace(self.cfg, heads_per_layer=(len(heads),)))
        pruned.load_state_dict(
            {k: v for k, v in self.state_dict().items() if not k.startswith(("qkv", "proj"))}, strict=False
        )
        d, inner = self.d_head, self.qkv.out_features // 3
        cols = torch.tensor([h * d + i for h in heads for i in range(d)])
        rows = torch.cat([cols + part * inner for part in range(3)])
        pruned.qkv.weight.copy_(self.qkv.weight[rows])
        pruned.qkv.bias.copy_(self.qkv.bias[rows])
        scale = 1.0 if head_scale is None or head_scale[0] is None else head_scale[0]
        pruned.proj.weight.copy_(self.proj.weight[:, cols] * scale)
        pruned.proj.bias.copy_(self.proj.bias)
        return pruned

    def count_parameters(self):
        total = sum(p.numel() for p in self.parameters())
        return total, total - self.tok_emb.weight.numel() - self.pos_emb.weight.numel()

    def saved_state(self):
        return {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}

    def load_saved_state(self, state):
        self.load_state_dict(state)


class OneLayerFamily(ModelFamily):
    name = "one_layer"
    keys = {}  # the shared sizes only

    def check_table(self, model, given):
        if model["n_layer"] != 1:
            raise ValueError(f"n_layer: the one_layer family has one layer, not {model['n_layer']}")

    def model_config(self, model, vocab_size, user_model):
        return OneLayerConfig(vocab_size, model["block_size"], model["n_head"], model["d_model"])

    def config_from_dict(self, data):
        return OneLayerConfig.from_dict(data)

    def build_model(self, cfg):
        return OneLayer(cfg)


if __name__ in plugin_modules():  # registered in the processes of the study below only
    register(IN_ORDER)
    register_family(OneLayerFamily())


# -- the tests -----------------------------------------------------------------------------------


def test_the_family_prunes_as_the_mask_does():
    """The family's model computes with heads removed what it computes with their gates at 0."""
    model = OneLayer(OneLayerConfig(vocab_size=20, block_size=8, n_head=4, d_model=16))
    idx = torch.randint(0, 20, (2, 8))
    gates = [torch.tensor([1.0, 0.0, 1.0, 0.0])]
    pruned = model.prune_heads([[0, 2]])
    assert pruned.cfg.layer_heads == (2,) and pruned.count_parameters()[0] < model.count_parameters()[0]
    assert torch.allclose(model(idx, gates)[0], pruned(idx)[0], atol=1e-5)
    assert set(OneLayerFamily.keys).isdisjoint(SHARED_MODEL_KEYS)


@pytest.mark.parametrize("keep_last, kept", [(False, [[0, 1]]), (True, [[2, 3]])])
def test_the_method_keeps_the_first_or_last_heads(keep_last, kept):
    hp = type("HP", (), {"keep_last": keep_last, "sparsity": 0.5, "min_heads_per_layer": 1})()
    model = OneLayer(OneLayerConfig(vocab_size=20, block_size=8, n_head=4, d_model=16))
    context = PruneContext(model, torch.zeros(10, dtype=torch.long), hp, 1, 1, torch.Generator())
    assert [sorted(k) for k in keep_in_order(context).keep] == kept


STUDY = """
[study]
name = "extension"
n_trials = 3
max_concurrent = 1
cpus_per_trial = 1

[corpus]
path = "{corpus}"

[model]
family = "one_layer"
n_layer = 1
n_head = 4
d_model = 32
block_size = 32

[pretrain]
steps = 40
batch_size = 16
warmup_steps = 5

[trial]
prune_steps = 10
finetune_steps = 10
batch_size = 16
eval_tokens = 2048

[search]
method = "in_order"
sparsity = {{ low = 0.25, high = 0.75 }}
keep_last = [true, false]

[early_stopping]
enabled = false
"""


@pytest.mark.slow
def test_a_method_and_a_family_of_ones_own_run_a_study_and_export(tmp_path):
    import optuna
    from helpers import (
        CORPUS,
        heads,
        hparams,
        kill_new_ray_processes,
        launch,
        leftover_ray_processes,
        ray_processes,
    )
    from optuna.trial import TrialState

    study = tmp_path / "extension.toml"
    study.write_text(STUDY.format(corpus=CORPUS))
    url = f"sqlite:///{tmp_path}/extension.db"
    tests = str(Path(__file__).parent)
    env = {
        "HEADPRUNE_PLUGINS": Path(__file__).stem,
        "PYTHONPATH": os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")])),
    }
    before = ray_processes()
    try:
        run = launch("run", str(study), "--storage", url, cwd=tmp_path, env=env)
        assert run.returncode == 0, run.stderr[-3000:]
        trials = optuna.load_study(study_name="extension", storage=url).trials
        assert [t.state for t in trials] == [TrialState.COMPLETE] * 3
        pruned = [t for t in trials if not t.user_attrs.get("dense_control")]
        assert [hparams(t)["method"] for t in pruned] == ["in_order", "in_order"]
        assert all("keep_last" in t.params for t in pruned)  # the method's own knob was searched
        for t in pruned:  # the family's one layer keeps round((1 - sparsity) x 4) heads
            assert heads(t) == [round(4 * (1 - t.params["sparsity"]))]
        out = tmp_path / "exported"
        export = launch(
            "export-model",
            "--storage",
            url,
            "--study-name",
            "extension",
            "--trial",
            str(pruned[0].number),
            "--output",
            str(out),
            cwd=tmp_path,
            env=env,
        )
        assert export.returncode == 0, export.stderr[-3000:]
        assert (out / "model.safetensors").is_file()
        without = launch("run", str(study), "--storage", f"sqlite:///{tmp_path}/other.db", cwd=tmp_path)
        assert without.returncode == 2 and "family" in without.stderr.splitlines()[-1]  # no plugin: one line
    finally:
        kill_new_ray_processes(before)
    assert not leftover_ray_processes(before)


@pytest.mark.slow  # a process of its own: the registries of this one are filled already
def test_a_plugin_that_cannot_be_imported_is_one_line_and_writes_nothing(tmp_path):
    from helpers import SMOKE, launch

    run = launch(
        "run",
        str(SMOKE),
        "--storage",
        f"sqlite:///{tmp_path}/s.db",
        cwd=tmp_path,
        env={"HEADPRUNE_PLUGINS": "no_such_module"},
    )
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2 and len(lines) == 1, run.stderr
    assert "HEADPRUNE_PLUGINS names 'no_such_module'" in lines[0]
    assert list(tmp_path.iterdir()) == []
