"""Every user mistake: one clear line on stderr, exit code 2, nothing written to the database."""

from __future__ import annotations

import socket
from pathlib import Path

import optuna
import pytest
from helpers import CORPUS, SMOKE, cli_in_process, launch


def study_file(tmp_path: Path, text: str | None = None, **replace: str) -> Path:
    body = SMOKE.read_text() if text is None else text
    body = body.replace('path = "data/tinyshakespeare.txt"', f'path = "{CORPUS}"')
    for old, new in replace.items():
        assert old in body, old
        body = body.replace(old, new)
    path = tmp_path / "study.toml"
    path.write_text(body)
    return path


def assert_user_error(run, *fragments: str) -> None:
    assert run.returncode == 2, run.stderr[-2000:]
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith("launch-study: error: ")
    for fragment in fragments:
        assert fragment in lines[0]
    assert "Traceback" not in run.stderr


def two_objective_study(tmp_path: Path, name: str) -> tuple[Path, str, bytes]:
    """An SQLite file holding an empty study of this project's shape: its path, URL and bytes
    (a refused command must leave them as they are)."""
    db = tmp_path / "study.db"
    url = f"sqlite:///{db}"
    optuna.create_study(study_name=name, storage=url, directions=["minimize", "minimize"])
    return db, url, db.read_bytes()


