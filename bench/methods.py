"""Every pruning method at equal budgets from the same dense checkpoint, for both model families.

    python -m bench.methods                      # the full table (about 35 minutes on 2 cores)
    python -m bench.methods --quick              # a minute: tiny budgets, to check it runs

Prints one table per family (val perplexity relative to the dense control, lower is better) and
one JSON line with every number.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from trainers.data import CharCorpus
from trainers.hparams import PretrainConfig, TrialBudget, TrialHParams
from trainers.model import ModelConfig
from trainers.pretrain import ensure_dense_checkpoint
from trainers.trial import TrialSetup, run_trial

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "studies" / "data" / "tinyshakespeare.txt"

# name -> the hyperparameters that make it (on top of the shared ones)
METHODS: dict[str, dict] = {
    "l0_target": {"method": "l0_target"},
    "l0_target+distill": {"method": "l0_target", "distill": True},
    "topk": {"method": "topk"},
    "importance": {"method": "importance"},
    "random": {"method": "random"},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default="gpt,all_attention")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--sparsities", default="0.25,0.5,0.75")
    parser.add_argument("--prune-steps", type=int, default=250)
    parser.add_argument("--finetune-steps", type=int, default=150)
    parser.add_argument("--pretrain-steps", type=int, default=1500)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--artifacts", type=Path, default=REPO / "runs" / "artifacts")
    parser.add_argument("--quick", action="store_true", help="tiny budgets: checks that it runs")
    args = parser.parse_args()
    if args.quick:
        args.prune_steps, args.finetune_steps, args.pretrain_steps = 10, 5, 20

    torch.set_num_threads(max(1, torch.get_num_threads()))
    corpus = CharCorpus.load(CORPUS, block_size=128)
    budget = TrialBudget(
        prune_steps=args.prune_steps, finetune_steps=args.finetune_steps, batch_size=32, eval_tokens=32768
    )
    sparsities = [float(s) for s in args.sparsities.split(",")]
    methods = args.methods.split(",")
    report: dict = {"budget": budget.__dict__, "threads": torch.get_num_threads(), "families": {}}
    for family in args.families.split(","):
        cfg = ModelConfig(vocab_size=corpus.vocab_size, family=family)
        dense = ensure_dense_checkpoint(
            corpus, cfg, PretrainConfig(steps=args.pretrain_steps), args.artifacts, eval_tokens=32768
        )
        setup = TrialSetup(corpus, dense, budget, seed=0)
        start = time.perf_counter()
        control = run_trial(setup, TrialHParams(method="dense", sparsity=0.0, lr=args.lr))
        rows: dict[str, dict[float, dict]] = {}
        for name in methods:
            rows[name] = {}
            for s in sparsities:
                result = run_trial(setup, TrialHParams(**{"sparsity": s, "lr": args.lr, **METHODS[name]}))
                rows[name][s] = {
                    "ppl": result.val_perplexity,
                    "ratio": result.val_perplexity / control.val_perplexity,
                    "heads_per_layer": result.heads_per_layer,
                    "seconds": sum(result.phase_seconds.values()),
                }
                print(
                    f"  {family} {name} {s}: ppl {result.val_perplexity:.3f} heads {result.heads_per_layer}",
                    flush=True,
                )
        report["families"][family] = {
            "dense_pretrained_ppl": dense.val_perplexity,
            "dense_control_ppl": control.val_perplexity,
            "n_params_dense": control.n_params,
            "rows": rows,
            "minutes": (time.perf_counter() - start) / 60,
        }
        print_table(family, control.val_perplexity, rows, sparsities)
    print(json.dumps(report))


def print_table(family: str, control: float, rows: dict, sparsities: list[float]) -> None:
    print(f"\n{family}: val perplexity / dense control ({control:.3f}); lower is better")
    print(f"| method | {' | '.join(f'{s:.2f} removed' for s in sparsities)} |")
    print(f"| --- | {' | '.join('---' for _ in sparsities)} |")
    for name, by_sparsity in rows.items():
        cells = [f"{by_sparsity[s]['ratio']:.3f} ({by_sparsity[s]['ppl']:.2f})" for s in sparsities]
        print(f"| {name} | {' | '.join(cells)} |")
    print(flush=True)


if __name__ == "__main__":
    main()
