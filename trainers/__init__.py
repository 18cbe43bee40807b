"""Training and pruning, with no knowledge of Optuna, Ray or databases.

``trainers.load_pruned(folder)`` reads any model ``launch-study export-model`` wrote: a format
of its family's own (a Hugging Face family's standard folder: a ``transformers`` model with the
pruned shapes, and its tokenizer), or the project's (trainers/export.py).
"""

from pathlib import Path


def load_pruned(folder: str | Path, device: str = "cpu"):
    """(model, tokenizer) of an exported pruned model, ready to generate."""
    from trainers.export import load_model
    from trainers.families import export_family

    folder = Path(folder)
    family = export_family(folder)
    if family is None:
        return load_model(folder, device=device)
    return family.load_export(folder, device)


__all__ = ["load_pruned"]
