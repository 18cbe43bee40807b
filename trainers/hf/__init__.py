"""The ``hf`` model family: a Hugging Face causal LM (GPT-2, GPT-NeoX/Pythia, Llama with grouped-query
attention) behind the same seam as trainers/model.py's ``LanguageModel`` (trainers/families.py).

Head gates and physical pruning need two things the stock attention modules do not have: a place to
multiply each head's output before the output projection, and layers with different head counts
(and, under grouped-query attention, uneven groups). Both live in one attention function registered
with transformers' public ``AttentionInterface`` under the name ``"headprune"``, which the attention
modules of all three architectures call with their queries, keys and values; it gathers each query
head's key/value head through the module's ``headprune_kv_index`` buffer (absent: the dense
mapping), runs ``scaled_dot_product_attention`` and multiplies the result by the module's
``headprune_gate`` (set for one forward call). The modules' projections are then simply sliced: they
reshape with ``-1`` heads, so smaller weights are all a pruned layer needs (GPT-2 also splits
``c_attn`` by ``split_size``).

Per-architecture code (which projection holds which head's rows, the config's size keys) is in
one module per architecture: ``gpt2.py``, ``gpt_neox.py``, ``llama.py`` (``architectures.py``).

Everything is offline: a model is built from a config, read from a local folder, or from the local
Hugging Face cache, never downloaded. A pruned model can be written as a standard ``save_pretrained``
folder whose config records the heads kept (``save_pretrained``), and read back with ``load_pruned``.
"""

import importlib

# What ``from trainers.hf import X`` gives, imported on first use (PEP 562): the family's
# declaration (family.py) is read by every study, transformers only by the studies that use it.
_FROM_MODEL = (
    "HFLanguageModel",
    "HFModelConfig",
    "ModelNotFound",
    "architecture_config",
    "check_weights",
    "load_pruned",
    "read_pretrained_config",
    "save_pretrained",
    "weights_digest",
)
__all__ = ["ARCHITECTURES", *_FROM_MODEL]


def __getattr__(name: str):
    if name in _FROM_MODEL:
        return getattr(importlib.import_module("trainers.hf.model"), name)
    if name == "ARCHITECTURES":
        return tuple(importlib.import_module("trainers.hf.architectures").architectures())
    raise AttributeError(f"module 'trainers.hf' has no attribute {name!r}")
