"""Trials per hour with 1 and with 2 concurrent trials, threads per trial set accordingly.

    python -m bench.scaling [--trials 4] [--set trial.finetune_steps=100 ...]

Both arms run the real study (Ray Tune + Optuna + SQLite) on the default study's trial, every
hyperparameter fixed so the arms do the same work: arm 1 runs one trial at a time with all the
machine's cores, arm 2 runs two at once with half the cores each. Throughput is trials per hour
over the span from the first trial's start to the last one's end (Ray's start-up excluded; the
overhead benchmark measures it).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import optuna

from bench.common import print_json, print_table
from bench.overhead import span_and_compute
from orchestrator.config import load_study_config
from orchestrator.runner import run_study
from orchestrator.session import RunOptions

REPO = Path(__file__).resolve().parent.parent
# One trial, repeated: the default study's l0_target trial at half the heads.
FIXED = [
    "search.method='l0_target'",
    "search.sparsity=0.5",
    "search.lr=1e-3",
    "search.gate_lr_mult=100.0",
    "search.schedule_warmup=0.5",
    "search.distill=false",
    "search.freeze_weights=false",
    "startup.lr=1e-3",  # the study's [startup] lr must match a fixed [search] lr
]


def run_arm(concurrent: int, cores: int, trials: int, artifacts: Path, extra: list[str]) -> dict:
    cpus = max(1, cores // concurrent)
    cfg = load_study_config(
        REPO / "studies" / "tinyshakespeare.toml",
        [*FIXED, f"study.cpus_per_trial={cpus}", f"study.max_concurrent={concurrent}", *extra],
    )
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/study.db"
        opts = RunOptions(
            storage_url=url,
            study_name=f"scaling{concurrent}",
            n_trials=trials,
            max_concurrent=concurrent,
            artifacts=artifacts,  # shared: the dense checkpoint is pretrained once
            output_csv=Path(tmp) / "front.csv",
        )
        start = time.perf_counter()
        run_study(cfg, opts)
        wall = time.perf_counter() - start
        span, compute = span_and_compute(optuna.load_study(study_name=opts.study_name, storage=url))
    return {
        "concurrent": concurrent,
        "threads_per_trial": cpus,
        "trials": trials,
        "span_s": span,
        "mean_trial_s": compute / trials,
        "trials_per_hour": 3600 * trials / span,
        "wall_s": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--trials", type=int, default=4, help="trials per arm (the first is the dense control)"
    )
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--set", action="append", default=[], help="a study-file override, as the CLI's")
    parser.add_argument("--artifacts", type=Path, default=REPO / "runs" / "artifacts")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    arms = [run_arm(c, args.cores, args.trials, args.artifacts.resolve(), args.set) for c in (1, 2)]
    ratio = arms[1]["trials_per_hour"] / arms[0]["trials_per_hour"]
    print_table(
        f"trials per hour on {args.cores} cores, {args.trials} identical trials per arm",
        ["concurrent trials", "threads per trial", "mean trial (s)", "span (s)", "trials per hour"],
        [
            [
                str(a["concurrent"]),
                str(a["threads_per_trial"]),
                f"{a['mean_trial_s']:.1f}",
                f"{a['span_s']:.1f}",
                f"{a['trials_per_hour']:.1f}",
            ]
            for a in arms
        ],
    )
    print(f"throughput ratio 2 concurrent / 1 concurrent: {ratio:.2f}x")
    print_json("scaling", {"cores": args.cores, "arms": arms, "ratio": ratio})


if __name__ == "__main__":
    main()
