"""``launch-study``: run a study from a TOML file (or resume it), look at it, export it."""

from __future__ import annotations

import argparse
import contextlib
import math
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
    from orchestrator.storage import load_existing_study, open_store, resolve_url

    store = open_store(resolve_url(args.storage, args.study_name), create=False)
    return store, load_existing_study(store, args.study_name)


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


def _study_and_options(args: argparse.Namespace, n_trials: int | None = None):
    """The study file with its --set values, and the options of a command that runs trials."""
    from orchestrator.config import load_study_config
    from orchestrator.runner import RunOptions

    cfg = load_study_config(args.study_file, args.overrides)
    return cfg, RunOptions.for_study(
        cfg,
        storage=args.storage,
        study_name=args.study_name,
        n_trials=n_trials,
        max_concurrent=_positive("--max-concurrent", getattr(args, "max_concurrent", None)),
        artifacts=args.artifacts,
        output=args.output,
        ray_address=getattr(args, "ray_address", None),
    )


def _run(args: argparse.Namespace) -> int:
    from orchestrator.runner import run_study

    cfg, opts = _study_and_options(args, n_trials=_positive("--n-trials", args.n_trials))
    summary = run_study(cfg, opts)
    print(summary.csv)
    return 0


def _replicate(args: argparse.Namespace) -> int:
    from orchestrator.replicates import replicate_front

    cfg, opts = _study_and_options(args)
    summary = replicate_front(cfg, opts, args.seeds)
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
    from orchestrator.references import matched_references

    cfg, opts = _study_and_options(args)
    summary = matched_references(cfg, opts, args.eval_every)
    for line in summary.skipped:
        print(f"launch-study: no reference for {line}", file=sys.stderr)
    print(summary.csv)
    return 0


def _export(args: argparse.Namespace) -> int:
    from orchestrator.export import study_table, to_json, write_table
    from orchestrator.preflight import check_not_an_input, check_writable_file
    from orchestrator.report import check_plot_format, plot_front, plot_paths
    from orchestrator.storage import sqlite_database

    suffix = args.output.suffix.lower().lstrip(".") if args.output else ""
    if args.format and suffix in ("csv", "json") and suffix != args.format:
        raise UserError(
            f"--format {args.format} with --output {args.output}: name a .{args.format} file, "
            "or drop --format"
        )
    fmt = args.format or ("json" if suffix == "json" else "csv")
    store, study = _open_study(args)  # reads only
    # Every file it will write, checked before the first is: none may be the database it reads.
    database = {"SQLite database": sqlite_database(store.url)}
    targets = [("--output", args.output)] if args.output else []
    if args.plot:
        check_plot_format(args.plot)
        targets += [("--plot", path) for path in plot_paths(args.plot)]
    for i, (what, path) in enumerate(targets):
        check_writable_file(what, path)
        check_not_an_input(what, path, database)
        for other, earlier in targets[:i]:
            if path.resolve() == earlier.resolve():
                raise UserError(f"{what} writes {path}, which {other} names too: choose another file")
    frame = study_table(store, study, everything=args.all)
    if args.output:  # the data in the file; what was written, on stderr like every other note
        print(write_table(frame, args.output, fmt), file=sys.stderr)
    elif fmt == "json":
        print(to_json(frame))
    else:
        frame.to_csv(sys.stdout, index=False)
    if args.plot:
        for path in plot_front(study, args.plot):
            print(f"plot: {path}", file=sys.stderr)
    return 0


def _status(args: argparse.Namespace) -> int:
    from orchestrator.export import replicated
    from orchestrator.report import format_status, study_status

    store, study = _open_study(args)
    print(format_status(study_status(study, replicated(store, study))))
    return 0