USERS_MODEL_ABSENT = '[model]\nfamily = "hf"\npath = "someone/absent-model"\n'
CASES = {
    "missing study file": (None, [], ["study file not found", "nope.toml"]),
    "bad flag value": (None, ["--n-trials", "many"], ["--n-trials", "'many'"]),
    "toml syntax": ("[study\nname = 1", [], ["TOML syntax error", "line 1"]),
    "unknown key": (
        {"n_trials = 3": "n_trails = 3"},
        [],
        ["[study]", "'n_trails'", "did you mean 'n_trials'"],
    ),
    "unknown section": ({"[search]": "[serch]"}, [], ["unknown section [serch]", "did you mean 'search'"]),
    "wrong type": ({"n_trials = 3": 'n_trials = "three"'}, [], ["[study] n_trials", "expected int"]),
    "sparsity out of range": (
        {"sparsity = { low = 0.25, high = 0.75 }": "sparsity = { low = 0.25, high = 1.0 }"},
        [],
        ["[search] sparsity high", "[0.0, 1.0)"],
    ),
    "sparsity unreachable": (
        {"sparsity = { low = 0.25, high = 0.75 }": "sparsity = { low = 0.25, high = 0.9 }"},
        [],
        ["sparsity", "min_heads_per_layer"],
    ),
    "negative budget": ({"prune_steps = 30": "prune_steps = -5"}, [], ["[trial] prune_steps", ">= 1"]),
    "zero trials": ({"n_trials = 3": "n_trials = 0"}, [], ["[study] n_trials"]),
    "unknown method": (
        {"[search]\n": '[search]\nmethod = "magic"\n'},
        [],
        ["method", "'magic'", "l0_target"],
    ),
    # refused before [n_head] * n_layer is listed (a MemoryError) or its sizes scanned (hours)
    "too many heads": (
        {"n_layer = 2": "n_layer = 9223372036854775807"},
        [],
        ["[model] n_layer x n_head", "at most 65,536"],
    ),
    "heads do not divide width": ({"d_model = 32": "d_model = 30"}, [], ["d_model 30", "n_head 4"]),
    "missing corpus": ({}, [], ["corpus file not found"]),
    # a file that cannot be read, whoever runs the tests (as root, a chmod would not stop it)
    "unreadable corpus": (
        {f'path = "{CORPUS}"': 'path = "/proc/self/mem"'},
        [],
        ["[corpus] corpus file cannot be read: /proc/self/mem (Input/output error)"],
    ),
    "corpus shorter than a block": ({}, [], ["fewer than one block"]),
    "empty corpus": ({}, [], ["corpus file is empty"]),
    "corpus not utf-8": ({}, [], ["not UTF-8"]),
    "bad override": (None, ["--set", "nodot=3"], ["--set", "section.key"]),
    "bad value of an override": (
        None,
        ["--set", "trial.prune_steps=-1"],
        ["[trial] prune_steps", "(given by --set trial.prune_steps=-1)"],
    ),
    "misspelt key of an override": (
        None,
        ["--set", "trial.prune_step=5"],
        ["[trial]: unknown key 'prune_step'", "(given by --set trial.prune_step=5)"],
    ),
    "misspelt hyperparameter of an override": (
        None,
        ["--set", "search.learning_rate=1e-3"],
        ["unknown hyperparameter 'learning_rate'", "(given by --set search.learning_rate=1e-3)"],
    ),
    "misspelt section of an override": (
        None,
        ["--set", "traial.prune_steps=5"],
        ["unknown section [traial]", "(given by --set traial.prune_steps=5)"],
    ),
    "zero n-trials flag": (None, ["--n-trials", "0"], ["--n-trials must be at least 1"]),
    "unreachable database": (
        None,
        ["--storage", "postgresql+psycopg://nobody@127.0.0.1:1/x"],
        ["cannot connect to database", "127.0.0.1:1"],
    ),
    "malformed database url": (None, ["--storage", "not a url"], ["malformed database URL"]),
    # Found before the corpus is tokenized: a BPE tokenizer would be trained and cached first.
    "malformed database url, bpe corpus": (
        None,
        ["--set", "corpus.tokenizer=bpe", "--storage", "not a url"],
        ["malformed database URL"],
    ),
    # refused before a BPE tokenizer is trained and cached on the whole text
    "no validation text": (
        None,
        ["--set", "corpus.tokenizer=bpe", "--set", "corpus.val_fraction=0.0"],
        ["[corpus] val_fraction", "(given by --set corpus.val_fraction=0.0)"],
    ),
    "corpus path and train_path": (
        None,
        ["--set", "corpus.train_path=other.txt"],
        ["[corpus] path and train_path both given"],
    ),
    "topk temperature zero": (
        None,
        ["--set", 'search.method="topk"', "--set", "search.topk_t0=0.0"],
        ["topk_t0", "0.0 must be > 0.0"],
    ),
    "seed beyond 31 bits": (None, ["--set", "study.seed=4294967296"], ["[study] seed", "2147483647"]),
    "lease beyond a day": (None, ["--set", "study.lease_seconds=1e300"], ["[study] lease_seconds"]),
    "range not a whole number of steps": (
        None,
        ["--set", "search.lr={low=1e-3,high=1e-2,step=0.004}"],
        ["[search] lr", "whole number of steps of 0.004"],
    ),
    "range with a step of nan": (
        None,
        ["--set", "search.lr={low=1e-3,high=1e-2,step=nan}"],
        ["[search] lr", "step must be a positive number"],
    ),
    "range with a step wider than itself": (
        None,
        ["--set", "search.lr={low=1e-3,high=1e-2,step=1e6}"],
        ["[search] lr", "step 1e+06 is wider than the range"],
    ),
    "integer range with a fractional step": (
        None,
        ["--set", "search.min_heads_per_layer={low=1,high=2,step=0.5}"],
        ["[search] min_heads_per_layer", "step of an integer range must be a whole number"],
    ),
    "abbreviated option": (None, ["--stor", "sqlite:///x.db"], ["unrecognized arguments: --stor"]),
    "range with log and step": (
        None,
        ["--set", "search.lr={low=1e-3,high=1e-2,step=1e-3,log=true}"],
        ["[search] lr", "log or step, not both"],
    ),
    # The hf family (trainers/hf/): each key where it belongs, a model that is on this machine.
    "hf without a model": (
        {"[model]\n": '[model]\nfamily = "hf"\n'},
        [],
        ["[model]", "path", "architecture"],
    ),
    "hf path and sizes": (
        None,
        ["--set", "model.family=hf", "--set", "model.path=m"],
        ["[model] n_layer", "has its own sizes"],
    ),
    "hf model not on this machine": (
        {"[model]\nn_layer = 2\nn_head = 4\nd_model = 32\n": USERS_MODEL_ABSENT},
        [],
        ["someone/absent-model", "hf download someone/absent-model"],
    ),
    # Found in review: a pretrained model scored and pruned on a character tokenizer's ids.
    "pretrained model read with another tokenizer": (
        {"[model]\nn_layer = 2\nn_head = 4\nd_model = 32\n": USERS_MODEL_ABSENT, "steps = 60\n": ""},
        [],
        ["[corpus] tokenizer = 'char' with [model] path", "use tokenizer = 'model'"],
    ),
    "kv heads do not divide heads": (
        None,
        ["--set", "model.family=hf", "--set", "model.architecture=llama", "--set", "model.n_kv_head=3"],
        ["n_head 4", "n_kv_head 3"],
    ),
    "grouped-query attention outside llama": (
        None,
        ["--set", "model.family=hf", "--set", "model.architecture=gpt2", "--set", "model.n_kv_head=2"],
        ["n_kv_head", "llama"],
    ),
    "hf layer without heads": (
        None,
        [
            "--set",
            "model.family=hf",
            "--set",
            "model.architecture=gpt2",
            "--set",
            "search.min_heads_per_layer=0",
        ],
        ["min_heads_per_layer", "at least 1 head"],
    ),
    "hf key on a built-in family": (
        None,
        ["--set", "model.architecture=llama"],
        ["architecture", "'hf' only"],
    ),
    "model tokenizer without a model": (
        None,
        ["--set", "corpus.tokenizer=model"],
        ["tokenizer = 'model'", "path"],
    ),
    "unknown tokenizer": (None, ["--set", "corpus.tokenizer=words"], ["[corpus] tokenizer", "'words'"]),
    # [startup]: settings of the start-up sweep, each one the sampler could have chosen.
    "start-up value outside the searched range": (
        None,
        ["--set", "startup.lr=0.1"],
        ["[startup] lr", "0.1", "[search] lr allows"],
    ),
    "start-up sparsity": (None, ["--set", "startup.sparsity=0.5"], ["[startup] sparsity", "spreads it"]),
    "start-up knob of another method": (
        None,
        ["--set", "startup.importance_step=0.2"],
        ["[startup] importance_step", "does not apply to 'l0_target'"],
    ),
    "start-up methods, one twice": (
        None,
        ["--set", 'startup.method=["l0_target", "topk", "l0_target"]'],
        ["[startup] method", "'l0_target' listed twice"],
    ),
    "start-up methods, one without a target": (
        None,
        ["--set", 'startup.method=["l0_target", "l0_penalty"]'],
        ["[startup] method", "'l0_penalty' takes no sparsity target"],
    ),
}


