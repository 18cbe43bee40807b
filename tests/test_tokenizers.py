"""The three tokenizers: the character one keeps the ids of earlier versions, the BPE one gives any
text back exactly and is trained once per corpus, the model's own one adds no special tokens; token
ids are cached on disk and never trusted unchecked; bits per byte compare across tokenizers."""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import CORPUS, REPO
from safetensors.torch import save_file
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from trainers.tokenizers import (
    KIND_FILE,
    KINDS,
    UNKNOWN,
    BPETokenizer,
    CharTokenizer,
    ModelTokenizer,
    TokenizerError,
    bits_per_byte,
    build_tokenizer,
    byte_count,
    encode_cached,
    hf_tokenizer,
    load_tokenizer,
)

BPE_SLICE = 200_000  # characters of the corpus the BPE tests train on: fast, and enough for 1024 tokens
AWKWARD_TEXT = "naïve café, 日本語 🎭\x00\r\n\tend  \n\n   "  # accents, CJK, emoji, NUL, odd spaces

# The ids trainers.data.CharCorpus gave the shipped corpus (commit ffbb89d, before this module):
# sha256 of the int64 id tensors of its training and validation splits (val_fraction=0.1).
CHAR_TRAIN_IDS_SHA256 = "b5215da520cc42d3c48ab68d75fb5b115e03ae6758b968c24ae76b2afe9baa27"
CHAR_VAL_IDS_SHA256 = "576199f92cc38945c482bf0c50e8af45dad42a7ae484284a4ccfc3015077fbef"


@pytest.fixture(scope="module")
def corpus_text() -> str:
    return CORPUS.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def bpe(corpus_text) -> BPETokenizer:
    return BPETokenizer.train(corpus_text[:BPE_SLICE], vocab_size=1024)


def ids_sha256(ids: list[int]) -> str:
    return hashlib.sha256(torch.tensor(ids, dtype=torch.long).numpy().tobytes()).hexdigest()


def forbid(*_args, **_kwargs):
    raise AssertionError("called, though the cache should have answered")


# -- char ---------------------------------------------------------------------------------------


def test_char_ids_are_those_of_the_character_corpus(corpus_text):
    cut = int(len(corpus_text) * 0.9)  # CharCorpus's contiguous split
    train_text, val_text = corpus_text[:cut], corpus_text[cut:]
    tokenizer = CharTokenizer.train(train_text)
    assert tokenizer.vocab[0] == UNKNOWN and tokenizer.vocab[1:] == sorted(set(train_text))
    assert tokenizer.vocab_size == 66
    assert ids_sha256(tokenizer.encode(train_text)) == CHAR_TRAIN_IDS_SHA256
    assert ids_sha256(tokenizer.encode(val_text)) == CHAR_VAL_IDS_SHA256
    assert tokenizer.decode(tokenizer.encode(train_text)) == train_text


def test_char_unknown_characters_are_id_0_and_one_byte():
    tokenizer = CharTokenizer.train("abcab")
    ids = tokenizer.encode("abzé")
    assert ids == [1, 2, 0, 0]
    assert tokenizer.decode(ids) == "ab??"
    assert byte_count(tokenizer, ids) == 4 == len(tokenizer.decode(ids).encode("utf-8"))
    wide = CharTokenizer.train("é日🎭")
    assert byte_count(wide, wide.encode("é日🎭")) == len("é日🎭".encode())


def test_char_saves_the_vocab_json_of_earlier_versions_and_loads_it_back(tmp_path):
    tokenizer = CharTokenizer.train("Thé quick fox\n")
    tokenizer.save(tmp_path / "m")
    assert [p.name for p in (tmp_path / "m").iterdir()] == ["vocab.json"]
    # What trainers/export.py wrote before: json.dumps(vocab, ensure_ascii=False), UTF-8.
    expected = json.dumps(tokenizer.vocab, ensure_ascii=False).encode("utf-8")
    assert (tmp_path / "m" / "vocab.json").read_bytes() == expected
    loaded = load_tokenizer(tmp_path / "m")
    assert isinstance(loaded, CharTokenizer) and loaded.vocab == tokenizer.vocab
    assert loaded.digest == tokenizer.digest and loaded.encode("quick") == tokenizer.encode("quick")
    assert hf_tokenizer(loaded) is None


