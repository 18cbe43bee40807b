"""``launch-study``: run a study from a TOML file (or resume it), look at it, export it."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from pathlib import Path

from orchestrator.errors import LeaseLost, UserError
from orchestrator.interrupts import Interrupted, raise_on_sigterm
from trainers.plugins import PluginError


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line like every other user error, and no option is
    taken by an abbreviation of its name (``--stor URL`` would slip past the redaction of the
    printed resume command, ``storage.redact_command``)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **{**kwargs, "allow_abbrev": False})

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"launch-study: error: {message} (see --help)\n")


EXAMPLES = {
    "run": "launch-study run studies/tinyshakespeare.toml --n-trials 30 --set trial.prune_steps=150",
    "replicate": "launch-study replicate studies/tinyshakespeare.toml --seeds 2",
    "reference": "launch-study reference studies/tinyshakespeare.toml",
    "export": "launch-study export --study-name tinyshakespeare --format json > front.json",
    "status": "launch-study status --study-name tinyshakespeare",
    "export-model": "launch-study export-model --study-name tinyshakespeare --trial 12 --output model12",
    "dashboard": "launch-study dashboard --storage sqlite:///runs/tinyshakespeare.db",
}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("headprune")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="launch-study", description=__doc__)
    parser.add_argument("--version", action="version", version=f"headprune {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return commands.add_parser(
            name,
            help=help,
            description=help,
            epilog=f"example:\n  {EXAMPLES[name]}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )

    run = command("run", "run (or resume) a study from a TOML file")
    run.add_argument("study_file", type=Path, help="the study file, e.g. studies/tinyshakespeare.toml")
    run.add_argument(
        "--n-trials", type=int, help="finished trials (COMPLETE or stopped early) the study should end with"
    )
    _trial_run_arguments(run)

    replicate = command(
        "replicate",
        "train each point of a study's front again with other seeds; the Pareto CSV then gives "
        "each point's mean and range over its seeds",
    )
    _ran_with_argument(replicate)
    replicate.add_argument(
        "--seeds",
        type=int,
        default=2,
        help="seeds besides the study's own (default: 2); a rerun adds what is missing",
    )
    _trial_run_arguments(replicate)

    reference = command(
        "reference",
        "give each point of a study's front a matched dense reference: the dense model trained "
        "along the point's warm-start lineage (same learning rates and steps), at its best "
        "validation checkpoint within them; the Pareto CSV and status then show both ratios",
    )
    _ran_with_argument(reference)
    reference.add_argument(
        "--eval-every",
        type=int,
        default=50,
        help="steps between the replay's validation checkpoints (default: 50)",
    )
    _storage_argument(reference)
    _study_file_arguments(reference)

    export = command("export", "write the Pareto front (or every trial) as CSV or JSON")
    _study_arguments(export)
    export.add_argument("--output", type=Path, help="file to write (default: standard output)")
    export.add_argument(
        "--format",
        choices=("csv", "json"),
        help="default: from --output's suffix (.json), else csv; a .csv or .json --output must match",
    )
    export.add_argument("--all", action="store_true", help="every COMPLETE trial, not only the front")
    export.add_argument(
        "--plot",
        type=Path,
        metavar="FILE.png",
        help="also plot the front (and a head map, FILE_heads.png); their paths go to stderr",
    )

    status = command("status", "trials by state, the front, hypervolume, time left")
    _study_arguments(status)

    model = command("export-model", "write one trial's pruned model (safetensors + JSON)")
    _study_arguments(model)
    model.add_argument("--trial", type=int, required=True, help="the trial number")
    model.add_argument("--output", type=Path, required=True, help="folder to write (new or empty)")
    model.add_argument("--force", action="store_true", help="replace --output whole if it holds files")

    dashboard = command("dashboard", "serve optuna-dashboard on the study's database")
    dashboard.add_argument("--storage", help="database URL (default: $HEADPRUNE_STORAGE)")
    dashboard.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1 only)")
    dashboard.add_argument("--port", type=int, default=8080, help="port (default: 8080)")
    dashboard.add_argument(
        "--artifacts",
        default="runs/artifacts",
        help="the studies' --artifacts (a folder or s3://bucket/prefix): their trials' models can "
        "be downloaded on the dashboard (default: runs/artifacts)",
    )
    return parser


def _ran_with_argument(parser: argparse.ArgumentParser) -> None:
    """The study file of a command that works on a study already run (replicate, reference)."""
    parser.add_argument("study_file", type=Path, help="the study file (and --set values) the study ran with")


def _trial_run_arguments(parser: argparse.ArgumentParser) -> None:
    """What a command that runs trials on Ray Tune takes besides its study file (run, replicate)."""
    _storage_argument(parser)
    parser.add_argument("--max-concurrent", type=int, help="trials running at once")
    parser.add_argument(
        "--ray-address", help="attach to a running Ray cluster (default: $RAY_ADDRESS, else local)"
    )
    _study_file_arguments(parser)


def _study_file_arguments(parser: argparse.ArgumentParser) -> None:
    """What every command that reads a study file takes besides it (run, replicate, reference):
    the study's name, where its models and CSV go, and --set."""
    parser.add_argument("--study-name", help="default: [study] name")
    parser.add_argument(
        "--artifacts",
        help="where models go: a folder, or s3://bucket/prefix or gs://bucket/prefix on a cluster "
        "(default: [study] artifacts, else runs/artifacts)",
    )
    parser.add_argument("--output", type=Path, help="Pareto CSV (default: runs/<study>_pareto.csv)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a value of the study file, e.g. --set trial.prune_steps=100",
    )


