"""The hf family (trainers/hf/) on tiny random models built from configs: nothing is downloaded."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModelForCausalLM

from trainers.families import build_model, config_from_dict
from trainers.hf import (
    ARCHITECTURES,
    HFLanguageModel,
    HFModelConfig,
    ModelNotFound,
    load_pruned,
    read_pretrained_config,
    save_pretrained,
    weights_digest,
)

VOCAB, BLOCK, N_LAYER, N_HEAD, D_MODEL = 40, 16, 2, 4, 32
D_HEAD = D_MODEL // N_HEAD
# Per architecture, a keep with a different count in each layer. For llama (kv heads 0 and 1 serve
# query heads {0, 1} and {2, 3}) layer 0 drops kv head 0 with its whole group and layer 1 keeps both
# kv heads with uneven groups, [0, 1] on kv 0 and [3] on kv 1.
KEEP = {"gpt2": [[0, 2, 3], [1]], "gpt_neox": [[1], [0, 1, 3]], "llama": [[2, 3], [0, 1, 3]]}
SCALE = [1.5, 0.5]


def tiny(architecture: str) -> HFLanguageModel:
    n_kv_head = 2 if architecture == "llama" else None  # grouped-query attention, 2 query heads per kv head
    model = HFLanguageModel.from_architecture(
        architecture,
        vocab_size=VOCAB,
        n_layer=N_LAYER,
        n_head=N_HEAD,
        d_model=D_MODEL,
        block_size=BLOCK,
        n_kv_head=n_kv_head,
    )
    return model.eval()


def tokens(batch: int = 2, length: int = BLOCK) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length))


def masks(keep: list[list[int]], layer_heads, scale=None) -> list[torch.Tensor]:
    """Gates that do what pruning does: ``scale`` (or 1) on kept heads, 0 on the rest."""
    gates = []
    for layer, (heads, n) in enumerate(zip(keep, layer_heads)):
        gate = torch.zeros(n)
        gate[heads] = 1.0 if scale is None else scale[layer]
        gates.append(gate)
    return gates


def unique_parameters(model: HFLanguageModel) -> int:
    seen = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        seen[p.data_ptr()] = p.numel()
    return sum(seen.values())


@pytest.fixture(params=ARCHITECTURES)
def architecture(request) -> str:
    return request.param


@pytest.mark.parametrize("scale", [None, SCALE], ids=["unscaled", "head_scale"])
def test_pruned_model_matches_masked_model(architecture, scale):
    model, x = tiny(architecture), tokens()
    keep = KEEP[architecture]
    with torch.no_grad():
        masked, _ = model(x, masks(keep, model.cfg.layer_heads, scale))
        pruned = model.prune_heads(keep, head_scale=scale)
        sliced, _ = pruned(x)
    assert pruned.cfg.layer_heads == tuple(len(k) for k in keep)
    assert (sliced - masked).abs().max() < 1e-4
    # The source model is left as it was.
    assert model.cfg.layer_heads == (N_HEAD,) * N_LAYER


def test_pruning_a_pruned_model_uses_its_numbering(architecture):
    model, x = tiny(architecture), tokens()
    once = model.prune_heads(KEEP[architecture])
    first, second = once.cfg.layer_heads
    again_keep = [[first - 1], sorted({0, second - 1})]
    with torch.no_grad():
        masked, _ = once(x, masks(again_keep, once.cfg.layer_heads))
        sliced, _ = once.prune_heads(again_keep)(x)
    assert (sliced - masked).abs().max() < 1e-4


def test_grouped_query_pruning_drops_unused_kv_heads():
    pruned = tiny("llama").prune_heads(KEEP["llama"])
    assert pruned.cfg.kv_heads_per_layer == ((0, 0), (0, 0, 1))
    layer0, layer1 = (layer.self_attn for layer in pruned.hf.model.layers)
    assert layer0.k_proj.weight.shape[0] == D_HEAD  # the group of kv head 0 is gone
    assert layer1.k_proj.weight.shape[0] == 2 * D_HEAD


def test_parameter_count_drops_by_the_removed_heads(architecture):
    model = tiny(architecture)
    keep = KEEP[architecture]
    pruned = model.prune_heads(keep)
    dense_total, dense_nonembed = model.count_parameters()
    total, nonembed = pruned.count_parameters()
    assert dense_total == unique_parameters(model) and total == unique_parameters(pruned)
    assert dense_total - total == dense_nonembed - nonembed

    bias = model.cfg.hf_config.get("attention_bias", True)  # GPT-2's attention always has biases
    per_query_head = 2 * D_MODEL * D_HEAD + (D_HEAD if bias else 0)  # query rows + output columns
    per_kv_head = 2 * (D_MODEL * D_HEAD + (D_HEAD if bias else 0))  # key and value rows
    removed_query = sum(N_HEAD - len(k) for k in keep)
    group = N_HEAD // model.cfg.n_kv_head
    removed_kv = sum(model.cfg.n_kv_head - len({h // group for h in k}) for k in keep)
    assert dense_total - total == removed_query * per_query_head + removed_kv * per_kv_head


def test_embeddings_are_tokens_and_learned_positions(architecture):
    model = tiny(architecture)
    total, nonembed = model.count_parameters()
    embedding = VOCAB * D_MODEL + (BLOCK * D_MODEL if architecture == "gpt2" else 0)
    assert total - nonembed == embedding


def test_gradients_reach_the_gates(architecture):
    model, x = tiny(architecture).train(), tokens()
    gates = [torch.full((n,), 0.7, requires_grad=True) for n in model.cfg.layer_heads]
    model.loss(x[:, :-1], x[:, 1:], gates).backward()
    for gate in gates:
        assert gate.grad is not None and gate.grad.abs().sum() > 0


def test_gates_are_cleared_after_the_call(architecture):
    model, x = tiny(architecture), tokens()
    with torch.no_grad():
        plain, _ = model(x)
        model(x, [torch.zeros(n) for n in model.cfg.layer_heads])
        after, _ = model(x)
    assert torch.equal(plain, after)


def test_saved_state_round_trip(architecture, tmp_path):
    pruned = tiny(architecture).prune_heads(KEEP[architecture], head_scale=SCALE)
    save_file(pruned.saved_state(), str(tmp_path / "model.safetensors"))
    cfg = config_from_dict(json.loads(json.dumps(pruned.cfg.to_dict())))
    assert cfg == pruned.cfg
    restored = build_model(cfg)
    assert isinstance(restored, HFLanguageModel)
    restored.load_saved_state(load_file(str(tmp_path / "model.safetensors")))
    restored.eval()
    x = tokens()
    with torch.no_grad():
        assert torch.equal(restored(x)[0], pruned(x)[0])
    if architecture == "gpt2":  # the tied output head shares the embedding again
        assert restored.hf.lm_head.weight is restored.hf.transformer.wte.weight


def test_save_pretrained_and_load_pruned(architecture, tmp_path):
    pruned = tiny(architecture).prune_heads(KEEP[architecture], head_scale=SCALE)
    save_pretrained(pruned, tmp_path / "export")
    written = json.loads((tmp_path / "export" / "config.json").read_text())
    assert written["headprune_heads_per_layer"] == [len(k) for k in KEEP[architecture]]
    assert written["headprune_block_size"] == BLOCK
    loaded = load_pruned(tmp_path / "export")
    assert not loaded.training
    x = tokens()
    with torch.no_grad():
        assert (loaded(input_ids=x, use_cache=False).logits - pruned(x)[0]).abs().max() < 1e-6
    generated = loaded.generate(x[:, :4], max_new_tokens=5, do_sample=False)
    assert generated.shape == (2, 9)
    # The KV cache path (one query at a time) computes what a full forward pass does.
    with torch.no_grad():
        full = pruned(generated[:, :-1])[0][:, 3:].argmax(-1)
    assert torch.equal(full, generated[:, 4:])


def test_a_dense_export_is_a_plain_transformers_folder(architecture, tmp_path):
    model = tiny(architecture)
    save_pretrained(model, tmp_path)
    plain = AutoModelForCausalLM.from_pretrained(tmp_path, local_files_only=True).eval()
    x = tokens()
    with torch.no_grad():
        assert (plain(input_ids=x).logits - model(x)[0]).abs().max() < 1e-5
        assert torch.equal(load_pruned(tmp_path)(input_ids=x).logits, model(x)[0])
    assert read_pretrained_config(tmp_path)["model_type"] == architecture


def test_from_pretrained_reads_a_pruned_export(tmp_path):
    pruned = tiny("llama").prune_heads(KEEP["llama"])
    save_pretrained(pruned, tmp_path)
    again = HFLanguageModel.from_pretrained(tmp_path, block_size=8)
    assert again.cfg.kv_heads_per_layer == pruned.cfg.kv_heads_per_layer and again.cfg.block_size == 8
    x = tokens(length=8)
    with torch.no_grad():
        assert torch.equal(again(x)[0], pruned(x)[0])


def test_from_pretrained_of_a_plain_transformers_folder(architecture, tmp_path):
    plain = AutoModelForCausalLM.from_config(AutoConfig.for_model(**tiny(architecture).cfg.hf_config)).eval()
    plain.save_pretrained(tmp_path)
    assert read_pretrained_config(tmp_path)["model_type"] == architecture
    plain.save_pretrained(tmp_path / "elsewhere")  # the same model's config wherever it is read from
    assert read_pretrained_config(tmp_path / "elsewhere") == read_pretrained_config(tmp_path)
    assert weights_digest(tmp_path / "elsewhere") == weights_digest(tmp_path)
    model = HFLanguageModel.from_pretrained(str(tmp_path), block_size=8)
    assert model.cfg.block_size == 8 and model.cfg.layer_heads == (N_HEAD,) * N_LAYER
    x = tokens(length=8)
    with torch.no_grad():
        assert (model(x)[0] - plain(input_ids=x).logits).abs().max() < 1e-5
    with pytest.raises(ValueError, match="block_size"):
        HFLanguageModel.from_pretrained(tmp_path, block_size=BLOCK + 1)


@pytest.mark.parametrize(
    "architecture, head", [("llama", "lm_head.weight"), ("gpt_neox", "embed_out.weight")]
)
def test_an_untied_output_head_missing_from_the_files_is_refused(architecture, head, tmp_path):
    """Found in review: a missing output head was let through as if tied, and the study pruned a
    model whose head transformers had drawn at random (transformers lists a tied head as present)."""
    plain = AutoModelForCausalLM.from_config(AutoConfig.for_model(**tiny(architecture).cfg.hf_config))
    assert not plain.config.tie_word_embeddings
    plain.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    del weights[head]
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match="do not fit its config.json"):
        HFLanguageModel.from_pretrained(tmp_path, block_size=8)


def test_missing_model_is_named_with_the_command_that_fetches_it():
    with pytest.raises(ModelNotFound) as err:
        HFLanguageModel.from_pretrained("headprune-tests/no-such-model", block_size=8)
    assert str(err.value) == (
        "model 'headprune-tests/no-such-model' is not a local folder nor in the Hugging Face cache; "
        "fetch it first with: hf download headprune-tests/no-such-model"
    )


def test_unsupported_architecture_is_named(tmp_path):
    AutoConfig.for_model("opt", vocab_size=VOCAB, hidden_size=16).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="'opt'.*gpt2"):
        HFLanguageModel.from_pretrained(tmp_path, block_size=8)


def test_return_attn_gives_each_layers_projected_output(architecture):
    model, x = tiny(architecture), tokens(length=10)
    for candidate in (model, model.prune_heads(KEEP[architecture])):
        logits, attn = candidate(x, return_attn=True)
        assert logits.shape == (2, 10, VOCAB)
        assert [a.shape for a in attn] == [(2, 10, D_MODEL)] * N_LAYER
        assert candidate(x)[1] == []


@pytest.mark.parametrize(
    "keep, message",
    [
        ([[0], []], "at least one head"),
        ([[0], [4]], "distinct"),
        ([[1, 1], [0]], "distinct"),
        ([[0]], "per layer"),
    ],
)
def test_bad_keep_is_refused(keep, message):
    with pytest.raises(ValueError, match=message):
        tiny("llama").prune_heads(keep)


def test_config_checks_its_shapes():
    cfg = tiny("llama").cfg
    with pytest.raises(ValueError, match="block_size"):
        HFModelConfig(hf_config=cfg.hf_config, block_size=BLOCK + 1)
    with pytest.raises(ValueError, match="kv head"):
        HFModelConfig(
            hf_config=cfg.hf_config, block_size=BLOCK, heads_per_layer=(1, 1), kv_heads_per_layer=((1,), (0,))
        )
