"""Corpora: a train/validation/test split tokenized (trainers/tokenizers.py), random batches, a
fixed evaluation slice and the bytes it covers (bits per byte compare across tokenizers).

The validation split is what a study selects on (the sampler, early stopping, warm starts); the
test split, when a corpus has one, is scored at the end of each trial and selected on by nothing,
so the figure reported for a chosen model is not one it was chosen by (docs/methods.md)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch

from trainers.tokenizers import Tokenizer, TokenizerError, build_tokenizer, byte_count, encode_cached


class CorpusError(ValueError):
    """A corpus that cannot be used; the message names the file."""


def _read_text(path: Path) -> str:
    if path.exists() and not path.is_file():
        raise CorpusError(f"corpus file is not a regular file: {path}")
    if not path.is_file():
        raise CorpusError(f"corpus file not found: {path}")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise CorpusError(f"corpus file is not UTF-8 text: {path} (byte {err.start})") from None
    except OSError as err:  # no permission, a disk error: the corpus, not the cache
        raise CorpusError(f"corpus file cannot be read: {path} ({err.strerror or err})") from None
    if not text:
        raise CorpusError(f"corpus file is empty: {path}")
    return text


@dataclass
class Corpus:
    """A text as token ids, split into training, validation and (optionally) test, with the
    tokenizer that made them."""

    train: torch.Tensor  # int64 token ids
    val: torch.Tensor
    tokenizer: Tokenizer
    digest: str  # sha256 of the texts, split and tokenizer: names the dense checkpoint
    test: torch.Tensor | None = None  # None: a corpus made without a test split (an earlier study)

    @classmethod
    def load(
        cls,
        path: str | Path | None = None,
        *,
        val_fraction: float = 0.1,
        test_fraction: float = 0.0,
        train_path: str | Path | None = None,
        val_path: str | Path | None = None,
        test_path: str | Path | None = None,
        block_size: int,
        tokenizer: str = "char",
        vocab_size: int = 1024,
        model_path: str | Path | None = None,
        cache_dir: str | Path | None = None,
    ) -> Corpus:
        """One file split contiguously (the last ``test_fraction`` tests, the ``val_fraction``
        before it validates), or separate files (``test_path`` optional); tokenized by
        ``tokenizer`` (trainers/tokenizers.py: "char", "bpe" trained on the training split,
        "model": the one saved at ``model_path``), token ids cached under ``cache_dir``. Without
        a test split the digest is what it was before there were test splits, so the dense
        checkpoints of earlier studies keep their names."""
        test_text = None
        if train_path is not None and val_path is not None:
            train_text, val_text = _read_text(Path(train_path)), _read_text(Path(val_path))
            test_text = _read_text(Path(test_path)) if test_path is not None else None
            name = f"{train_path} / {val_path}"
        elif path is not None:
            text = _read_text(Path(path))
            val_cut = int(len(text) * (1.0 - val_fraction - test_fraction))
            test_cut = int(len(text) * (1.0 - test_fraction)) if test_fraction else len(text)
            train_text, val_text, name = text[:val_cut], text[val_cut:test_cut], str(path)
            test_text = text[test_cut:] if test_fraction else None
        else:
            raise CorpusError("no corpus given: set a path, or both train_path and val_path")
        digest = hashlib.sha256()
        for part in (train_text, "\x1e", val_text, *(("\x1e", test_text) if test_text is not None else ())):
            digest.update(part.encode("utf-8"))
        text_digest = digest.hexdigest()
        try:
            tok = build_tokenizer(
                tokenizer, train_text, vocab_size=vocab_size, model_path=model_path, cache_dir=cache_dir
            )
        except TokenizerError as err:
            raise CorpusError(str(err)) from None
        splits = []
        parts = [("training", train_text), ("validation", val_text)]
        if test_text is not None:
            parts.append(("test", test_text))
        for split, part in parts:
            if cache_dir is None:
                ids = torch.tensor(tok.encode(part), dtype=torch.long)
            else:
                part_digest = hashlib.sha256(f"{split}:{text_digest}".encode()).hexdigest()
                ids = encode_cached(tok, part, cache_dir=cache_dir, text_digest=part_digest)
            if len(ids) < block_size + 1:
                raise CorpusError(
                    f"corpus {name}: the {split} text has {len(ids)} tokens, fewer than one "
                    f"block ({block_size} + 1)"
                )
            splits.append(ids)
        # The character tokenizer keeps the digest of the texts alone: checkpoints made before
        # there were other tokenizers keep their names.
        if tok.kind != "char":
            text_digest = hashlib.sha256(f"{text_digest}:{tok.digest}".encode()).hexdigest()
        return cls(splits[0], splits[1], tok, text_digest, splits[2] if test_text is not None else None)

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)


def random_batch(
    tokens: torch.Tensor, batch_size: int, block_size: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets at random offsets."""
    starts = torch.randint(0, len(tokens) - block_size, (batch_size,), generator=generator)
    x = torch.stack([tokens[s : s + block_size] for s in starts.tolist()])
    y = torch.stack([tokens[s + 1 : s + 1 + block_size] for s in starts.tolist()])
    return x, y


def eval_windows(tokens: torch.Tensor, block_size: int, max_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed evaluation slice: non-overlapping windows from the start of ``tokens``, at most
    ``max_tokens`` predicted tokens, so every trial of a study scores the same tokens."""
    n_windows = max(1, min((len(tokens) - 1) // block_size, max_tokens // block_size))
    span = tokens[: n_windows * block_size + 1]
    x = span[:-1].view(n_windows, block_size)
    y = span[1:].view(n_windows, block_size)
    return x, y


def rung_windows(
    windows: tuple[torch.Tensor, torch.Tensor], max_tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``max_tokens // block_size`` windows of the evaluation slice (at least one; all of them
    when the slice is no larger or ``max_tokens`` is 0), evenly spaced over it: what early
    stopping scores at a rung, where only the ranking of trials matters. Spread over the slice,
    not its start: the validation text is not homogeneous (BENCHMARKS.md, what a rung scores),
    and a prefix would rank trials by its first pages."""
    if not max_tokens:
        return windows
    x, y = windows
    wanted = max(1, min(len(x), max_tokens // x.shape[1]))
    chosen = torch.arange(wanted) * len(x) // wanted
    return x[chosen], y[chosen]


def window_bytes(tokenizer: Tokenizer, windows: tuple[torch.Tensor, torch.Tensor]) -> int:
    """The UTF-8 bytes of the text the evaluation slice predicts: the windows are contiguous, so
    their targets in order are one span of the text."""
    return byte_count(tokenizer, windows[1].flatten().tolist())