def _storage_argument(parser: argparse.ArgumentParser) -> None:
    """--storage, worded the same for every command that takes it."""
    parser.add_argument(
        "--storage", help="database URL (default: $HEADPRUNE_STORAGE, else sqlite:///runs/<study>.db)"
    )


def _study_arguments(parser: argparse.ArgumentParser) -> None:
    """What a command that reads a stored study takes (status, export, export-model)."""
    _storage_argument(parser)
    parser.add_argument("--study-name", required=True, help="the study's name ([study] name of its file)")


def _open_study(args: argparse.Namespace):
    """The study to read (status, export): its database must exist, nothing is created."""
    from orchestrator import open_study

    return open_study(args.study_name, args.storage)


def _storage_url(args: argparse.Namespace) -> str:
    import os

    from orchestrator.storage import STORAGE_ENV

    url = args.storage or os.environ.get(STORAGE_ENV)
    if not url:
        raise UserError(f"{args.command} needs --storage URL (or ${STORAGE_ENV})")
    return url


def _positive(name: str, value: int | None) -> int | None:
    if value is not None and value < 1:
        raise UserError(f"{name} must be at least 1, got {value}")
    return value


def _options(args: argparse.Namespace) -> dict:
    """The options of a command that trains for a study (``RunOptions.for_study``'s keywords)."""
    return {
        "overrides": args.overrides,
        "storage": args.storage,
        "study_name": args.study_name,
        "max_concurrent": _positive("--max-concurrent", getattr(args, "max_concurrent", None)),
        "artifacts": args.artifacts,
        "output": args.output,
        "ray_address": getattr(args, "ray_address", None),
    }


def _run(args: argparse.Namespace) -> int:
    from orchestrator import run_study

    summary = run_study(args.study_file, n_trials=_positive("--n-trials", args.n_trials), **_options(args))
    print(summary.csv)
    return 0


def _replicate(args: argparse.Namespace) -> int:
    from orchestrator import replicate_study

    summary = replicate_study(args.study_file, args.seeds, **_options(args))
    print(summary.csv)
    if summary.failed:  # not the user's mistake: what was recorded is in the CSV, a rerun retries
        print(
            f"launch-study: error: {len(summary.failed)} replicate(s) failed (a rerun tries them again); "
            f"the first: {summary.failed[0]}",
            file=sys.stderr,
        )
        return 1
    return 0


