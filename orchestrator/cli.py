"""``launch-study``: run a study from a TOML file (or resume it), export its Pareto front."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from orchestrator.errors import UserError


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line like every other user error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"launch-study: error: {message} (see --help)\n")


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="launch-study", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = commands.add_parser("run", help="run (or resume) a study from a TOML file")
    run.add_argument("study_file", type=Path)
    run.add_argument(
        "--storage", help="database URL (default: $HEADPRUNE_STORAGE, else sqlite:///runs/<study>.db)"
    )
    run.add_argument("--study-name", help="default: [study] name")
    run.add_argument("--n-trials", type=int, help="COMPLETE trials the study should end with")
    run.add_argument("--max-concurrent", type=int, help="trials running at once")
    run.add_argument(
        "--artifacts",
        type=Path,
        default=Path("runs/artifacts"),
        help="dense checkpoints and Ray's experiment folder (default: runs/artifacts)",
    )
    run.add_argument("--output", type=Path, help="Pareto CSV (default: runs/<study>_pareto.csv)")
    run.add_argument(
        "--ray-address", help="attach to a running Ray cluster (default: $RAY_ADDRESS, else local)"
    )
    run.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a value of the study file, e.g. --set trial.prune_steps=100",
    )

    export = commands.add_parser("export", help="write the Pareto front (or every trial) as CSV")
    export.add_argument("--storage", help="database URL (default: $HEADPRUNE_STORAGE)")
    export.add_argument("--study-name", required=True)
    export.add_argument("--output", type=Path, help="CSV file (default: standard output)")
    export.add_argument("--all", action="store_true", help="every COMPLETE trial, not only the front")
    return parser


def _positive(name: str, value: int | None) -> int | None:
    if value is not None and value < 1:
        raise UserError(f"{name} must be at least 1, got {value}")
    return value


def _run(args: argparse.Namespace) -> int:
    import os

    from orchestrator.config import load_study_config
    from orchestrator.runner import RunOptions, run_study
    from orchestrator.storage import resolve_url

    cfg = load_study_config(args.study_file, args.overrides)
    name = args.study_name or cfg.study.name
    opts = RunOptions(
        storage_url=resolve_url(args.storage, name),
        study_name=name,
        n_trials=_positive("--n-trials", args.n_trials) or cfg.study.n_trials,
        max_concurrent=_positive("--max-concurrent", args.max_concurrent) or cfg.study.max_concurrent,
        artifacts=args.artifacts.resolve(),  # Ray workers run in other folders
        output_csv=args.output or Path("runs") / f"{name}_pareto.csv",
        ray_address=args.ray_address or os.environ.get("RAY_ADDRESS"),
    )
    summary = run_study(cfg, opts)
    print(summary.csv)
    return 0


def _export(args: argparse.Namespace) -> int:
    import os

    from orchestrator.export import study_table, write_csv
    from orchestrator.storage import STORAGE_ENV, load_existing_study, open_store

    url = args.storage or os.environ.get(STORAGE_ENV)
    if not url:
        raise UserError(f"export needs --storage URL (or ${STORAGE_ENV})")
    store = open_store(url)
    frame = study_table(store, load_existing_study(store, args.study_name), everything=args.all)
    if args.output:
        print(write_csv(frame, args.output))
    else:
        frame.to_csv(sys.stdout, index=False)
    return 0


def _quiet_libraries() -> None:
    import warnings

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    _quiet_libraries()
    try:
        return {"run": _run, "export": _export}[args.command](args)
    except UserError as err:
        print(f"launch-study: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("launch-study: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
