import pytest
import torch

from trainers.data import Corpus, CorpusError, eval_windows


def test_contiguous_split_and_unknown_characters(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("ab" * 45 + "abz" * 4, encoding="utf-8")  # 'z' only in the last 10%
    corpus = Corpus.load(path, block_size=4)
    assert len(corpus.train) + len(corpus.val) == 102
    assert "z" not in corpus.tokenizer.vocab
    assert (corpus.val == 0).sum().item() > 0  # z -> unknown id 0


def test_separate_train_and_validation_files(tmp_path):
    (tmp_path / "train.txt").write_text("hello world " * 10, encoding="utf-8")
    (tmp_path / "val.txt").write_text("world hello!", encoding="utf-8")
    corpus = Corpus.load(train_path=tmp_path / "train.txt", val_path=tmp_path / "val.txt", block_size=8)
    assert corpus.decode(corpus.val.tolist()) == "world hello?"


@pytest.mark.parametrize(
    "content, message",
    [(b"", "empty"), (b"\xff\xfe\x00bad", "not UTF-8"), (b"short text", "fewer than one block")],
)
def test_unusable_corpora_are_clear_errors(tmp_path, content, message):
    path = tmp_path / "bad.txt"
    path.write_bytes(content)
    with pytest.raises(CorpusError, match=message) as err:
        Corpus.load(path, block_size=64)
    assert str(path) in str(err.value)


def test_missing_corpus_names_the_file(tmp_path):
    with pytest.raises(CorpusError, match="not found.*nope.txt"):
        Corpus.load(tmp_path / "nope.txt", block_size=8)


def test_eval_windows_are_a_fixed_prefix():
    tokens = torch.arange(100)
    x, y = eval_windows(tokens, block_size=10, max_tokens=35)
    assert x.shape == (3, 10)
    assert torch.equal(x.flatten(), tokens[:30])
    assert torch.equal(y.flatten(), tokens[1:31])


def test_digest_changes_with_the_split(small_text):
    a = Corpus.load(small_text, block_size=8, val_fraction=0.1)
    b = Corpus.load(small_text, block_size=8, val_fraction=0.2)
    assert a.digest != b.digest
