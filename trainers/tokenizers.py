"""Tokenizers: text to token ids and back, chosen by a study's ``[corpus] tokenizer``.

- ``"char"``: one id per character of the training text (id 0: a character it lacks). The ids are
  exactly those of the character corpora of earlier versions, so their checkpoints stay valid.
- ``"bpe"``: a byte-level BPE trained on the training text with the ``tokenizers`` library. Every
  text encodes (there are no unknown bytes) and decodes back to itself exactly.
- ``"model"``: the tokenizer saved beside a user's Hugging Face model, so a pretrained model reads
  the ids it was trained on.

Perplexities of different tokenizers do not compare (a token is a character for one, a word piece
for another), so scores are also given in bits per byte of text: ``bits_per_byte``.

``transformers`` is imported only where a Hugging Face tokenizer is built or loaded: a study of
the character tokenizer, and every trial process of it, does not pay for importing it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import tempfile
import uuid
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from trainers.atomic import write_atomically

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

KINDS = ("char", "model", "bpe")
UNKNOWN = "\x00<unk>"  # the character tokenizer's id 0: characters the training text lacks
VOCAB_FILE = "vocab.json"  # the character tokenizer's only file, as earlier versions wrote it
KIND_FILE = "headprune_tokenizer.json"  # {"kind": ..., "digest": ...}: which tokenizer a folder holds
DEFAULT_BPE_VOCAB_SIZE = 1024
BYTE_ALPHABET_SIZE = 256  # a byte-level BPE starts from every byte: its smallest vocabulary
# Part of the BPE cache key: a change to how the BPE is trained must change this, so that no
# tokenizer trained the old way is taken from the cache.
BPE_RECIPE = "byte-level-bpe/1"


class TokenizerError(ValueError):
    """A tokenizer that cannot be built or loaded; the one-line message names the path."""


class Tokenizer(Protocol):
    kind: str  # one of KINDS
    vocab_size: int  # every id encode can return is below it: the model's embedding rows
    digest: str  # kind and a hash of the vocabulary/merges: names the caches of token ids

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def save(self, folder: str | Path) -> None:
        """Write the tokenizer's files into ``folder``; ``load_tokenizer(folder)`` reads them back."""
        ...


def _short_hash(data: str) -> str:
    return hashlib.sha256(data.encode("utf-8")).hexdigest()[:16]


def _as_list(ids: Sequence[int] | torch.Tensor) -> list[int]:
    return ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)


def _write_kind_file(folder: Path, kind: str, digest: str) -> None:
    record = json.dumps({"kind": kind, "digest": digest})
    write_atomically(folder / KIND_FILE, lambda tmp: tmp.write_text(record, encoding="utf-8"))


def _read_kind_file(folder: Path) -> dict:
    path = folder / KIND_FILE
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise TokenizerError(f"{path} is unreadable ({type(err).__name__})") from None
    if not isinstance(record, dict) or record.get("kind") not in KINDS:
        raise TokenizerError(f"{path} names no tokenizer kind of {', '.join(KINDS)}")
    return record


def _backend_digest(backend: BackendTokenizer) -> str:
    """A hash of what decides the ids of a ``tokenizers`` tokenizer: its normalizer, pre-tokenizer,
    model (vocabulary and merges), decoder and added tokens. Left out: the post-processor (it only
    adds special tokens, which our encode never asks for; ``save_pretrained`` adds an empty one),
    truncation, padding and the format's version, so a save and load keep the digest."""
    serialized = json.loads(backend.to_str())
    parts = ("normalizer", "pre_tokenizer", "model", "decoder", "added_tokens")
    essential = {part: serialized.get(part) for part in parts}
    return _short_hash(json.dumps(essential, sort_keys=True, ensure_ascii=False))


