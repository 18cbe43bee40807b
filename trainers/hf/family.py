"""The ``hf`` family as a study sees it (trainers/families.py): its ``[model]`` keys, the model
of the user's a study may start from, and the standard Hugging Face folder it exports. Read by
every study; transformers is imported only when the family is used (trainers/hf/model.py)."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

from trainers.families import ModelFamily, register_family
from trainers.hf.architectures import MODULES
from trainers.hf.export_keys import HEADS_KEY

SIZES = ("n_layer", "n_head", "d_model")  # [model] keys a model at path has of its own


class HuggingFaceFamily(ModelFamily):
    name = "hf"
    keys = {
        "path": {
            "type": str,
            "default": "",
            "doc": "hf: a model folder (relative to the study file) or a name in the Hugging Face cache",
        },
        "architecture": {
            "type": str,
            "default": "",
            "choices": ("", *MODULES),
            "doc": "hf: an architecture built from the sizes above, instead of path",
        },
        "n_kv_head": {
            "type": int,
            "default": 0,
            "low": 0,
            "doc": "llama: key/value heads per layer, dividing n_head (0: n_head, no grouping)",
        },
    }
    min_heads_per_layer = 1  # a transformers attention module needs a head

    def check_table(self, model: dict[str, Any], given: Collection[str]) -> None:
        if bool(model["path"]) == bool(model["architecture"]):
            raise ValueError("family = 'hf' needs either path (a model folder) or architecture")
        if model["path"]:
            if fixed := [k for k in (*SIZES, "n_kv_head", "dropout") if k in given]:
                raise ValueError(f"{fixed[0]}: a model at path has its own sizes; remove the key")
            return
        kv = model["n_kv_head"] or model["n_head"]
        if model["n_head"] % kv:
            raise ValueError(f"n_head {model['n_head']} is not a multiple of n_kv_head {kv}")
        from trainers.hf.architectures import grouped_query

        grouped = grouped_query()
        if kv != model["n_head"] and model["architecture"] not in grouped:
            names = " or ".join(repr(name) for name in grouped)
            raise ValueError(f"n_kv_head: grouped-query attention is for architecture = {names}")

    def user_model(self, model: dict[str, Any], base: Path) -> str | None:
        """[model] path: a folder relative to the study file, else a name in the Hugging Face cache."""
        if not model["path"]:
            return None
        beside = base / model["path"]
        return str(beside.resolve()) if beside.exists() else model["path"]

    def check_user_model(self, path: str, block_size: int) -> None:
        from trainers.hf.model import HFModelConfig, check_weights, read_pretrained_config

        try:
            hf_config = read_pretrained_config(path)
            check_weights(path)
            HFModelConfig(hf_config=hf_config, block_size=block_size)
        except ValueError as err:
            raise ValueError(f"path: {err}") from None

    def model_config(self, model: dict[str, Any], vocab_size: int, user_model: str | None):
        from trainers.hf.model import HFModelConfig, architecture_config, read_pretrained_config

        if user_model:
            hf_config = read_pretrained_config(user_model)
        else:
            hf_config = architecture_config(
                model["architecture"],
                vocab_size=vocab_size,
                n_layer=model["n_layer"],
                n_head=model["n_head"],
                d_model=model["d_model"],
                block_size=model["block_size"],
                n_kv_head=model["n_kv_head"] or None,
                dropout=model["dropout"],
            )
        return HFModelConfig(hf_config=hf_config, block_size=model["block_size"])

    def config_from_dict(self, data: dict):
        from trainers.hf.model import HFModelConfig

        return HFModelConfig.from_dict(data)

    def build_model(self, cfg):
        from trainers.hf.model import HFLanguageModel

        return HFLanguageModel(cfg)

    def load_user_model(self, path: str, block_size: int):
        from trainers.hf.model import HFLanguageModel

        try:
            return HFLanguageModel.from_pretrained(path, block_size)
        except ValueError as err:
            raise ValueError(f"path: {err}") from None

    def user_model_digest(self, path: str) -> str:
        from trainers.hf.model import weights_digest

        return weights_digest(path)

    def export(self, model, tokenizer, source: Path, target: Path) -> None:
        """A standard Hugging Face folder (``trainers.load_pruned`` reads it)."""
        from trainers.hf.model import save_pretrained

        save_pretrained(model, target)
        tokenizer.save(target)

    def reads_export(self, config: dict) -> bool:
        return HEADS_KEY in config

    def load_export(self, folder: Path, device: str):
        from trainers.hf.model import load_pruned
        from trainers.tokenizers import hf_tokenizer, load_tokenizer

        tokenizer = load_tokenizer(folder)
        return load_pruned(folder, device=device), hf_tokenizer(tokenizer) or tokenizer


register_family(HuggingFaceFamily())
