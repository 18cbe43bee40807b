"""Per-trial orchestration cost: the real study (Ray Tune + Optuna + database) against a plain
Optuna ask/tell loop over a process pool, both on the same trivial trials.

    python -m bench.overhead [--trials 30]

A trial's overhead is the study's span (first trial's start to last trial's end) minus the time
the trials themselves report, divided by the number of trials. The floor is the same for the
plain loop. Targets (issue 7): under 1 s per trial, and under 2% of a default-study trial.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import optuna
import torch

from bench.common import print_json, print_table
from orchestrator.config import load_study_config
from orchestrator.inputs import prepare_inputs
from orchestrator.runner import run_study
from orchestrator.session import RunOptions
from trainers.hparams import TrialHParams
from trainers.pretrain import ensure_dense_checkpoint
from trainers.trial import TrialSetup, run_trial

REPO = Path(__file__).resolve().parent.parent
TINY = [
    "pretrain.steps=5",
    "trial.prune_steps=1",
    "trial.finetune_steps=1",
    "trial.eval_tokens=64",
    "trial.batch_size=2",
    "study.cpus_per_trial=1",
]
# median trial wall time of the default study, uncontended (docs/journal/2026-12-02-orchestration-overhead.md)
DEFAULT_TRIAL_SECONDS = 62.0


def span_and_compute(study: optuna.Study) -> tuple[float, float]:
    done = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    span = (max(t.datetime_complete for t in done) - min(t.datetime_start for t in done)).total_seconds()
    compute = sum(sum(t.user_attrs["phase_seconds"].values()) for t in done)
    return span, compute


_SETUP: TrialSetup | None = None


def _init(setup: TrialSetup) -> None:
    global _SETUP
    _SETUP = setup
    torch.set_num_threads(1)


def _work(hparams: dict) -> dict:
    return run_trial(_SETUP, TrialHParams(**hparams)).to_dict()


def plain_loop(cfg, setup: TrialSetup, n: int, url: str) -> optuna.Study:
    """The floor: ask, run in a worker process, tell; nothing else."""
    study = optuna.create_study(storage=url, study_name="floor", directions=["minimize", "minimize"])
    with ProcessPoolExecutor(max_workers=1, initializer=_init, initargs=(setup,)) as pool:
        pool.submit(time.sleep, 0).result()  # the pool is up before the clock starts
        for _ in range(n):
            trial = study.ask()
            result = pool.submit(_work, cfg.search.suggest(trial)).result()
            trial.set_user_attr("phase_seconds", result["phase_seconds"])
            study.tell(trial, [result["val_perplexity"], result["n_params"]])
    return study


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=30)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    cfg = load_study_config(REPO / "studies" / "smoke.toml", TINY)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        opts = RunOptions(
            storage_url=f"sqlite:///{tmp}/study.db",
            study_name="overhead",
            n_trials=args.trials,
            max_concurrent=1,
            artifacts=tmp / "artifacts",
            output_csv=tmp / "front.csv",
        )
        start = time.perf_counter()
        run_study(cfg, opts)
        total = time.perf_counter() - start
        ours = optuna.load_study(study_name="overhead", storage=opts.storage_url)
        our_span, our_compute = span_and_compute(ours)

        corpus, model_cfg = prepare_inputs(cfg)
        dense = ensure_dense_checkpoint(corpus, model_cfg, cfg.pretrain, opts.artifacts, eval_tokens=64)
        floor = plain_loop(
            cfg, TrialSetup(corpus, dense, cfg.budget, 0), args.trials, f"sqlite:///{tmp}/floor.db"
        )
        floor_span, floor_compute = span_and_compute(floor)

    ours_per = (our_span - our_compute) / args.trials
    floor_per = (floor_span - floor_compute) / args.trials
    share = ours_per / DEFAULT_TRIAL_SECONDS
    print_table(
        f"orchestration overhead per trial, {args.trials} trivial trials",
        ["", "seconds per trial", "start-up (s)"],
        [
            ["study (Ray Tune + Optuna + DB)", f"{ours_per:.3f}", f"{total - our_span:.1f}"],
            ["plain ask/tell over a process pool", f"{floor_per:.3f}", "-"],
            ["ratio study / floor", f"{ours_per / floor_per:.1f}x", ""],
            [f"share of a default-study trial ({DEFAULT_TRIAL_SECONDS:.0f} s)", f"{100 * share:.2f}%", ""],
        ],
    )
    print(
        f"targets: < 1 s per trial: {'met' if ours_per < 1 else 'not met'}; "
        f"< 2% of a default trial: {'met' if share < 0.02 else 'not met'}"
    )
    print_json(
        "overhead",
        {
            "trials": args.trials,
            "study_per_trial_s": ours_per,
            "floor_per_trial_s": floor_per,
            "startup_s": total - our_span,
            "share_of_default_trial": share,
        },
    )


if __name__ == "__main__":
    main()