class CharTokenizer:
    """One id per character: ``vocab[i]`` is the character of id ``i``; a character not in the
    vocabulary encodes to 0, which decodes to "?". ``train`` builds the vocabulary the way the
    character corpora of earlier versions did (the unknown token, then the sorted characters), so
    the ids, and the checkpoints trained on them, are the same."""

    kind = "char"

    def __init__(self, vocab: list[str]) -> None:
        self.vocab = list(vocab)
        self.vocab_size = len(self.vocab)
        self.digest = f"char-{_short_hash(json.dumps(self.vocab, ensure_ascii=False))}"
        self._index = {ch: i for i, ch in enumerate(self.vocab)}
        # id 0 decodes to "?": one byte, like every character it stands for is counted.
        self._token_bytes = [1, *(len(ch.encode("utf-8")) for ch in self.vocab[1:])]

    @classmethod
    def train(cls, text: str) -> CharTokenizer:
        return cls([UNKNOWN, *sorted(set(text))])

    @classmethod
    def load(cls, folder: str | Path) -> CharTokenizer:
        path = Path(folder) / VOCAB_FILE
        try:
            vocab = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise TokenizerError(f"{path} is unreadable ({type(err).__name__})") from None
        if not isinstance(vocab, list) or not all(isinstance(ch, str) for ch in vocab):
            raise TokenizerError(f"{path} is not a character vocabulary (a JSON list of strings)")
        return cls(vocab)

    def encode(self, text: str) -> list[int]:
        return [self._index.get(ch, 0) for ch in text]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join("?" if i == 0 else self.vocab[i] for i in _as_list(ids))

    def save(self, folder: str | Path) -> None:
        """vocab.json, byte for byte the file earlier versions wrote (no other file, so their
        model folders and ours look the same). A kind file left by a tokenizer saved here before is
        removed: it would otherwise be read instead of this vocabulary."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.vocab, ensure_ascii=False)
        write_atomically(folder / VOCAB_FILE, lambda tmp: tmp.write_text(text, encoding="utf-8"))
        (folder / KIND_FILE).unlink(missing_ok=True)


class BPETokenizer:
    """A byte-level BPE (as GPT-2's): the text's UTF-8 bytes, merged into at most ``vocab_size``
    tokens learned from the training text. No special tokens exist, none is ever inserted, and
    ``decode(encode(text)) == text`` for every text."""

    kind = "bpe"

    def __init__(self, backend: BackendTokenizer) -> None:
        self._backend = backend
        self.vocab_size = backend.get_vocab_size()
        self.digest = f"bpe-{_backend_digest(backend)}"
        # Each character of a byte-level token stands for one byte: its length is its byte count,
        # so the bytes of any run of ids, even one that splits a character, add up exactly.
        self._token_bytes = [0] * self.vocab_size
        for token, token_id in backend.get_vocab().items():
            self._token_bytes[token_id] = len(token)

    @classmethod
    def train(cls, text: str, vocab_size: int = DEFAULT_BPE_VOCAB_SIZE) -> BPETokenizer:
        """Deterministic: the same text and size give the same merges. The vocabulary is smaller
        than ``vocab_size`` only if the text has fewer pairs to merge."""
        if vocab_size < BYTE_ALPHABET_SIZE:
            raise ValueError(f"a byte-level BPE needs vocab_size >= {BYTE_ALPHABET_SIZE}, got {vocab_size}")
        backend = BackendTokenizer(models.BPE())
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # no space added
        backend.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte, seen or not
            special_tokens=[],
            show_progress=False,
        )
        backend.train_from_iterator([text], trainer)
        return cls(backend)

    @classmethod
    def load(cls, folder: str | Path) -> BPETokenizer:
        """The tokenizer.json that ``save`` wrote, read by ``tokenizers`` itself (the same ids as
        ``AutoTokenizer.from_pretrained(folder)`` gives, without importing ``transformers``)."""
        path = Path(folder) / "tokenizer.json"
        if not path.is_file():
            raise TokenizerError(f"{path} is missing")
        try:
            backend = BackendTokenizer.from_file(str(path))
        except Exception as err:  # tokenizers raises a bare Exception for a file it cannot parse
            raise TokenizerError(f"{path} is not a tokenizer file ({str(err).splitlines()[0]})") from None
        return cls(backend)

    def encode(self, text: str) -> list[int]:
        return self._backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._backend.decode(_as_list(ids), skip_special_tokens=False)

    def save(self, folder: str | Path) -> None:
        """The Hugging Face files (tokenizer.json, tokenizer_config.json): ``AutoTokenizer`` loads
        them; and the kind file, so ``load_tokenizer`` gives back a BPE, not a "model" one."""
        folder = Path(folder)
        hf_tokenizer(self).save_pretrained(str(folder))
        _write_kind_file(folder, self.kind, self.digest)


class ModelTokenizer:
    """A Hugging Face tokenizer, the one a user's pretrained model was trained with. ``encode``
    adds no special tokens (no BOS or EOS inside a stream of training text)."""

    kind = "model"

    def __init__(self, hf: PreTrainedTokenizerBase, source: str) -> None:
        self.hf = hf
        self.source = source
        self.vocab_size = len(hf)  # added tokens included: every id it can produce
        if getattr(hf, "backend_tokenizer", None) is not None:
            fingerprint = _backend_digest(hf.backend_tokenizer)
        else:  # a tokenizer without a tokenizers backend (e.g. sentencepiece): hash its saved files
            fingerprint = _saved_files_digest(hf)
        self.digest = f"model-{fingerprint}"

    @classmethod
    def from_pretrained(cls, path_or_name: str | Path) -> ModelTokenizer:
        """A folder holding a tokenizer, or a model name already in the local Hugging Face cache
        (nothing is downloaded)."""
        from transformers import AutoTokenizer

        try:
            hf = AutoTokenizer.from_pretrained(str(path_or_name), local_files_only=True)
        # Exception: the tokenizers library refuses a tokenizer.json that is JSON but no
        # tokenizer (a model without its vocabulary) with nothing more specific.
        except Exception as err:
            raise TokenizerError(
                f"no tokenizer can be loaded from {path_or_name} ({type(err).__name__}); give a folder "
                "with tokenizer files, or the name of a model in the local Hugging Face cache"
            ) from None
        # transformers builds a tokenizer from a model's config even when no tokenizer file is
        # there; one that encodes text to nothing is that, not a tokenizer of the model.
        if not hf.encode("To be, or not to be", add_special_tokens=False):
            raise TokenizerError(
                f"{path_or_name} holds no tokenizer (its files encode text to nothing): save the "
                "model's tokenizer beside it (tokenizer.save_pretrained), or use tokenizer = 'bpe'"
            )
        return cls(hf, str(path_or_name))

    def encode(self, text: str) -> list[int]:
        # verbose=False: a corpus is longer than the model's context, which is not a mistake here.
        return self.hf.encode(text, add_special_tokens=False, verbose=False)

    def decode(self, ids: Sequence[int]) -> str:
        # No clean-up of spaces: it would change the text (and its byte count).
        return self.hf.decode(_as_list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def save(self, folder: str | Path) -> None:
        folder = Path(folder)
        self.hf.save_pretrained(str(folder))
        _write_kind_file(folder, self.kind, self.digest)


def _saved_files_digest(hf: PreTrainedTokenizerBase) -> str:
    with tempfile.TemporaryDirectory() as scratch:
        hf.save_pretrained(scratch)
        digest = hashlib.sha256()
        for path in sorted(Path(scratch).iterdir()):
            digest.update(path.name.encode("utf-8") + b"\x1e" + path.read_bytes() + b"\x1e")
    return digest.hexdigest()[:16]


def hf_tokenizer(tokenizer: Tokenizer) -> PreTrainedTokenizerFast | PreTrainedTokenizerBase | None:
    """The tokenizer as ``transformers`` uses it (``model.generate``, pipelines); None for the
    character tokenizer, which has no Hugging Face form. For "model" it is the tokenizer as loaded
    (a fast one whenever the model ships a tokenizer.json)."""
    if isinstance(tokenizer, CharTokenizer):
        return None
    if isinstance(tokenizer, ModelTokenizer):
        return tokenizer.hf
    if isinstance(tokenizer, BPETokenizer):
        from transformers import PreTrainedTokenizerFast

        # No clean-up of spaces on decode: it would change the text.
        return PreTrainedTokenizerFast(
            tokenizer_object=tokenizer._backend, clean_up_tokenization_spaces=False
        )
    raise TypeError(f"not a tokenizer of this module: {type(tokenizer).__name__}")


def _holds_char_vocab(folder: Path) -> bool:
    """A vocab.json that is a JSON list: the character tokenizer's (Hugging Face vocab.json files,
    as GPT-2's, are objects)."""
    try:
        return isinstance(json.loads((folder / VOCAB_FILE).read_text(encoding="utf-8")), list)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False


def load_tokenizer(folder: str | Path) -> Tokenizer:
    """The tokenizer ``save`` wrote into ``folder``: the kind file says which; without one, a
    vocab.json list is a character tokenizer (folders of earlier versions), anything else is
    tried as a Hugging Face tokenizer ("model")."""
    folder = Path(folder)
    if (folder / KIND_FILE).is_file():
        kind = _read_kind_file(folder)["kind"]
    elif _holds_char_vocab(folder):
        kind = "char"
    else:
        kind = "model"
    if kind == "char":
        return CharTokenizer.load(folder)
    if kind == "bpe":
        return BPETokenizer.load(folder)
    return ModelTokenizer.from_pretrained(folder)


def _bpe_cache_key(train_text: str, vocab_size: int) -> str:
    digest = hashlib.sha256()
    for part in (BPE_RECIPE, str(vocab_size), train_text):
        digest.update(part.encode("utf-8") + b"\x1e")
    return digest.hexdigest()[:16]


def _load_cached_bpe(folder: Path) -> BPETokenizer | None:
    """The cached tokenizer, or None if it is not whole: its kind file (written last) must be
    there and its digest must match the tokenizer.json actually read."""
    try:
        record = _read_kind_file(folder)
        tokenizer = BPETokenizer.load(folder)
    except TokenizerError:
        return None
    return tokenizer if record == {"kind": "bpe", "digest": tokenizer.digest} else None


def _cached_bpe(train_text: str, vocab_size: int, cache_dir: Path) -> BPETokenizer:
    """Trained once per (text, size): written into a temporary folder and renamed into place, so
    the folder under the final name is whole; one that is not (a copy cut short, a damaged disk)
    is moved away and the tokenizer trained again."""
    root = cache_dir / "tokenizers"
    final = root / _bpe_cache_key(train_text, vocab_size)
    if final.is_dir():
        cached = _load_cached_bpe(final)
        if cached is not None:
            return cached
        discarded = root / f".{final.name}.discarded.{uuid.uuid4().hex}"
        # Out of the way at once (other processes may be reading it), then deleted; another
        # process may have discarded it first.
        with contextlib.suppress(FileNotFoundError):
            os.replace(final, discarded)
        shutil.rmtree(discarded, ignore_errors=True)
    tokenizer = BPETokenizer.train(train_text, vocab_size)
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".partial", dir=root))
    try:
        tokenizer.save(staging)
        try:
            os.rename(staging, final)
        except OSError:
            if not final.is_dir():
                raise
            # else another process put the same tokenizer there first: theirs is as good
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return tokenizer


