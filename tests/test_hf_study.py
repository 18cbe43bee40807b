"""The real ``launch-study`` on Hugging Face models: a user's model folder with its own
tokenizer (studies/own_model.toml), and a Llama with grouped-query attention built by the study
with a BPE tokenizer (studies/llama_bpe.toml); both shrunk to test size with --set."""

from __future__ import annotations

import math

import optuna
import pandas as pd
import pytest
import torch
from helpers import CORPUS, REPO, expected_front, frontier_triples, launch
from optuna.trial import TrialState

import trainers
from orchestrator.storage import open_store, read_frontier
from trainers.data import Corpus, eval_windows

pytestmark = pytest.mark.slow

SMALL_TRIALS = [
    *("--set", "trial.prune_steps=8", "--set", "trial.finetune_steps=9", "--set", "trial.batch_size=4"),
    *("--set", "trial.eval_tokens=1024", "--set", "study.cpus_per_trial=1", "--n-trials", "3"),
]


def write_users_model(folder):
    """A tiny GPT-2 and a BPE tokenizer, saved the way a user's model is: save_pretrained."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers import trainers as bpe_trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = bpe_trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator([CORPUS.read_text(encoding="utf-8")[:50000]], trainer)
    PreTrainedTokenizerFast(tokenizer_object=bpe).save_pretrained(folder)
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=bpe.get_vocab_size(), n_positions=64, n_embd=32, n_layer=2, n_head=4)
    GPT2LMHeadModel(config).save_pretrained(folder)


def run_study(tmp_path, study: str, *extra: str):
    storage = f"sqlite:///{tmp_path}/hf.db"
    csv = tmp_path / "front.csv"
    args = [str(REPO / "studies" / study), "--storage", storage, "--output", str(csv), *SMALL_TRIALS, *extra]
    result = launch("run", *args, cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    store = open_store(storage)
    name = study.removesuffix(".toml")
    return store, optuna.load_study(study_name=name, storage=store.storage), pd.read_csv(csv)


def check_front(store, study, frame) -> None:
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    assert len(complete) == 3
    assert frontier_triples(read_frontier(store, study.study_name)) == expected_front(study)
    assert frame["bits_per_byte"].notna().all() and (frame["bits_per_byte"] > 0).all()
    for t in complete:  # bits per byte: the same loss per byte of text, whatever the tokenizer
        assert 0 < t.user_attrs["bits_per_byte"] < math.log2(t.values[0]) * 2


def test_a_users_model_folder_with_its_own_tokenizer(tmp_path):
    write_users_model(tmp_path / "my-model")
    store, study, frame = run_study(
        tmp_path,
        "own_model.toml",
        "--set",
        f"model.path={tmp_path / 'my-model'}",
        "--set",
        "model.block_size=32",
    )
    check_front(store, study, frame)
    assert study.get_trials()[0].user_attrs["dense_control"]
    # The exported folder is a standard Hugging Face one: a transformers model, pruned shapes.
    best = max(study.get_trials(states=(TrialState.COMPLETE,)), key=lambda t: t.user_attrs["sparsity"])
    out = tmp_path / "export"
    exported = launch(
        "export-model", "--storage", f"sqlite:///{tmp_path}/hf.db", "--study-name", "own_model",
        "--trial", str(best.number), "--output", str(out), cwd=tmp_path,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    model, tokenizer = trainers.load_pruned(out)
    assert type(model).__name__ == "GPT2LMHeadModel"
    assert model.config.headprune_heads_per_layer == best.user_attrs["heads_per_layer"]
    # ...that scores the trial's recorded perplexity on the study's evaluation slice.
    corpus = Corpus.load(CORPUS, block_size=32, tokenizer="model", model_path=tmp_path / "my-model")
    x, y = eval_windows(corpus.val, 32, 1024)
    with torch.no_grad():
        logits = model(input_ids=x).logits
    ppl = math.exp(torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()).item())
    assert ppl == pytest.approx(best.values[0], rel=1e-4)
    ids = tokenizer("ROMEO:", return_tensors="pt").input_ids
    text = tokenizer.decode(model.generate(ids, max_new_tokens=8, do_sample=False)[0])
    assert text.startswith("ROMEO:") and len(text) > len("ROMEO:")


def test_a_llama_with_grouped_query_attention_and_bpe_built_by_the_study(tmp_path):
    shrink = ["model.n_layer=2", "model.n_head=4", "model.n_kv_head=2", "model.d_model=32"]
    shrink += ["model.block_size=32", "corpus.vocab_size=300", "pretrain.steps=30", "pretrain.batch_size=8"]
    shrink += ["search.sparsity={ low = 0.25, high = 0.75 }"]  # 8 heads: one per layer is the floor
    store, study, frame = run_study(tmp_path, "llama_bpe.toml", *[a for s in shrink for a in ("--set", s)])
    check_front(store, study, frame)
    assert (tmp_path / "runs" / "artifacts" / "cache").is_dir()  # the BPE and the token ids, cached