def test_a_model_folder_of_an_earlier_version_loads_its_vocabulary(tmp_path):
    (tmp_path / "vocab.json").write_text(json.dumps(list("abcdefghijkl")), encoding="utf-8")
    (tmp_path / "config.json").write_text(json.dumps({"model": {}, "sha256": {}}))
    loaded = load_tokenizer(tmp_path)
    assert isinstance(loaded, CharTokenizer) and loaded.vocab == list("abcdefghijkl")


def test_a_char_tokenizer_saved_over_a_bpe_one_is_the_one_loaded(tmp_path, bpe):
    bpe.save(tmp_path)
    CharTokenizer.train("abc").save(tmp_path)
    assert not (tmp_path / KIND_FILE).exists()
    assert isinstance(load_tokenizer(tmp_path), CharTokenizer)


def test_an_unreadable_vocabulary_is_a_tokenizer_error_naming_the_file(tmp_path):
    (tmp_path / "vocab.json").write_text('{"a": 0}', encoding="utf-8")
    with pytest.raises(TokenizerError, match="vocab.json is not a character vocabulary"):
        CharTokenizer.load(tmp_path)


# -- bpe ----------------------------------------------------------------------------------------


def test_bpe_gives_the_whole_corpus_back_exactly(bpe, corpus_text):
    ids = bpe.encode(corpus_text)
    assert bpe.decode(ids) == corpus_text
    assert byte_count(bpe, ids) == len(corpus_text.encode("utf-8"))
    assert len(ids) < len(corpus_text) / 2  # it does merge
    # Bytes of consecutive runs add up, even where a run ends inside a multi-byte character.
    awkward = bpe.encode(AWKWARD_TEXT)
    assert bpe.decode(awkward) == AWKWARD_TEXT
    assert sum(byte_count(bpe, awkward[i : i + 1]) for i in range(len(awkward))) == len(
        AWKWARD_TEXT.encode("utf-8")
    )


def test_bpe_honours_vocab_size_and_refuses_one_below_the_bytes(corpus_text):
    assert BPETokenizer.train(corpus_text[:50_000], vocab_size=300).vocab_size == 300
    assert BPETokenizer.train(corpus_text[:BPE_SLICE]).vocab_size == 1024  # the default
    with pytest.raises(ValueError, match="vocab_size >= 256"):
        BPETokenizer.train("abc", vocab_size=255)


def test_bpe_training_is_deterministic(bpe, corpus_text):
    again = BPETokenizer.train(corpus_text[:BPE_SLICE], vocab_size=1024)
    sample = corpus_text[-20_000:]
    assert again.digest == bpe.digest and again.encode(sample) == bpe.encode(sample)
    other = BPETokenizer.train(corpus_text[:BPE_SLICE], vocab_size=900)
    assert other.digest != bpe.digest


def test_bpe_is_trained_once_then_read_from_the_cache(tmp_path, monkeypatch, corpus_text):
    text = corpus_text[:BPE_SLICE]
    first = build_tokenizer("bpe", text, cache_dir=tmp_path)
    [folder] = (tmp_path / "tokenizers").iterdir()  # no staging folder left beside it
    assert len(folder.name) == 16 and (folder / "tokenizer.json").is_file()
    monkeypatch.setattr(BPETokenizer, "train", forbid)
    second = build_tokenizer("bpe", text, cache_dir=tmp_path)
    assert isinstance(second, BPETokenizer) and second.digest == first.digest
    assert second.encode(text[:5000]) == first.encode(text[:5000])