def build_tokenizer(
    kind: str,
    train_text: str,
    *,
    vocab_size: int = DEFAULT_BPE_VOCAB_SIZE,
    model_path: str | Path | None = None,
    cache_dir: str | Path | None = None,
) -> Tokenizer:
    """The tokenizer a study asks for. "char" is trained on ``train_text`` (cheap: never cached);
    "bpe" too, once, then read from ``cache_dir/tokenizers/`` (always retrained without a
    ``cache_dir``); "model" is read from ``model_path``. ``vocab_size`` is the BPE's alone."""
    if kind not in KINDS:
        raise ValueError(f"unknown tokenizer {kind!r}: choose one of {', '.join(KINDS)}")
    if kind == "char":
        return CharTokenizer.train(train_text)
    if kind == "model":
        if model_path is None:
            raise TokenizerError("the 'model' tokenizer needs model_path: the folder of the model")
        return ModelTokenizer.from_pretrained(model_path)
    if cache_dir is None:
        return BPETokenizer.train(train_text, vocab_size)
    return _cached_bpe(train_text, vocab_size, Path(cache_dir))


def _ids_checksum(ids: torch.Tensor) -> str:
    return hashlib.sha256(ids.numpy().tobytes()).hexdigest()


def _read_token_cache(path: Path, key: str) -> torch.Tensor | None:
    """The cached ids, or None unless the file is whole and is the one asked for: the key, the
    length and the checksum it records must all match what it holds."""
    try:
        with safe_open(str(path), framework="pt") as cache:
            record = cache.metadata() or {}
            ids = cache.get_tensor("ids")
    except (OSError, SafetensorError, KeyError, RuntimeError, ValueError):
        return None
    if (
        ids.dtype != torch.long
        or ids.dim() != 1
        or record.get("key") != key
        or record.get("length") != str(len(ids))
        or record.get("sha256") != _ids_checksum(ids)
    ):
        return None
    return ids