CORPORA = {
    "corpus shorter than a block": b"to be or not to be",
    "empty corpus": b"",
    "corpus not utf-8": b"\xff\xfe" + b"x" * 5000,
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_one_clear_line_and_writes_nothing(case, tmp_path):
    edit, extra, fragments = CASES[case]
    if case == "missing study file":
        path = tmp_path / "nope.toml"
    elif case == "missing corpus":
        path = study_file(tmp_path)
        path.write_text(path.read_text().replace(str(CORPUS), str(tmp_path / "missing.txt")))
    elif case in CORPORA:
        (tmp_path / "corpus.txt").write_bytes(CORPORA[case])
        path = study_file(tmp_path)
        path.write_text(path.read_text().replace(str(CORPUS), str(tmp_path / "corpus.txt")))
    elif isinstance(edit, str):
        path = study_file(tmp_path, text=edit)
    else:
        path = study_file(tmp_path, **(edit or {}))
    run = cli_in_process("run", str(path), *extra, cwd=tmp_path)
    assert_user_error(run, *fragments)
    assert not (tmp_path / "runs").exists()  # no database, no artifacts


def test_existing_study_with_other_objectives_is_refused_untouched(tmp_path):
    url = f"sqlite:///{tmp_path}/other.db"
    other = optuna.create_study(study_name="smoke", storage=url, directions=["maximize"])
    other.add_trial(optuna.trial.create_trial(value=1.0))
    before = (tmp_path / "other.db").read_bytes()
    bpe = ["--set", "corpus.tokenizer=bpe"]  # would train and cache a tokenizer before the database
    run = cli_in_process("run", str(study_file(tmp_path)), "--storage", url, *bpe, cwd=tmp_path)
    assert_user_error(run, "already exists", "other objectives")
    assert (tmp_path / "other.db").read_bytes() == before  # not even our tables, nor WAL mode
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("command", ["status", "export"])
def test_reading_a_study_of_another_tool_is_a_user_error(command, tmp_path):
    url = f"sqlite:///{tmp_path}/other.db"
    other = optuna.create_study(study_name="theirs", storage=url, directions=["maximize"])
    other.add_trial(optuna.trial.create_trial(value=1.0))
    before = (tmp_path / "other.db").read_bytes()
    run = cli_in_process(command, "--storage", url, "--study-name", "theirs", cwd=tmp_path)
    assert_user_error(run, "study 'theirs' is not headprune's", "other objectives (maximize)")
    assert (tmp_path / "other.db").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]  # no CSV