@pytest.mark.parametrize(
    "damage",
    [
        lambda folder: (folder / KIND_FILE).unlink(),  # written last: its absence means cut short
        lambda folder: (folder / "tokenizer.json").write_text('{"model": {"type": "BPE"'),  # truncated
        lambda folder: (folder / "tokenizer.json").unlink(),
        lambda folder: (folder / KIND_FILE).write_text('{"kind": "bpe", "digest": "bpe-0000"}'),  # altered
    ],
)
def test_a_half_written_cached_bpe_is_trained_again(tmp_path, monkeypatch, corpus_text, damage):
    text = corpus_text[:50_000]
    first = build_tokenizer("bpe", text, vocab_size=300, cache_dir=tmp_path)
    [folder] = (tmp_path / "tokenizers").iterdir()
    damage(folder)
    # A crash before the rename leaves only a staging folder: it is never read.
    (tmp_path / "tokenizers" / f".{folder.name}.abc.partial").mkdir()
    trainings = []
    real_train = BPETokenizer.train.__func__

    def counted_train(cls, *args, **kwargs):
        trainings.append(1)
        return real_train(cls, *args, **kwargs)

    monkeypatch.setattr(BPETokenizer, "train", classmethod(counted_train))
    again = build_tokenizer("bpe", text, vocab_size=300, cache_dir=tmp_path)
    assert trainings == [1] and again.digest == first.digest
    # The cache is whole again: the next build reads it.
    assert build_tokenizer("bpe", text, vocab_size=300, cache_dir=tmp_path).digest == first.digest
    assert trainings == [1]


def test_a_saved_bpe_loads_in_transformers_and_back_as_a_bpe(tmp_path, bpe, corpus_text):
    bpe.save(tmp_path / "m")
    sample = corpus_text[-3000:] + AWKWARD_TEXT
    hf = AutoTokenizer.from_pretrained(tmp_path / "m", local_files_only=True)
    assert hf.encode(sample, add_special_tokens=False) == bpe.encode(sample)
    assert hf.encode(sample) == bpe.encode(sample)  # it has no special tokens to add
    assert hf.decode(bpe.encode(sample)) == sample
    loaded = load_tokenizer(tmp_path / "m")
    assert isinstance(loaded, BPETokenizer) and loaded.digest == bpe.digest
    assert loaded.encode(sample) == bpe.encode(sample)
    assert isinstance(hf_tokenizer(bpe), PreTrainedTokenizerFast)
    assert hf_tokenizer(bpe).encode(sample) == bpe.encode(sample)


# -- model --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def user_model_folder(tmp_path_factory, corpus_text) -> Path:
    """A user's model folder: a small BPE with BOS and EOS, which it adds to everything it encodes,
    and a short context, saved by transformers as a model's tokenizer is."""
    backend = BackendTokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator([corpus_text[:50_000]], trainer)
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 1)]
    )
    folder = tmp_path_factory.mktemp("user_model")
    PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", model_max_length=32
    ).save_pretrained(folder)
    return folder


def test_the_models_tokenizer_encodes_without_special_tokens(user_model_folder, corpus_text, caplog):
    tokenizer = build_tokenizer("model", "ignored", model_path=user_model_folder)
    assert isinstance(tokenizer, ModelTokenizer) and tokenizer.vocab_size == 400
    hf = AutoTokenizer.from_pretrained(user_model_folder, local_files_only=True)
    assert hf.encode("hello") == [0, *tokenizer.encode("hello"), 1]  # as the model adds them
    text = corpus_text[:2000] + AWKWARD_TEXT  # far longer than its 32-token context: no warning
    ids = tokenizer.encode(text)
    assert 0 not in ids and 1 not in ids
    assert tokenizer.decode(ids) == text
    assert byte_count(tokenizer, ids) == len(text.encode("utf-8"))
    assert not [r for r in caplog.records if "longer than the specified maximum" in r.getMessage()]
    assert hf_tokenizer(tokenizer) is tokenizer.hf