def encode_cached(
    tokenizer: Tokenizer, text: str, *, cache_dir: str | Path, text_digest: str
) -> torch.Tensor:
    """``text``'s token ids (int64), kept in ``cache_dir/tokens/`` as safetensors (nothing is
    unpickled), so every trial of a study does not encode the corpus again. ``text_digest`` names
    the text (its hash, computed by the caller, who usually has it already). A cache file that is
    unreadable, or does not match its recorded length and checksum, is encoded again and rewritten.
    The character tokenizer is not cached: a dictionary lookup per character is about as fast as
    reading the file back, and would cost 8 bytes of disk per character."""
    if isinstance(tokenizer, CharTokenizer):
        return torch.tensor(tokenizer.encode(text), dtype=torch.long)
    key = hashlib.sha256(f"{text_digest}\x1e{tokenizer.digest}".encode()).hexdigest()[:24]
    path = Path(cache_dir) / "tokens" / f"{key}.safetensors"
    if path.is_file():
        cached = _read_token_cache(path, key)
        if cached is not None:
            return cached
    ids = torch.tensor(tokenizer.encode(text), dtype=torch.long)
    record = {"key": key, "length": str(len(ids)), "sha256": _ids_checksum(ids)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, lambda tmp: save_file({"ids": ids}, str(tmp), metadata=record))
    except (OSError, SafetensorError) as err:  # (safetensors reports a full disk as its own error)
        # the ids are right; only the next call will have to encode again
        warnings.warn(f"token cache {path} not written: {err}", RuntimeWarning, stacklevel=2)
    return ids