@pytest.mark.slow  # a process of its own (seconds of interpreter start)
def test_export_of_a_missing_study_is_a_user_error(tmp_path):
    url = f"sqlite:///{tmp_path}/empty.db"
    optuna.create_study(study_name="there", storage=url)
    run = launch("export", "--storage", url, "--study-name", "absent", cwd=tmp_path)
    assert_user_error(run, "no study named 'absent'")


@pytest.mark.slow  # a process of its own (seconds of interpreter start)
def test_the_console_script_reports_a_mistake_the_same_way(tmp_path):
    """One case through the installed ``launch-study`` executable, as a user runs it."""
    run = launch("run", str(tmp_path / "nope.toml"), cwd=tmp_path)
    assert_user_error(run, "study file not found")
    assert not (tmp_path / "runs").exists()


# Checked before anything is written (issue 13): each case exits 2 with one line, and the
# database given with --storage (an existing study) is byte-identical afterwards.
PREFLIGHT = {
    "nan in a range": (["--set", "search.sparsity={low=0.1,high=nan}"], ["sparsity high", "not a finite"]),
    "nan learning rate": (["--set", "search.lr=nan"], ["[search] lr", "nan is not a finite"]),
    "nan lease": (["--set", "study.lease_seconds=nan"], ["lease_seconds", "not a finite"]),
    "inf budget value": (["--set", "pretrain.lr=inf"], ["[pretrain] lr", "inf is not a finite"]),
    "artifacts not writable": (["--artifacts", "/proc/x"], ["--artifacts /proc/x cannot be written"]),
    "output not writable": (["--output", "/proc/x/front.csv"], ["--output /proc/x/front.csv"]),
    "output under a file": (["--output", "{db}/front.csv"], ["is a file, not a folder"]),
    "cuda without cuda": (["--set", "trial.device=cuda"], ["device = 'cuda'", "no CUDA GPU"]),
    "gpus without gpus": (["--set", "study.gpus_per_trial=1"], ["gpus_per_trial = 1", "0 GPU"]),
    "unreachable ray": (["--ray-address", "127.0.0.1:1"], ["cannot reach the Ray cluster at 127.0.0.1:1"]),
    "malformed ray address": (["--ray-address", "nowhere"], ["--ray-address 'nowhere'", "host:port"]),
    # PostgreSQL runs on every machine here (docs/howto/develop.md): a port that answers, but not as Ray
    "ray address that is not ray": (["--ray-address", "127.0.0.1:5432"], ["answers there, but not Ray"]),
    "escaping study name": (["--study-name", "../../escape"], ["study name '../../escape'"]),
    "long study name": (["--study-name", "a" * 300], ["study name 'aaaa", "1-100"]),
    "escaping name in the file": (["--set", 'study.name="../x"'], ["[study] name '../x'"]),
    # --output would replace one of the run's own inputs with the CSV
    "output is the database": (["--output", "{db}"], ["--output", "is the SQLite database"]),
    "output is the database's WAL": (["--output", "{db}-wal"], ["is the SQLite database"]),
    "output is the study file": (["--output", "{study}"], ["is the study file"]),
    "output is the corpus": (["--output", "{corpus}"], ["is the corpus file ([corpus] path)"]),
}


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="the GPU cases need a machine without CUDA"
)
@pytest.mark.parametrize("case", list(PREFLIGHT))
def test_preflight_refuses_before_writing(case, tmp_path):
    db, url, before = two_objective_study(tmp_path, "smoke")
    extra, fragments = PREFLIGHT[case]
    corpus = tmp_path / "corpus.txt"  # a copy: a regression here must not overwrite the repository's
    corpus.write_bytes(CORPUS.read_bytes())
    study = study_file(tmp_path, **{str(CORPUS): str(corpus)})
    inputs_before = corpus.read_bytes(), study.read_bytes()
    for name, path in {"{db}": db, "{study}": study, "{corpus}": corpus}.items():
        extra = [a.replace(name, str(path)) for a in extra]
    run = cli_in_process("run", str(study), "--storage", url, *extra, cwd=tmp_path)
    assert_user_error(run, *fragments)
    assert db.read_bytes() == before
    assert (corpus.read_bytes(), study.read_bytes()) == inputs_before
    assert not (tmp_path / "runs").exists()
    assert not list(tmp_path.glob(".headprune-probe-*"))


