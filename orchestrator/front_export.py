"""A study's front (or every trial) as ``launch-study export`` writes it: CSV or JSON to a file
or stdout, and the front drawn, every target checked before the first is written."""

from __future__ import annotations

import sys
from pathlib import Path

import optuna

from orchestrator.errors import UserError
from orchestrator.export import study_table, to_json, write_table
from orchestrator.preflight import check_not_an_input, check_writable_file
from orchestrator.report import check_plot_format, plot_front, plot_paths
from orchestrator.storage import StudyStore, sqlite_database


def export_study(
    store: StudyStore,
    study: optuna.Study,
    *,
    output: Path | None = None,
    fmt: str = "csv",
    plot: Path | None = None,
    everything: bool = False,
) -> None:
    """The front (``everything``: every trial) as CSV or JSON to ``output`` (else stdout), and
    with ``plot`` the front drawn there (``launch-study export``). Every file it will write is
    checked before the first is: none may be the database it reads, nor another of them."""
    database = {"SQLite database": sqlite_database(store.url)}
    targets = [("--output", output)] if output else []
    if plot:
        check_plot_format(plot)
        targets += [("--plot", path) for path in plot_paths(plot)]
    for i, (what, path) in enumerate(targets):
        check_writable_file(what, path)
        check_not_an_input(what, path, database)
        for other, earlier in targets[:i]:
            if path.resolve() == earlier.resolve():
                raise UserError(f"{what} writes {path}, which {other} names too: choose another file")
    frame = study_table(store, study, everything=everything)
    if output:  # the data in the file; what was written, on stderr like every other note
        print(write_table(frame, output, fmt), file=sys.stderr)
    elif fmt == "json":
        print(to_json(frame))
    else:
        frame.to_csv(sys.stdout, index=False)
    if plot:
        for path in plot_front(study, plot):
            print(f"plot: {path}", file=sys.stderr)
