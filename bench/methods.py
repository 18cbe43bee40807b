"""Every pruning method at equal budgets from the same dense checkpoint, for both model families.

    python -m bench.methods                      # the full table (about 45 minutes on 2 cores)
    python -m bench.methods --quick              # a minute: tiny budgets, to check it runs
    python -m bench.methods --families gpt --methods importance --lr 3e-4,3e-3 --seeds 3

Prints one table per family (val perplexity relative to the dense control, lower is better) and
one JSON line with every number.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from orchestrator.config import load_study_config
from trainers.data import Corpus
from trainers.hparams import PretrainConfig, TrialBudget, TrialHParams
from trainers.model import ModelConfig
from trainers.pretrain import ensure_dense_checkpoint
from trainers.trial import TrialSetup, run_trial

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "studies" / "data" / "tinyshakespeare.txt"
STUDY = REPO / "studies" / "tinyshakespeare.toml"
SHIPPED = REPO / "studies" / "checkpoints"

# name -> the hyperparameters that make it (on top of the shared ones)
FROZEN = {"freeze_weights": True}  # gates alone on the dense model, at a rate of 0.05 (see main)
METHODS: dict[str, dict] = {
    "l0_target": {"method": "l0_target"},
    "l0_target+distill": {"method": "l0_target", "distill": True},
    "l0_target frozen": {"method": "l0_target", **FROZEN},
    "l0_target frozen+distill": {"method": "l0_target", "distill": True, **FROZEN},
    "topk frozen+distill": {"method": "topk", "distill": True, **FROZEN},
    "importance": {"method": "importance"},
    "importance+distill": {"method": "importance", "distill": True},
    "random": {"method": "random"},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default="gpt,all_attention")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--sparsities", default="0.25,0.5,0.75")
    parser.add_argument("--seeds", type=int, default=1, help="seeds per cell (batches, random draws)")
    parser.add_argument("--prune-steps", type=int, default=100)
    parser.add_argument("--finetune-steps", type=int, default=300)
    parser.add_argument(
        "--pretrain-steps",
        type=int,
        default=0,
        help="0: the default study's [pretrain] (trained until converged; shipped for gpt), else a "
        "cosine run of this many steps (the earlier, unconverged regime was 1500)",
    )
    parser.add_argument(
        "--lr",
        default=str(TrialHParams().lr),
        help="the weights' learning rate, or several (3e-4,3e-3): a row per method and rate; the "
        "dense control keeps the trainer's default, as a study's does",
    )
    parser.add_argument("--artifacts", type=Path, default=REPO / "runs" / "artifacts")
    parser.add_argument("--quick", action="store_true", help="tiny budgets: checks that it runs")
    args = parser.parse_args()
    if args.quick:
        args.prune_steps, args.finetune_steps, args.pretrain_steps = 10, 5, 20

    corpus = Corpus.load(CORPUS, block_size=128)
    study = load_study_config(STUDY)
    budget = TrialBudget(
        prune_steps=args.prune_steps,
        finetune_steps=args.finetune_steps,
        batch_size=32,
        eval_tokens=study.budget.eval_tokens,
    )
    sparsities = [float(s) for s in args.sparsities.split(",")]
    lrs = list(dict.fromkeys(float(lr) for lr in args.lr.split(",")))
    methods = args.methods.split(",")
    seeds = range(args.seeds)
    report: dict = {"budget": budget.__dict__, "threads": torch.get_num_threads(), "lrs": lrs, "families": {}}
    for family in args.families.split(","):
        cfg = ModelConfig(vocab_size=corpus.vocab_size, family=family)
        pretrain = PretrainConfig(steps=args.pretrain_steps) if args.pretrain_steps else study.pretrain
        dense = ensure_dense_checkpoint(
            corpus, cfg, pretrain, args.artifacts, eval_tokens=budget.eval_tokens, shipped_dir=SHIPPED
        )
        setups = [TrialSetup(corpus, dense, budget, seed=seed) for seed in seeds]
        start = time.perf_counter()
        control_per_seed = [
            run_trial(setup, TrialHParams(method="dense", sparsity=0.0)).val_perplexity for setup in setups
        ]
        control = statistics.mean(control_per_seed)
        rows: dict[str, dict[float, dict]] = {}
        for name, lr in [(name, lr) for name in methods for lr in lrs]:
            row = rows.setdefault(name if len(lrs) == 1 else f"{name} lr={lr:g}", {})
            for s in sparsities:
                frozen_rate = {"gate_lr_mult": 0.05 / lr} if METHODS[name].get("freeze_weights") else {}
                hp = TrialHParams(**{"sparsity": s, "lr": lr, **METHODS[name], **frozen_rate})
                results = [run_trial(setup, hp) for setup in setups]
                ppl = [r.val_perplexity for r in results]
                row[s] = {
                    "ppl": statistics.mean(ppl),
                    "ppl_per_seed": ppl,
                    "ratio": statistics.mean(ppl) / control,
                    # paired: each seed's trial against the same seed's dense control
                    "ratio_per_seed": [p / c for p, c in zip(ppl, control_per_seed)],
                    "heads_per_layer": [r.heads_per_layer for r in results],
                    "seconds": statistics.mean(sum(r.phase_seconds.values()) for r in results),
                }
                print(f"  {family} {name} lr {lr:g} {s}: ppl {[round(p, 3) for p in ppl]}", flush=True)
        report["families"][family] = {
            "dense_pretrained_ppl": dense.val_perplexity,
            "dense_control_ppl": control,
            "dense_control_ppl_per_seed": control_per_seed,
            "rows": rows,
            "minutes": (time.perf_counter() - start) / 60,
        }
        print_table(family, control, rows, sparsities, len(seeds))
    print(json.dumps(report))


def print_table(family: str, control: float, rows: dict, sparsities: list[float], n_seeds: int) -> None:
    print(
        f"\n{family}: val ppl / dense control ({control:.3f}), mean of {n_seeds} seed(s) "
        "[min, max: each seed against its own control], "
        "lower is better"
    )
    print(f"| method | {' | '.join(f'{s:.2f} removed' for s in sparsities)} | s per trial |")
    print(f"| --- | {' | '.join('---' for _ in sparsities)} | --- |")
    for name, by_sparsity in rows.items():
        cells = []
        for s in sparsities:
            cell, ratios = by_sparsity[s], by_sparsity[s]["ratio_per_seed"]
            spread = f" [{min(ratios):.3f}, {max(ratios):.3f}]" if len(ratios) > 1 else ""
            cells.append(f"{cell['ratio']:.3f}{spread} ({cell['ppl']:.3f})")
        seconds = statistics.mean(by_sparsity[s]["seconds"] for s in sparsities)
        print(f"| {name} | {' | '.join(cells)} | {seconds:.0f} |")
    print(flush=True)


if __name__ == "__main__":
    main()