def _export_model(args: argparse.Namespace) -> int:
    import shutil

    from optuna.trial import TrialState

    from orchestrator.artifacts import fetch, is_remote
    from orchestrator.preflight import check_not_an_input, check_writable_folder
    from orchestrator.storage import sqlite_database
    from trainers.export import CorruptModel, UnverifiedModel, load_model, read_config
    from trainers.families import family

    store, study = _open_study(args)
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    trial = trials.get(args.trial)
    if trial is None:
        raise UserError(f"study {args.study_name!r} has no trial {args.trial}")
    if trial.state != TrialState.COMPLETE:
        raise UserError(f"trial {args.trial} of {args.study_name!r} is {trial.state.name}, not COMPLETE")
    recorded = trial.user_attrs.get("model_dir")
    if recorded and is_remote(recorded):  # downloaded into this machine's cache, checked there
        try:
            source = fetch(recorded, trial.user_attrs.get("model_sha256"))
        except CorruptModel as err:
            raise UserError(f"trial {args.trial}'s model cannot be exported: {err}") from None
        except OSError as err:
            raise UserError(f"trial {args.trial}'s model: {recorded}: {err}") from None
    else:
        source = Path(recorded).resolve() if recorded else None
    if source is None or not source.is_dir():
        raise UserError(f"trial {args.trial}'s model is not on this machine (looked in {recorded or '-'})")
    try:
        try:
            model, tokenizer = load_model(source)  # checksums, then the weights themselves
        except UnverifiedModel:  # a trial of an earlier version: exported, with a word about it
            print(
                f"launch-study: warning: trial {args.trial}'s model has no checksums to verify",
                file=sys.stderr,
            )
            model, tokenizer = load_model(source, verify=False)  # its weights may still be broken
    except CorruptModel as err:
        raise UserError(f"trial {args.trial}'s model cannot be exported: {err}") from None
    # A study made before model folders took a suffix of their own (storage.models_folder) shares
    # its folder with any study of its name run with the same --artifacts: check it is this trial's.
    saved = read_config(source, verify=False).get("val_perplexity")
    if saved is not None and not math.isclose(saved, trial.values[0], rel_tol=1e-9):
        raise UserError(
            f"trial {args.trial}'s folder {source} holds another model (perplexity {saved:.4f}, the "
            f"trial's {trial.values[0]:.4f}): a study of this name elsewhere wrote it since"
        )
    output = args.output.resolve()
    database = sqlite_database(store.url)
    check_not_an_input("--output", output, {"study's database": database, "trial's own folder": source})
    # the export is staged beside the folder, then renamed into place: its parent must be writable
    check_writable_folder("--output", output.parent, shown=args.output)
    # Copied beside the target, then swapped in: an export cut short leaves the old folder whole.
    staging, backup = output.with_name(f".{output.name}.partial"), output.with_name(f".{output.name}.old")
    if backup.is_dir() and not output.exists():  # a swap killed between its two renames
        backup.rename(output)  # the old export comes back, and is judged as any other below
    if output.exists() and not output.is_dir():
        raise UserError(f"--output {args.output} is a file; export-model writes a folder")
    if output.is_dir() and any(output.iterdir()) and not args.force:
        raise UserError(f"--output {args.output} is not empty; --force replaces it whole")
    for leftover in (staging, backup):
        shutil.rmtree(leftover, ignore_errors=True)
    family(model.cfg.family).export(model, tokenizer, source, staging)  # its own format, or as saved
    if output.exists():
        output.rename(backup)
    staging.rename(output)
    shutil.rmtree(backup, ignore_errors=True)
    output = args.output
    print(output)
    return 0


def _dashboard(args: argparse.Namespace) -> int:
    """optuna-dashboard's public WSGI app on wsgiref's server, as optuna-dashboard's own command
    serves it: a thread per request. The main thread then only waits for connections, so SIGTERM
    (raised there as ``Interrupted``) or Ctrl-C always ends ``serve_forever``. With bottle's
    one-thread server (``run_server``, until December 2026) a signal that came during a request
    was swallowed by wsgiref's handler (it catches everything and answers 500) and the dashboard
    ran on; and a client that connected and sent nothing held the only thread."""
    import errno
    import socket
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    from optuna_dashboard import wsgi

    from orchestrator.artifacts import TrialArtifacts, check_root, parse_root
    from orchestrator.storage import open_store

    class Server(ThreadingMixIn, WSGIServer):
        address_family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
        daemon_threads = True  # a request in hand does not keep the process alive
        block_on_close = False

        def handle_error(self, request, client_address) -> None:
            # A connection that dropped, or that the stopping server closed under a thread still
            # reading it (EBADF, seen in CI after SIGTERM), is not worth a traceback.
            error = sys.exc_info()[1]
            if not (isinstance(error, ConnectionError) or getattr(error, "errno", None) == errno.EBADF):
                super().handle_error(request, client_address)

    class QuietHandler(WSGIRequestHandler):
        """No line per request: the page polls every few seconds (errors are still printed)."""

        def log_request(self, code="-", size="-") -> None:
            pass

    root = parse_root(args.artifacts)
    check_root(root, write=False)  # a store that does not answer: one line, before serving
    store = open_store(_storage_url(args), create=False)
    app = wsgi(store.storage, artifact_store=TrialArtifacts(root))
    try:
        server = make_server(args.host, args.port, app, Server, QuietHandler)
    except (OSError, OverflowError) as err:  # the port taken or out of range, an address not ours
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise UserError(f"--host {args.host} --port {args.port}: cannot listen there ({reason})") from None
    with server:
        print(f"optuna-dashboard on {store.safe_url}: http://{args.host}:{args.port}/", file=sys.stderr)
        server.serve_forever()
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
