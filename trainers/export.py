"""Every model on disk, dense or pruned, of any family, in one format, loadable without the
study: safetensors weights, the tokenizer's files and a JSON config. Nothing here unpickles.

    from trainers.export import load_model, generate
    model, tokenizer = load_model("pruned/")
    print(generate(model, tokenizer, "ROMEO:", 200))

The weights are written under a temporary name and renamed into place, the config last: it
records the SHA-256 of the weights and of every tokenizer file, and ``load_model`` checks them.
So a write cut short, a truncated copy or a flipped bit is a ``CorruptModel`` error naming the
folder and the file, never a model with wrong weights. (A Hugging Face family's trial can also be
exported as a standard ``save_pretrained`` folder: trainers/hf/family.py.)
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from trainers.atomic import write_atomically
from trainers.families import PrunableModel, build_model, config_from_dict
from trainers.tokenizers import CharTokenizer, Tokenizer, load_tokenizer

WEIGHTS, CONFIG = "model.safetensors", "config.json"


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


def save_model(
    model: PrunableModel, tokenizer: Tokenizer, folder: str | Path, extra: dict | None = None
) -> Path:
    """Write ``model`` (its config and ``extra`` beside it in config.json) and ``tokenizer``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = model.saved_state()
    write_atomically(folder / WEIGHTS, lambda tmp: save_file(state, str(tmp)))
    tokenizer.save(folder)
    tokenizer_files = sorted(
        path.name
        for path in folder.iterdir()
        if path.is_file() and not path.name.startswith(".") and path.name not in (WEIGHTS, CONFIG)
    )
    config = {
        "model": model.cfg.to_dict(),
        **(extra or {}),
        "sha256": {name: _sha256(folder / name) for name in (WEIGHTS, *tokenizer_files)},
    }
    write_atomically(folder / CONFIG, lambda tmp: tmp.write_text(json.dumps(config, indent=2)))
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
    if not isinstance(digests, dict) or WEIGHTS not in digests:
        if not verify:
            return config
        raise UnverifiedModel(f"{folder / CONFIG} records no checksums (written before they were)")
    for name, expected in digests.items():
        if not (folder / name).is_file():
            raise CorruptModel(f"{folder}: {name} is missing")
        if _sha256(folder / name) != expected:
            raise CorruptModel(f"{folder / name} does not match its checksum (truncated or altered)")
    return config


def load_model(
    folder: str | Path, device: str = "cpu", verify: bool = True
) -> tuple[PrunableModel, Tokenizer]:
    """The model and tokenizer in ``folder``, checked (``CorruptModel`` if anything is off)."""
    folder = Path(folder)
    config = read_config(folder, verify)
    try:
        model = build_model(config_from_dict(config["model"]))
        model.load_saved_state(load_file(str(folder / WEIGHTS)))
        tokenizer = load_tokenizer(folder)
    except (
        KeyError,
        TypeError,
        ValueError,
        RuntimeError,
        OSError,
        SafetensorError,  # weights not in the safetensors format (unchecked: a folder without checksums)
    ) as err:  # checksums fine, content not ours
        raise CorruptModel(f"{folder}: not a model of this format ({err})") from None
    return model.to(device).eval(), tokenizer


@torch.no_grad()
def generate(
    model: PrunableModel,
    tokenizer: Tokenizer,
    prompt: str,
    n_tokens: int,
    temperature: float = 0.8,
    seed: int = 0,
) -> str:
    """Sample ``n_tokens`` tokens after ``prompt``. A character tokenizer never emits its unknown
    token (id 0), which stands for characters the training text lacked."""
    device = next(model.parameters()).device
    prompt_ids = tokenizer.encode(prompt) or [0]
    ids = torch.tensor([prompt_ids], device=device)
    generator = torch.Generator(device=device).manual_seed(seed)
    for _ in range(n_tokens):
        logits, _ = model(ids[:, -model.cfg.block_size :])
        probs = torch.softmax(logits[0, -1].float() / temperature, dim=-1)
        if isinstance(tokenizer, CharTokenizer):
            probs[0] = 0.0
        ids = torch.cat([ids, torch.multinomial(probs, 1, generator=generator).view(1, 1)], dim=1)
    return prompt + tokenizer.decode(ids[0, len(prompt_ids) :].tolist())