@pytest.mark.parametrize(
    "url, fragment",
    [
        ("sqlite:////proc/x/study.db", "SQLite database /proc/x/study.db cannot be written"),
        # an option the driver cannot take: refused before runs/ (the file's folder) is made
        ("sqlite:///runs/study.db?timeout=abc", "bad option (could not convert string to float: 'abc')"),
        ("postgresql+psycopg://u@127.0.0.1:abc/db", "malformed database URL (its port is not a number)"),
        ("postgresql+psycopg://u:se@cret@127.0.0.1:1/db", "an '@' in the user name or password must be"),
        ("postgresql+psycopg://u:se@cr/et@127.0.0.1:1/db", "an '@' in the user name or password must be"),
    ],
)
def test_a_database_that_cannot_be_made_is_refused(url, fragment, tmp_path):
    run = cli_in_process("run", str(study_file(tmp_path)), "--storage", url, cwd=tmp_path)
    assert_user_error(run, fragment)
    assert not (tmp_path / "runs").exists()
    assert "cret" not in run.stderr and "et@" not in run.stderr  # the '@' cases: no part of the password


def test_the_resume_command_after_an_interrupt_hides_the_password():
    from orchestrator.storage import redact_command

    argv = [
        "launch-study",
        "run",
        "s.toml",
        "--storage",
        "postgresql://u:hunter2@db:5432/x",
        "--n-trials",
        "3",
    ]
    shown = redact_command(argv)
    assert "hunter2" not in shown and "'postgresql://u:***@db:5432/x' --n-trials 3" in shown
    assert "password" in shown  # says how to give it back
    assert "hunter2" not in redact_command(
        ["launch-study", "run", "--storage=sqlite:///a.db?password=hunter2"]
    )
    plain = ["launch-study", "run", "s.toml", "--storage", "sqlite:///runs/a.db"]
    assert redact_command(plain) == "launch-study run s.toml --storage sqlite:///runs/a.db"


