"""Every model on disk, dense or pruned, in one format, loadable without the study:
safetensors weights, a JSON config and the vocabulary. Nothing here unpickles.

    from trainers.export import load_model, generate
    model, vocab = load_model("pruned/")
    print(generate(model, vocab, "ROMEO:", 200))

Each file is written under a temporary name and renamed into place, the config last: it records
the SHA-256 of the weights and the vocabulary, and ``load_model`` checks them. So a write cut
short, a truncated copy or a flipped bit is a ``CorruptModel`` error naming the folder and the
file, never a model with wrong weights.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from trainers.model import LanguageModel, ModelConfig

WEIGHTS, CONFIG, VOCAB = "model.safetensors", "config.json", "vocab.json"


class CorruptModel(ValueError):
    """A model folder that cannot be trusted: missing, truncated or altered files."""


class UnverifiedModel(CorruptModel):
    """A model folder of an earlier version, written before checksums were recorded."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _replace(path: Path, write) -> None:
    """``write(tmp)`` then rename over ``path``: readers see the old file or the new, whole."""
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_model(model: LanguageModel, vocab: list[str], folder: str | Path, extra: dict | None = None) -> Path:
    """Write ``model`` (its config and ``extra`` beside it in config.json) and ``vocab``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    # The output head shares the token embedding: store it once.
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items() if k != "head.weight"}
    _replace(folder / WEIGHTS, lambda tmp: save_file(state, str(tmp)))
    _replace(
        folder / VOCAB, lambda tmp: tmp.write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    )
    config = {
        "model": model.cfg.to_dict(),
        **(extra or {}),
        "sha256": {name: _sha256(folder / name) for name in (WEIGHTS, VOCAB)},
    }
    _replace(folder / CONFIG, lambda tmp: tmp.write_text(json.dumps(config, indent=2)))
    return folder


def read_config(folder: str | Path, verify: bool = True) -> dict:
    """config.json of a model folder, with the files it vouches for checked against it
    (``verify=False``: a folder without checksums is read as it is)."""
    folder = Path(folder)
    try:
        config = json.loads((folder / CONFIG).read_text())
    except FileNotFoundError:
        raise CorruptModel(f"{folder}: no {CONFIG}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CorruptModel(f"{folder / CONFIG} is unreadable ({err})") from None
    if not isinstance(config, dict) or "model" not in config:
        raise CorruptModel(f"{folder / CONFIG} holds no model config")
    digests = config.get("sha256")
    if digests is None and not verify:
        return config
    if not isinstance(digests, dict) or set(digests) != {WEIGHTS, VOCAB}:
        raise UnverifiedModel(f"{folder / CONFIG} records no checksums (written before they were)")
    for name, expected in digests.items():
        if not (folder / name).is_file():
            raise CorruptModel(f"{folder}: {name} is missing")
        if _sha256(folder / name) != expected:
            raise CorruptModel(f"{folder / name} does not match its checksum (truncated or altered)")
    return config


def load_model(
    folder: str | Path, device: str = "cpu", verify: bool = True
) -> tuple[LanguageModel, list[str]]:
    """The model and vocabulary in ``folder``, checked (``CorruptModel`` if anything is off)."""
    folder = Path(folder)
    config = read_config(folder, verify)
    try:
        model = LanguageModel(ModelConfig.from_dict(config["model"]))
        state = load_file(str(folder / WEIGHTS))
        state["head.weight"] = state["tok_emb.weight"]
        model.load_state_dict(state)
        vocab = json.loads((folder / VOCAB).read_text(encoding="utf-8"))
    except (KeyError, TypeError, ValueError, RuntimeError) as err:  # checksums fine, content not ours
        raise CorruptModel(f"{folder}: not a model of this format ({err})") from None
    return model.to(device).eval(), vocab


@torch.no_grad()
def generate(
    model: LanguageModel, vocab: list[str], prompt: str, n_chars: int, temperature: float = 0.8, seed: int = 0
) -> str:
    """Sample ``n_chars`` characters after ``prompt`` (characters outside the vocabulary are
    read as the unknown token)."""
    index = {ch: i for i, ch in enumerate(vocab)}
    device = next(model.parameters()).device
    ids = torch.tensor([[index.get(ch, 0) for ch in prompt] or [0]], device=device)
    generator = torch.Generator(device=device).manual_seed(seed)
    for _ in range(n_chars):
        logits, _ = model(ids[:, -model.cfg.block_size :])
        probs = torch.softmax(logits[0, -1] / temperature, dim=-1)
        probs[0] = 0.0  # never emit the unknown token
        ids = torch.cat([ids, torch.multinomial(probs, 1, generator=generator).view(1, 1)], dim=1)
    return prompt + "".join(vocab[i] for i in ids[0, len(prompt) or 1 :].tolist())