def _reference(args: argparse.Namespace) -> int:
    from orchestrator import reference_study

    summary = reference_study(args.study_file, args.eval_every, **_options(args))
    for line in summary.skipped:
        print(f"launch-study: no reference for {line}", file=sys.stderr)
    print(summary.csv)
    return 0


def _export(args: argparse.Namespace) -> int:
    from orchestrator import export_study

    suffix = args.output.suffix.lower().lstrip(".") if args.output else ""
    if args.format and suffix in ("csv", "json") and suffix != args.format:
        raise UserError(
            f"--format {args.format} with --output {args.output}: name a .{args.format} file, "
            "or drop --format"
        )
    store, study = _open_study(args)  # reads only
    fmt = args.format or ("json" if suffix == "json" else "csv")
    export_study(store, study, output=args.output, fmt=fmt, plot=args.plot, everything=args.all)
    return 0


def _status(args: argparse.Namespace) -> int:
    from orchestrator import study_status

    print(study_status(*_open_study(args)))
    return 0


def _export_model(args: argparse.Namespace) -> int:
    from orchestrator import export_trial_model

    store, study = _open_study(args)
    export_trial_model(store, study, args.trial, args.output, force=args.force)
    print(args.output)
    return 0


def _dashboard(args: argparse.Namespace) -> int:
    from orchestrator.dashboard import serve_dashboard

    serve_dashboard(_storage_url(args), args.artifacts, args.host, args.port)
    return 0


def _quiet_libraries() -> None:
    import os
    import warnings

    import optuna

    # transformers (the hf family): no weight-loading progress bars or load reports; our own
    # lines say what happens. Set before it is imported, and inherited by Ray's workers.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def _interrupt_behind(err: BaseException) -> Interrupted | None:
    """The ``Interrupted`` (or Ctrl-C) an exception was raised over, if any: a signal handler that
    raises while Ray's C extension waits comes back as a ``SystemError`` around it."""
    seen = err.__cause__ or err.__context__
    while seen is not None:
        if isinstance(seen, Interrupted):
            return seen
        if isinstance(seen, KeyboardInterrupt):
            return Interrupted(signal.SIGINT)
        seen = seen.__cause__ or seen.__context__
    return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _quiet_libraries()
    restore_sigterm = raise_on_sigterm()
    try:
        commands = {
            "run": _run,
            "replicate": _replicate,
            "reference": _reference,
            "export": _export,
            "status": _status,
            "export-model": _export_model,
            "dashboard": _dashboard,
        }
        return commands[args.command](args)
    except (UserError, PluginError) as err:
        print(f"launch-study: error: {err}", file=sys.stderr)
        return 2
    except LeaseLost as err:  # not the user's mistake: another driver holds the study now
        print(f"launch-study: error: {err}", file=sys.stderr)
        return 1
    except Interrupted as stop:
        print(f"launch-study: {stop}", file=sys.stderr)
        return stop.exit_code
    except SystemError as err:  # a second Ctrl-C inside Ray's C code comes back wrapped in this
        stop = _interrupt_behind(err)
        if stop is None:
            raise
        print(f"launch-study: {stop}", file=sys.stderr)
        return stop.exit_code
    except KeyboardInterrupt:
        print("launch-study: interrupted (SIGINT)", file=sys.stderr)
        return 130
    except BrokenPipeError:
        if args.command not in ("export", "status"):
            raise
        # The reader of the data went away (`export | head -1`): not an error of ours. Python
        # would complain again when flushing stdout at exit, so point it at /dev/null first.
        import os

        with contextlib.suppress(OSError, ValueError):  # a stream without a descriptor: nothing to do
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        return 0
    finally:
        restore_sigterm()


if __name__ == "__main__":
    sys.exit(main())
