"""The front of a searched study against single-method sweeps at the same trial budget.

    python -m bench.frontier [--trials 8] [--set trial.finetune_steps=300 ...]

Three arms from the same dense checkpoint and the same per-trial budget:
- ``searched``: the default study (Ray Tune + Optuna, the method searched), ``--trials`` trials,
  the first of which is the dense control;
- ``importance`` and ``random`` sweeps: the same dense control plus ``--trials - 1`` trials at
  sparsities evenly spread over the study's sparsity range, every other knob at its default.

For each front: the normalised hypervolume (perplexity / dense control, params / dense params,
reference point (2, 1)), and the lowest perplexity relative to the dense control among its points
with at least 50% and at least 75% of the heads removed. Targets (issue 7): the searched front's
hypervolume beats both sweeps; at 50% removed, within 2% of the dense control.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import optuna
import torch

from bench.common import print_json, print_table
from orchestrator.config import load_study_config
from orchestrator.report import normalised_hypervolume
from orchestrator.runner import RunOptions, prepare_inputs, run_study
from trainers.hparams import TrialHParams
from trainers.pretrain import ensure_dense_checkpoint
from trainers.trial import TrialSetup, run_trial

REPO = Path(__file__).resolve().parent.parent
SWEEPS = ("importance", "random")


def searched_arm(cfg, trials: int, artifacts: Path) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        opts = RunOptions(
            storage_url=f"sqlite:///{tmp}/study.db",
            study_name="frontier",
            n_trials=trials,
            max_concurrent=cfg.study.max_concurrent,
            artifacts=artifacts,
            output_csv=Path(tmp) / "front.csv",
        )
        run_study(cfg, opts)
        study = optuna.load_study(study_name="frontier", storage=opts.storage_url)
        return [
            {
                "method": t.user_attrs["method"],
                "sparsity": t.user_attrs["sparsity"],
                "ppl": t.values[0],
                "params": int(t.values[1]),
            }
            for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
        ]


def sweep_arm(method: str, setup: TrialSetup, sparsities: list[float]) -> list[dict]:
    points = []
    for s in sparsities:
        result = run_trial(setup, TrialHParams(method=method, sparsity=s))
        points.append(
            {
                "method": method,
                "sparsity": result.sparsity,
                "ppl": result.val_perplexity,
                "params": result.n_params,
            }
        )
        print(f"  {method} {s:.3f}: ppl {result.val_perplexity:.3f}", flush=True)
    return points


def earlier_sweeps(path: Path, trials: int, dense: tuple[float, int]) -> dict[str, list[dict]]:
    lines = [line for line in path.read_text().splitlines() if line.startswith('{"bench": "frontier"')]
    if not lines:
        raise SystemExit(f"{path}: no frontier JSON line")
    earlier = json.loads(lines[-1])
    if earlier["trials"] != trials or tuple(earlier["dense"]) != dense:
        raise SystemExit(f"{path}: another budget (trials {earlier['trials']}, dense {earlier['dense']})")
    print(f"sweeps reused from {path}")
    return {method: earlier["arms"][method] for method in SWEEPS}


def summarise(points: list[dict], dense: tuple[float, int]) -> dict:
    def best_from(removed: float) -> float | None:
        ppl = [p["ppl"] for p in points if p["sparsity"] >= removed - 1e-9]
        return min(ppl) / dense[0] if ppl else None

    return {
        "hypervolume": normalised_hypervolume([(p["ppl"], p["params"]) for p in points], dense),
        "ppl_ratio_50": best_from(0.5),
        "ppl_ratio_75": best_from(0.75),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8, help="trials per arm, the dense control included")
    parser.add_argument("--set", action="append", default=[], help="a study-file override, as the CLI's")
    parser.add_argument("--artifacts", type=Path, default=REPO / "runs" / "artifacts")
    parser.add_argument(
        "--sweeps-from",
        type=Path,
        help="reuse the sweeps of an earlier run's output (its JSON line): they do not depend on the "
        "searched arm; refused unless its dense control is this run's to the last digit",
    )
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    cfg = load_study_config(
        REPO / "studies" / "tinyshakespeare.toml", [f"study.n_trials={args.trials}", *args.set]
    )
    artifacts = args.artifacts.resolve()

    start = time.perf_counter()
    searched = searched_arm(cfg, args.trials, artifacts)
    dense_point = next(p for p in searched if p["method"] == "dense")
    dense = (dense_point["ppl"], dense_point["params"])
    minutes = {"searched": (time.perf_counter() - start) / 60}

    corpus, model_cfg = prepare_inputs(cfg)
    checkpoint = ensure_dense_checkpoint(
        corpus, model_cfg, cfg.pretrain, artifacts, eval_tokens=cfg.budget.eval_tokens
    )
    torch.set_num_threads(max(1, int(cfg.study.cpus_per_trial)))
    setup = TrialSetup(corpus, checkpoint, cfg.budget, cfg.study.seed)
    low, high = min(cfg.search.entries["sparsity"].values()), max(cfg.search.entries["sparsity"].values())
    sparsities = [float(s) for s in np.linspace(low, high, args.trials - 1)]
    arms = {"searched": searched}
    if args.sweeps_from:
        arms.update(earlier_sweeps(args.sweeps_from, args.trials, dense))
    for method in SWEEPS:
        if method in arms:
            continue
        start = time.perf_counter()
        arms[method] = [dense_point, *sweep_arm(method, setup, sparsities)]
        minutes[method] = (time.perf_counter() - start) / 60

    summary = {name: summarise(points, dense) for name, points in arms.items()}

    def ratio(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    print_table(
        f"fronts at {args.trials} trials each (dense control: ppl {dense[0]:.3f}, {dense[1]:,} params)",
        ["arm", "hypervolume", "best ppl / dense, >= 50% removed", "best ppl / dense, >= 75% removed"],
        [
            [name, f"{s['hypervolume']:.4f}", ratio(s["ppl_ratio_50"]), ratio(s["ppl_ratio_75"])]
            for name, s in summary.items()
        ],
    )
    beats = all(summary["searched"]["hypervolume"] > summary[m]["hypervolume"] for m in SWEEPS)
    close = (summary["searched"]["ppl_ratio_50"] or float("inf")) <= 1.02
    print(
        f"targets: searched hypervolume beats both sweeps: {'met' if beats else 'not met'}; "
        f"50% removed within 2% of dense: {'met' if close else 'not met'}"
    )
    print_json(
        "frontier",
        {"trials": args.trials, "dense": dense, "summary": summary, "arms": arms, "minutes": minutes},
    )


if __name__ == "__main__":
    main()
