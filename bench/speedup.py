"""Inference speed of the physically pruned model against the dense one, next to the FLOPs ratio.

    python -m bench.speedup [--quick] [--family NAME ...] [--threads N]

For each family and 25/50/75% of heads removed (the same count in every layer), the median
forward time at batch 1 and batch 32 (block 128), the speed-up (dense time / pruned time) and the
FLOPs ratio (dense FLOPs / pruned FLOPs), the limit a perfect implementation reaches. The
families: the built-in ``gpt`` and ``all_attention`` (default study sizes, a character
vocabulary), and Hugging Face GPT-2, GPT-NeoX and Llama with grouped-query attention (8 query
heads sharing 4 key/value heads) at the same sizes with a 1,024-token BPE vocabulary.

What is timed is what a user runs: both models, dense and pruned, are written to disk and read
back the way ``launch-study export-model`` output is read (the built-in families: trainers/export
``save_model`` / ``load_model``; the Hugging Face ones: trainers/hf ``save_pretrained`` /
``load_pruned``, the transformers model itself called), both under ``torch.inference_mode``, so
the two go through the same runtime. The calls alternate dense / pruned (which goes first
alternating too) so that both see the same machine noise, and the speed-up is the median of the
pairs' ratios: on a busy machine a burst slows one pair, not one model's whole measurement.
Targets (issue 45): all_attention at 50% removed >= 1.7x at batch 1 and 32; every Hugging Face
family's speed-up >= 0.9 of its FLOPs ratio at batch 1 and 32.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D
from transformers.utils import logging as transformers_logging

from bench.common import print_json, print_table
from trainers import load_pruned
from trainers.export import save_model
from trainers.families import export_family, family
from trainers.hf import HFLanguageModel
from trainers.model import LanguageModel, ModelConfig
from trainers.tokenizers import UNKNOWN, CharTokenizer

CHAR_VOCAB, BPE_VOCAB = 66, 1024
SIZES = {"n_layer": 4, "n_head": 8, "d_model": 128, "block_size": 128}


def dense_models():
    """(name, model) for every family at the default study's sizes."""
    for name in ("gpt", "all_attention"):
        yield name, LanguageModel(ModelConfig(vocab_size=CHAR_VOCAB, family=name))
    for architecture, extra in (("gpt2", {}), ("gpt_neox", {}), ("llama", {"n_kv_head": 4})):
        model = HFLanguageModel.from_architecture(architecture, vocab_size=BPE_VOCAB, **SIZES, **extra)
        yield f"hf {architecture}", model


def forward_flops(model, T: int) -> float:
    """Multiply-adds x 2 per sequence of T tokens, any family: every linear layer's weights
    (the output head included; embeddings are lookups) and the attention's scores and weighted
    values over the full T x T (as the kernel computes them; all_attention adds its persistent
    keys). Grouped key/value projections count as the layers they are."""
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, (nn.Linear, Conv1D)))
    cfg = model.cfg
    keys = T + getattr(cfg, "persistent_keys", 0)
    d_head = cfg.d_model // cfg.n_head
    return 2 * T * linear + 2 * 2 * T * keys * sum(cfg.layer_heads) * d_head


def exported(model, folder: Path) -> Callable[[torch.Tensor], torch.Tensor]:
    """``model`` saved as a trial saves it, exported as ``launch-study export-model`` exports it
    (its family's own format, or the project's) and read back with ``trainers.load_pruned``, as
    the function a user calls for logits: a transformers model's, or the project's model's."""
    vocab = [UNKNOWN, *(chr(33 + i) for i in range(model.cfg.vocab_size - 1))]
    tokenizer = CharTokenizer(vocab)
    save_model(model, tokenizer, folder / "trial")
    family(model.cfg.family).export(model, tokenizer, folder / "trial", folder / "export")
    loaded, _ = load_pruned(folder / "export")
    if export_family(folder / "export") is not None:  # a transformers model
        return lambda idx: loaded(input_ids=idx, use_cache=False).logits
    return lambda idx: loaded(idx)[0]


