"""Character-level corpora: a train/validation split, a vocabulary, random batches, a fixed eval slice."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch

UNKNOWN = "\x00<unk>"  # id 0: validation characters never seen in training map here


class CorpusError(ValueError):
    """A corpus that cannot be used; the message names the file."""


def _read_text(path: Path) -> str:
    if not path.is_file():
        raise CorpusError(f"corpus file not found: {path}")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise CorpusError(f"corpus file is not UTF-8 text: {path} (byte {err.start})") from None
    if not text:
        raise CorpusError(f"corpus file is empty: {path}")
    return text


@dataclass
class CharCorpus:
    train: torch.Tensor  # int64 token ids
    val: torch.Tensor
    vocab: list[str]  # vocab[0] is the unknown token
    digest: str  # sha256 of the texts and split: names the dense checkpoint

    @classmethod
    def load(
        cls,
        path: str | Path | None = None,
        *,
        val_fraction: float = 0.1,
        train_path: str | Path | None = None,
        val_path: str | Path | None = None,
        block_size: int,
    ) -> CharCorpus:
        """One file split contiguously (the last ``val_fraction`` validates), or separate files."""
        if train_path is not None and val_path is not None:
            train_text, val_text = _read_text(Path(train_path)), _read_text(Path(val_path))
            name = f"{train_path} / {val_path}"
        elif path is not None:
            text = _read_text(Path(path))
            cut = int(len(text) * (1.0 - val_fraction))
            train_text, val_text, name = text[:cut], text[cut:], str(path)
        else:
            raise CorpusError("no corpus given: set a path, or both train_path and val_path")
        for split, part in (("training", train_text), ("validation", val_text)):
            if len(part) < block_size + 1:
                raise CorpusError(
                    f"corpus {name}: the {split} text has {len(part)} characters, fewer than one "
                    f"block ({block_size} + 1)"
                )
        vocab = [UNKNOWN, *sorted(set(train_text))]
        index = {ch: i for i, ch in enumerate(vocab)}
        digest = hashlib.sha256()
        for part in (train_text, "\x1e", val_text):
            digest.update(part.encode("utf-8"))

        def encode(text: str) -> torch.Tensor:
            return torch.tensor([index.get(ch, 0) for ch in text], dtype=torch.long)

        return cls(encode(train_text), encode(val_text), vocab, digest.hexdigest())

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def decode(self, ids: list[int]) -> str:
        return "".join("?" if i == 0 else self.vocab[i] for i in ids)


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
