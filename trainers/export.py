"""A pruned model on disk, loadable without the study: safetensors weights, a JSON config and the
vocabulary. Nothing here unpickles: safetensors and JSON only.

    from trainers.export import load_pruned, generate
    model, vocab = load_pruned("pruned/")
    print(generate(model, vocab, "ROMEO:", 200))
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from trainers.model import LanguageModel, ModelConfig

WEIGHTS, CONFIG, VOCAB = "model.safetensors", "config.json", "vocab.json"


def save_pruned(
    model: LanguageModel, vocab: list[str], folder: str | Path, extra: dict | None = None
) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    # The output head shares the token embedding: store it once.
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items() if k != "head.weight"}
    save_file(state, str(folder / WEIGHTS))
    (folder / CONFIG).write_text(json.dumps({"model": model.cfg.to_dict(), **(extra or {})}, indent=2))
    (folder / VOCAB).write_text(json.dumps(vocab, ensure_ascii=False))
    return folder


def load_pruned(folder: str | Path, device: str = "cpu") -> tuple[LanguageModel, list[str]]:
    folder = Path(folder)
    cfg = ModelConfig.from_dict(json.loads((folder / CONFIG).read_text())["model"])
    model = LanguageModel(cfg)
    state = load_file(str(folder / WEIGHTS))
    state["head.weight"] = state["tok_emb.weight"]
    model.load_state_dict(state)
    vocab = json.loads((folder / VOCAB).read_text(encoding="utf-8"))
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