def test_the_models_tokenizer_saved_beside_a_model_comes_back_the_same(tmp_path, user_model_folder):
    tokenizer = ModelTokenizer.from_pretrained(user_model_folder)
    tokenizer.save(tmp_path)
    # As trainers/export.py leaves it: our config.json beside, which is no Hugging Face config.
    (tmp_path / "config.json").write_text(json.dumps({"model": {"family": "gpt"}, "sha256": {}}))
    loaded = load_tokenizer(tmp_path)
    assert isinstance(loaded, ModelTokenizer) and loaded.digest == tokenizer.digest
    assert loaded.encode("To be, or not") == tokenizer.encode("To be, or not")


@pytest.mark.parametrize("damage", ["truncated", "model without its vocabulary", "unknown model"])
def test_a_models_broken_tokenizer_file_is_a_one_line_error(tmp_path, user_model_folder, damage):
    """A tokenizer.json that parses as JSON but not as a tokenizer: the tokenizers library
    refuses it with a bare Exception."""
    shutil.copytree(user_model_folder, tmp_path / "m")
    file = tmp_path / "m" / "tokenizer.json"
    saved = json.loads(file.read_text())
    file.write_text(
        {
            "truncated": file.read_text()[:500],
            "model without its vocabulary": json.dumps({**saved, "model": {"type": "BPE"}}),
            "unknown model": json.dumps({**saved, "model": {"type": "Nope"}}),
        }[damage]
    )
    with pytest.raises(TokenizerError) as err:
        build_tokenizer("model", "text", model_path=tmp_path / "m")
    assert str(tmp_path / "m") in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("missing", ["does/not/exist", "empty"])