def bits_per_byte(mean_nats_per_token: float, n_tokens: int, n_bytes: int) -> float:
    """The loss per byte of text, in bits: the total nats over the tokens, divided by the bytes
    those tokens spell and by ln 2. Unlike perplexity, it compares across tokenizers."""
    if n_bytes <= 0:
        raise ValueError(f"bits per byte of no bytes: n_bytes={n_bytes}")
    return mean_nats_per_token * n_tokens / (n_bytes * math.log(2))


def byte_count(tokenizer: Tokenizer, ids: Sequence[int] | torch.Tensor) -> int:
    """The UTF-8 bytes of the text ``ids`` stand for: the denominator of ``bits_per_byte``.
    Character and BPE tokenizers count each token's own bytes (the character tokenizer's unknown
    id 0 as one byte, as its "?"), so the counts of consecutive runs of ids add up to the count of
    the whole, even where a run splits a character. For "model" it is the length of the decoded
    text: exact for byte-level tokenizers (GPT-2's kind) on whole texts, approximate where
    decoding changes the text (a run that splits a character, normalizers, unknown tokens)."""
    if isinstance(tokenizer, CharTokenizer | BPETokenizer):
        token_bytes = tokenizer._token_bytes
        return sum(token_bytes[i] for i in _as_list(ids))
    return len(tokenizer.decode(_as_list(ids)).encode("utf-8"))
