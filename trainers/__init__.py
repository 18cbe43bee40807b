"""Training and pruning, with no knowledge of Optuna, Ray or databases.

``trainers.load_pruned(folder)`` reads any model ``launch-study export-model`` wrote: a Hugging
Face family's standard folder (a ``transformers`` model with the pruned shapes, and its
tokenizer), or a built-in family's (trainers/export.py).
"""

from pathlib import Path


def load_pruned(folder: str | Path, device: str = "cpu"):
    """(model, tokenizer) of an exported pruned model, ready to generate."""
    from trainers.export import CONFIG, load_model

    folder = Path(folder)
    try:
        import json

        is_hf = "headprune_heads_per_layer" in json.loads((folder / CONFIG).read_text())
    except (OSError, ValueError):
        is_hf = False
    if not is_hf:
        return load_model(folder, device=device)
    from trainers.hf import load_pruned as load_hf
    from trainers.tokenizers import hf_tokenizer, load_tokenizer

    tokenizer = load_tokenizer(folder)
    return load_hf(folder, device=device), hf_tokenizer(tokenizer) or tokenizer


__all__ = ["load_pruned"]