def test_no_models_tokenizer_is_a_one_line_error_naming_the_path(tmp_path, missing):
    path = tmp_path / missing
    if missing == "empty":
        path.mkdir()
    with pytest.raises(TokenizerError) as err:
        build_tokenizer("model", "text", model_path=path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(TokenizerError, match="needs model_path"):
        build_tokenizer("model", "text")


def test_an_unknown_kind_names_the_kinds():
    assert KINDS == ("char", "model", "bpe")
    with pytest.raises(ValueError, match="unknown tokenizer 'wordpiece': choose one of char, model, bpe"):
        build_tokenizer("wordpiece", "text")


# -- encode_cached ------------------------------------------------------------------------------


def test_token_ids_are_read_back_from_the_cache(tmp_path, bpe, corpus_text, monkeypatch):
    text = corpus_text[:30_000]
    first = encode_cached(bpe, text, cache_dir=tmp_path, text_digest="t1")
    assert first.dtype == torch.long and first.tolist() == bpe.encode(text)
    [cache_file] = (tmp_path / "tokens").iterdir()
    assert cache_file.suffix == ".safetensors" and len(cache_file.stem) == 24
    monkeypatch.setattr(bpe, "encode", forbid)
    assert torch.equal(encode_cached(bpe, text, cache_dir=tmp_path, text_digest="t1"), first)


def test_a_cache_file_that_cannot_be_written_is_a_warning(tmp_path, bpe, monkeypatch):
    """safetensors reports a failed write (a full disk) as its own error, not an OSError."""
    from safetensors import SafetensorError

    def refuse(*args, **kwargs):
        raise SafetensorError("Error while serializing: IoError(No space left on device)")

    monkeypatch.setattr("trainers.tokenizers.save_file", refuse)
    with pytest.warns(RuntimeWarning, match="not written: Error while serializing"):
        ids = encode_cached(bpe, "abc abc", cache_dir=tmp_path, text_digest="t1")
    assert ids.tolist() == bpe.encode("abc abc")
    assert list((tmp_path / "tokens").iterdir()) == []  # no temporary file left


def test_another_text_or_tokenizer_gets_its_own_cache_file(tmp_path, bpe, corpus_text):
    encode_cached(bpe, "abc abc", cache_dir=tmp_path, text_digest="t1")
    encode_cached(bpe, "xyz", cache_dir=tmp_path, text_digest="t2")
    other = BPETokenizer.train(corpus_text[:50_000], vocab_size=300)
    encode_cached(other, "abc abc", cache_dir=tmp_path, text_digest="t1")
    assert len(list((tmp_path / "tokens").iterdir())) == 3


def _tampered(path: Path) -> None:
    """A whole safetensors file whose ids are not the ones its checksum records."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as cache:
        record, ids = cache.metadata(), cache.get_tensor("ids")
    save_file({"ids": ids.flip(0).contiguous()}, str(path), metadata=record)


@pytest.mark.parametrize(
    "damage",
    [
        lambda path: path.write_bytes(path.read_bytes()[: path.stat().st_size // 2]),  # truncated
        lambda path: path.write_bytes(b"\x00" * 64),  # garbage
        lambda path: path.write_bytes(b""),  # empty
        _tampered,
    ],
)
def test_a_damaged_cache_file_is_encoded_again_and_rewritten(tmp_path, bpe, monkeypatch, damage):
    text = "Now is the winter of our discontent\nMade glorious summer by this sun of York;\n" * 20
    first = encode_cached(bpe, text, cache_dir=tmp_path, text_digest="t")
    [cache_file] = (tmp_path / "tokens").iterdir()
    damage(cache_file)
    assert torch.equal(encode_cached(bpe, text, cache_dir=tmp_path, text_digest="t"), first)
    monkeypatch.setattr(bpe, "encode", forbid)  # rewritten whole: the next call reads it
    assert torch.equal(encode_cached(bpe, text, cache_dir=tmp_path, text_digest="t"), first)
    assert [p.name for p in (tmp_path / "tokens").iterdir()] == [cache_file.name]  # no temporary left


def test_character_ids_are_not_cached(tmp_path):
    tokenizer = CharTokenizer.train("hello world")
    ids = encode_cached(tokenizer, "hello there", cache_dir=tmp_path, text_digest="t")
    assert ids.dtype == torch.long and ids.tolist() == tokenizer.encode("hello there")
    assert not (tmp_path / "tokens").exists()


# -- bits per byte ------------------------------------------------------------------------------


def test_a_uniform_model_over_bytes_scores_8_bits_per_byte(corpus_text):
    bytes_only = BPETokenizer.train(corpus_text[:10_000], vocab_size=256)  # no merges: one token a byte
    text = corpus_text[:5000] + AWKWARD_TEXT
    ids = bytes_only.encode(text)
    assert len(ids) == byte_count(bytes_only, ids) == len(text.encode("utf-8"))
    assert bits_per_byte(math.log(256), len(ids), byte_count(bytes_only, ids)) == pytest.approx(8.0)


def test_bits_per_byte_compare_char_and_bpe_on_the_same_text(bpe, corpus_text):
    text = corpus_text[:20_000]
    char = CharTokenizer.train(text)
    char_ids, bpe_ids = char.encode(text), bpe.encode(text)
    n_bytes = byte_count(char, char_ids)
    assert n_bytes == byte_count(bpe, bpe_ids) == len(text.encode("utf-8"))
    total_nats = 12_345.0  # the same loss in total, spread over fewer tokens by the BPE
    char_bpb = bits_per_byte(total_nats / len(char_ids), len(char_ids), n_bytes)
    bpe_bpb = bits_per_byte(total_nats / len(bpe_ids), len(bpe_ids), n_bytes)
    assert char_bpb == pytest.approx(bpe_bpb) == pytest.approx(total_nats / (n_bytes * math.log(2)))
    # Per token the BPE loses more, by its tokens' ratio; per byte the two are the same.
    assert (total_nats / len(bpe_ids)) / (total_nats / len(char_ids)) == pytest.approx(
        len(char_ids) / len(bpe_ids)
    )
    with pytest.raises(ValueError, match="no bytes"):
        bits_per_byte(1.0, 0, 0)


@pytest.mark.slow  # a process of its own (seconds of interpreter start)
def test_the_character_tokenizer_does_not_import_transformers():
    """Every trial process of a character-level study imports this module: it stays light."""
    code = (
        "import sys; from trainers.tokenizers import build_tokenizer, load_tokenizer; "
        "build_tokenizer('char', 'abc'); print('transformers' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "False"