def test_reading_a_file_that_is_not_a_database_is_one_line(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_bytes(CORPUS.read_bytes()[:5000])
    run = cli_in_process("status", "--storage", f"sqlite:///{text}", "--study-name", "x", cwd=tmp_path)
    assert_user_error(run, "cannot connect to database", "not a database")
    assert text.read_bytes() == CORPUS.read_bytes()[:5000]


def test_tables_optuna_did_not_make_are_one_line(tmp_path):
    import sqlite3

    with sqlite3.connect(tmp_path / "other.db") as db:
        db.execute("CREATE TABLE studies (x INTEGER)")
    url = f"sqlite:///{tmp_path}/other.db"
    run = cli_in_process("status", "--storage", url, "--study-name", "x", cwd=tmp_path)
    assert_user_error(run, f"database {url}: ")


# export checks every file it will write before it writes the first
EXPORT = {
    "output is its own database": (["--output", "{db}"], ["--output", "is the SQLite database"]),
    "output not writable": (["--output", "/proc/x.csv"], ["--output /proc/x.csv cannot be written"]),
    "output under a file": (["--output", "{db}/x.csv"], ["is a file, not a folder"]),
    "plot not writable": (["--output", "{tmp}/f.csv", "--plot", "/proc/f.png"], ["--plot /proc/f.png"]),
    "plot over the output": (
        ["--output", "{tmp}/f.png", "--plot", "{tmp}/f.png"],
        ["--plot writes", "which --output names too"],
    ),
    "format against the suffix": (
        ["--output", "{tmp}/f.json", "--format", "csv"],
        ["--format csv with --output", "f.json", "name a .csv file"],
    ),
    "plot not an image format": (
        ["--output", "{tmp}/f.csv", "--plot", "{tmp}/f.txt"],
        ["--plot", "image format"],
    ),
}


@pytest.mark.parametrize("case", list(EXPORT))
def test_export_refuses_a_file_it_cannot_or_must_not_write(case, tmp_path):
    db, url, before = two_objective_study(tmp_path, "s")
    extra, fragments = EXPORT[case]
    extra = [a.replace("{db}", str(db)).replace("{tmp}", str(tmp_path)) for a in extra]
    run = cli_in_process("export", "--storage", url, "--study-name", "s", *extra, cwd=tmp_path)
    assert_user_error(run, *fragments)
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study.db"]  # no CSV written before the error


@pytest.mark.parametrize("key", ["password", "PWD", "sslpassword"])
def test_a_password_in_the_query_never_shows(key, tmp_path):
    url = f"postgresql+psycopg://nobody@127.0.0.1:1/x?{key}=s3cr3tPW&sslmode=disable"
    run = cli_in_process("run", str(study_file(tmp_path)), "--storage", url, cwd=tmp_path)
    assert_user_error(run, "cannot connect to database", f"{key}=***", "sslmode=disable")
    assert "s3cr3tPW" not in run.stderr + run.stdout


def test_scrub_removes_secrets_a_driver_repeats():
    from orchestrator.storage import redact, scrub

    url = "mysql+pymysql://root:hunter2@db:3306/x?passwd=also"
    assert scrub("login hunter2 and also failed", url) == "login *** and *** failed"
    assert "hunter2" not in redact(url) and "also" not in redact(url)


@pytest.mark.parametrize("command", ["status", "export"])
def test_reading_a_missing_sqlite_file_creates_nothing(command, tmp_path, monkeypatch):
    monkeypatch.delenv("HEADPRUNE_STORAGE", raising=False)
    run = cli_in_process(
        command, "--storage", f"sqlite:///{tmp_path}/a/b.db", "--study-name", "x", cwd=tmp_path
    )
    assert_user_error(run, f"no database at {tmp_path}/a/b.db")
    assert not (tmp_path / "a").exists()
    # without --storage: run's default, runs/<study>.db
    run = cli_in_process(command, "--study-name", "smoke", cwd=tmp_path)
    assert_user_error(run, "no database at runs/smoke.db")
    assert not (tmp_path / "runs").exists()


def test_version_and_examples(tmp_path):
    from importlib.metadata import version

    run = cli_in_process("--version", cwd=tmp_path)
    assert run.returncode == 0 and run.stdout.strip() == f"headprune {version('headprune')}"
    for command in ("run", "export", "status", "export-model", "dashboard"):
        help_text = cli_in_process(command, "--help", cwd=tmp_path).stdout
        assert f"example:\n  launch-study {command}" in help_text


def test_export_model_of_an_unfinished_trial_is_a_user_error(tmp_path):
    url = f"sqlite:///{tmp_path}/copy.db"
    study = optuna.create_study(study_name="s", storage=url, directions=["minimize", "minimize"])
    study.ask()
    out = tmp_path / "m"
    run = cli_in_process(
        "export-model",
        "--storage",
        url,
        "--study-name",
        "s",
        "--trial",
        "0",
        "--output",
        str(out),
        cwd=tmp_path,
    )
    assert_user_error(run, "trial 0 of 's' is RUNNING, not COMPLETE")
    assert not out.exists()


def test_export_into_a_closed_pipe_ends_quietly(tmp_path, monkeypatch):
    """`launch-study export | head -1`: the reader goes away, the export ends with exit 0 and
    no traceback."""
    import io
    import sys

    from orchestrator.cli import main

    url = f"sqlite:///{tmp_path}/s.db"
    study = optuna.create_study(study_name="s", storage=url, directions=["minimize", "minimize"])
    attrs = {"n_params_nonembed": 50, "sparsity": 0.5, "heads_per_layer": [1], "method": "random"}
    study.add_trial(optuna.trial.create_trial(values=[5.0, 100], user_attrs={**attrs, "hparams": {}}))

    class ClosedPipe(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    monkeypatch.setattr(sys, "stderr", stderr)
    assert main(["export", "--storage", url, "--study-name", "s", "--all"]) == 0
    assert stderr.getvalue() == ""


def users_gpt2(folder: Path, *, weights: bool = True, n_layer: int = 2) -> Path:
    """A tiny GPT-2 saved with save_pretrained, as a user's model folder (no tokenizer)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=80, n_positions=64, n_embd=16, n_layer=n_layer, n_head=4)
    if weights:
        GPT2LMHeadModel(config).save_pretrained(folder)
    else:
        config.save_pretrained(folder)
    return folder


HF_USER = ["--set", "model.family=hf", "--set", "model.block_size=32"]


def hf_study(tmp_path: Path) -> Path:
    """The smoke study with its sizes removed, for a model at --set model.path."""
    text = SMOKE.read_text().replace("n_layer = 2\nn_head = 4\nd_model = 32\n", "")
    return study_file(tmp_path, text=text)


@pytest.mark.parametrize(
    "damage, fragments",
    [
        ("no weights", ["[model] path", "no weight files"]),
        ("truncated weights", ["[model] path", "model.safetensors is not a readable safetensors file"]),
        ("no tokenizer", ["[corpus]", "holds no tokenizer", "tokenizer.save_pretrained"]),
    ],
)
def test_a_users_model_folder_that_cannot_serve_is_refused_before_anything_is_written(
    tmp_path, damage, fragments
):
    folder = users_gpt2(tmp_path / "m", weights=damage != "no weights")
    if damage == "truncated weights":
        data = (folder / "model.safetensors").read_bytes()
        (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    extra = ["--set", "corpus.tokenizer=model"] if damage == "no tokenizer" else []
    run = cli_in_process(
        "run", str(hf_study(tmp_path)), *HF_USER, "--set", f"model.path={folder}", *extra, cwd=tmp_path
    )
    assert_user_error(run, *fragments)
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow  # a process of its own (seconds of interpreter start)
def test_weights_of_another_model_are_refused_not_replaced_by_random_ones(tmp_path):
    """Found in review: transformers initialises at random what a folder's weights lack and only
    warns; the study would have pruned a random model and exited 0. This is found when the dense
    model is loaded, after the database is opened: exit 2, the error the last line, no trial run."""
    folder = users_gpt2(tmp_path / "m", n_layer=1)
    users_gpt2(tmp_path / "config_of_two_layers", weights=False, n_layer=2)
    (folder / "config.json").write_text((tmp_path / "config_of_two_layers" / "config.json").read_text())
    args = ("run", str(hf_study(tmp_path)), *HF_USER, "--set", f"model.path={folder}")
    run = launch(*args, cwd=tmp_path)  # a process of its own: transformers' logging as a user's
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-2000:]
    lines = run.stderr.strip().splitlines()
    assert lines[-1].startswith("launch-study: error: ") and "do not fit its config.json" in lines[-1]
    assert len(lines) == 2, run.stderr  # the study's first line, then the error: no load report
    assert not list((tmp_path / "runs" / "artifacts").glob("dense/*"))


@pytest.mark.slow  # a process of its own (seconds of interpreter start)
def test_a_dashboard_port_already_taken_or_out_of_range_is_one_line(tmp_path):
    url = f"sqlite:///{tmp_path}/s.db"
    optuna.create_study(study_name="s", storage=url, directions=["minimize", "minimize"])

    def dashboard(port: int):  # a process: were it to serve, the timeout ends it
        return launch("dashboard", "--storage", url, "--port", str(port), cwd=tmp_path, timeout=60)

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert_user_error(dashboard(port), f"--host 127.0.0.1 --port {port}: cannot listen there")
    assert_user_error(dashboard(70000), "--port 70000: cannot listen there")
