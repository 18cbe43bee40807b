import pytest
import torch

from trainers.gates import mask_from_keep
from trainers.model import LanguageModel, ModelConfig

FAMILIES = ["gpt", "all_attention"]


def tiny(family: str, **kw) -> LanguageModel:
    cfg = ModelConfig(
        vocab_size=20, block_size=16, n_layer=3, n_head=4, d_model=32, family=family, n_persistent=8, **kw
    )
    model = LanguageModel(cfg)
    # Non-trivial biases and persistent vectors, so slicing mistakes would show.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


@pytest.mark.parametrize("family", FAMILIES)
def test_sliced_model_matches_masked_model(family):
    model = tiny(family)
    keep = [[0, 2], [3], [0, 1, 2, 3]]
    x = torch.randint(0, 20, (3, 16))
    masked, _ = model(x, mask_from_keep(keep, [4, 4, 4]))
    sliced, _ = model.prune_heads(keep)(x)
    assert (masked - sliced).abs().max().item() < 1e-5


@pytest.mark.parametrize("family", FAMILIES)
def test_head_scale_is_folded_into_the_projection(family):
    model = tiny(family)
    keep = [[1, 2], [0], [3]]
    scale = [2.0, 4.0, 4.0]
    x = torch.randint(0, 20, (2, 16))
    gates = [m * s for m, s in zip(mask_from_keep(keep, [4, 4, 4]), scale)]
    masked, _ = model(x, gates)
    sliced, _ = model.prune_heads(keep, head_scale=scale)(x)
    assert (masked - sliced).abs().max().item() < 1e-5


def test_a_layer_with_no_heads_left_still_runs_and_matches():
    model = tiny("gpt")
    keep = [[], [1], [2]]
    x = torch.randint(0, 20, (2, 16))
    masked, _ = model(x, mask_from_keep(keep, [4, 4, 4]))
    sliced, _ = model.prune_heads(keep)(x)
    assert (masked - sliced).abs().max().item() < 1e-5


def test_gpt_parameter_count_falls_by_each_heads_share():
    model = tiny("gpt")
    total, nonembed = model.count_parameters()
    assert total - nonembed == 20 * 32 + 16 * 32  # token + position embeddings (head is tied)
    pruned_total, _ = model.prune_heads([[0], [0, 1], [0, 1, 2, 3]]).count_parameters()
    d_head = 8
    per_head = 3 * (32 * d_head + d_head) + d_head * 32  # q,k,v rows and biases, W_O columns
    assert total - pruned_total == 5 * per_head


def test_all_attention_nonembedding_parameters_are_proportional_to_heads_kept():
    model = tiny("all_attention")
    _, dense = model.count_parameters()
    counts = {}
    for kept in (12, 6, 3):
        per_layer = [kept // 3] * 3
        keep = [list(range(n)) for n in per_layer]
        _, counts[kept] = model.prune_heads(keep).count_parameters()
    # Non-embedding = per-head parameters * heads + a fixed remainder (LayerNorms, W_O bias).
    fixed = dense - 12 * (dense - counts[6]) / 6
    for kept, n in counts.items():
        assert n - fixed == pytest.approx((dense - fixed) * kept / 12)
    # The remainder is exactly the LayerNorms (one per layer, one final) and W_O's biases.
    assert fixed == pytest.approx(3 * 2 * 32 + 2 * 32 + 3 * 32)


def test_config_rejects_heads_not_dividing_width():
    with pytest.raises(ValueError, match="divisible"):
        ModelConfig(vocab_size=10, d_model=30, n_head=4)


def test_config_round_trips_through_a_dict():
    cfg = ModelConfig(vocab_size=10, heads_per_layer=(1, 2, 3, 4))
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("family", FAMILIES)
def test_inference_path_gives_the_modules_logits(family):
    """Without gradients the model skips its modules' calls (LanguageModel._infer): the same
    numbers, dense, pruned unevenly and with a layer of no heads, any batch and length."""
    model = tiny(family)
    for m in (model, model.prune_heads([[0, 2], [], [1, 2, 3]])):
        for shape in ((3, 16), (1, 7)):
            x = torch.randint(0, 20, shape)
            expected, _ = m(x)  # gradients on: the modules' path
            assert expected.requires_grad
            with torch.no_grad():
                fast, _ = m(x)
            with torch.inference_mode():
                fastest, _ = m(x)
            assert torch.equal(fast, expected.detach()) and torch.equal(fastest, fast)


def test_inference_path_follows_weights_changed_in_place():
    """The fast path reads the weights at each call: nothing of them is cached."""
    model = tiny("all_attention")
    x = torch.randint(0, 20, (2, 16))
    with torch.no_grad():
        before, _ = model(x)
        model.blocks[0].attn.persistent_v.mul_(3.0)
        after, _ = model(x)
    assert not torch.equal(before, after)
    assert torch.equal(after, model(x)[0].detach())


@pytest.mark.parametrize("family", FAMILIES)
def test_an_exported_pruned_model_loads_and_gives_the_same_logits(family, tmp_path):
    """What bench.speedup times: a pruned model written as a trial writes it (the folder
    export-model copies) and read back with load_model, run on the inference path."""
    from trainers.export import load_model, save_model
    from trainers.tokenizers import CharTokenizer

    pruned = tiny(family).prune_heads([[1, 3], [0], [0, 1, 2]])
    save_model(pruned, CharTokenizer([chr(97 + i) for i in range(20)]), tmp_path / "m")
    loaded, _ = load_model(tmp_path / "m")
    assert loaded.cfg.heads_per_layer == (2, 1, 3)
    x = torch.randint(0, 20, (2, 16))
    with torch.inference_mode():
        assert torch.equal(loaded(x)[0], pruned(x)[0])


def test_the_shipped_checkpoint_runs_the_inference_path_as_before():
    """The dense checkpoint shipped under studies/checkpoints (saved before the inference path
    existed) loads, and both paths give it the same logits."""
    from pathlib import Path

    from trainers.export import load_model

    shipped = sorted(Path(__file__).parent.parent.glob("studies/checkpoints/*/model.safetensors"))
    if not shipped:
        pytest.skip("no shipped checkpoint")
    model, _ = load_model(shipped[0].parent)
    x = torch.randint(0, model.cfg.vocab_size, (1, 64))
    expected, _ = model(x)
    with torch.inference_mode():
        assert torch.equal(model(x)[0], expected.detach())