def paired_times(
    dense: Callable[[], object], pruned: Callable[[], object], pairs: int, warmup: int = 3
) -> tuple[float, float, float, float]:
    """(median dense seconds, median pruned seconds, median of the pairs' dense/pruned ratios,
    fastest dense / fastest pruned), calls alternating, each pair's first call alternating too.
    The last is ``timeit``'s reading (the fastest call: what the machine can do when nothing
    else runs), a check on the median where other work shares the cores."""
    for _ in range(warmup):
        dense(), pruned()
    t_dense, t_pruned = [], []
    for i in range(pairs):
        for fn, times in ((dense, t_dense), (pruned, t_pruned))[:: 1 if i % 2 else -1]:
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    ratios = [d / p for d, p in zip(t_dense, t_pruned)]
    return (
        statistics.median(t_dense),
        statistics.median(t_pruned),
        statistics.median(ratios),
        min(t_dense) / min(t_pruned),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few pairs each (a smoke test)")
    parser.add_argument(
        "--family", action="append", help="only this family (repeatable): gpt, all_attention, 'hf gpt2', ..."
    )
    parser.add_argument(
        "--threads",
        type=int,
        help="torch threads (default torch's): 1 where other work holds a core, "
        "which otherwise stalls every multi-threaded kernel",
    )
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    transformers_logging.disable_progress_bar()  # save_pretrained's bar, once per model written
    torch.manual_seed(0)
    rows, results = [], []
    with tempfile.TemporaryDirectory() as tmp, torch.inference_mode():
        for family, dense in dense_models():
            if args.family and family not in args.family:
                continue
            dense.eval()
            folder = Path(tmp) / family.replace(" ", "_")
            run_dense = exported(dense, folder / "dense")
            n = dense.cfg.n_head
            for removed in (0.25, 0.5, 0.75):
                keep_per_layer = round(n * (1 - removed))
                pruned = dense.prune_heads([list(range(keep_per_layer))] * dense.cfg.n_layer).eval()
                run_pruned = exported(pruned, folder / f"pruned_{removed}")
                check = torch.randint(0, dense.cfg.vocab_size, (2, 128))
                # The exported model is the pruned one: it computes what the model in memory does.
                if not torch.allclose(run_pruned(check), pruned(check)[0], atol=1e-5):
                    raise SystemExit(f"{family}: the exported pruned model's logits differ")
                flops_ratio = forward_flops(dense, 128) / forward_flops(pruned, 128)
                for batch in (1, 32):
                    x = torch.randint(0, dense.cfg.vocab_size, (batch, 128))
                    pairs = (200 if batch == 1 else 24) if not args.quick else 3
                    t_dense, t_pruned, speedup, speedup_best = paired_times(
                        partial(run_dense, x), partial(run_pruned, x), pairs
                    )
                    results.append(
                        {
                            "family": family,
                            "removed": removed,
                            "batch": batch,
                            "speedup": speedup,
                            "speedup_best": speedup_best,
                            "flops_ratio": flops_ratio,
                            "dense_tokens_per_s": batch * 128 / t_dense,
                            "pruned_tokens_per_s": batch * 128 / t_pruned,
                        }
                    )
                    rows.append(
                        [
                            family,
                            f"{removed:.2f}",
                            str(batch),
                            f"{batch * 128 / t_dense:,.0f}",
                            f"{batch * 128 / t_pruned:,.0f}",
                            f"{speedup:.2f}x",
                            f"{flops_ratio:.2f}x",
                            f"{speedup / flops_ratio:.2f}",
                        ]
                    )
    print_table(
        f"inference speed of exported models, torch threads {torch.get_num_threads()}",
        [
            "family",
            "removed",
            "batch",
            "dense tok/s",
            "pruned tok/s",
            "speed-up",
            "FLOPs ratio",
            "speed-up / FLOPs ratio",
        ],
        rows,
    )
    print_json("speedup", {"threads": torch.get_num_threads(), "results": results})


if __name__ == "__main__":
    main()
