"""Running the real CLI, and reading a study back, for the end-to-end tests."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import optuna

from orchestrator.frontier import pareto_front

REPO = Path(__file__).resolve().parent.parent
# The test servers every machine of ours runs (CI's too): trust auth, a database named test.
SERVERS = {
    "postgresql": ("postgresql+psycopg://postgres@127.0.0.1:5432/test", 5432),
    "mysql": ("mysql+pymysql://root@127.0.0.1:3306/test", 3306),
}
SMOKE = REPO / "studies" / "smoke.toml"
CORPUS = REPO / "studies" / "data" / "tinyshakespeare.txt"  # the shipped corpus
LAUNCH_STUDY = Path(sys.executable).parent / "launch-study"


def default_study_driver(tmp_path: Path, **options):
    """A ``StudyDriver`` on the default study's search space and a seeded TPE sampler, asked and
    told directly (no Tune): ``options`` are its plan's settings (``execution.DriverPlan``) and
    ``still_leased``."""
    from orchestrator.config import load_study_config
    from orchestrator.execution import DriverHooks, DriverPlan, StudyDriver
    from orchestrator.runner import make_sampler
    from orchestrator.storage.driver import DriverStorage
    from orchestrator.study_trials import StudyTrials

    cfg = load_study_config(REPO / "studies" / "tinyshakespeare.toml")
    space = cfg.search.for_model(options.pop("layer_heads", (8, 8, 8, 8)))  # as the runner's
    storage = DriverStorage(optuna.storages.InMemoryStorage())
    study = optuna.create_study(
        storage=storage,
        directions=["minimize", "minimize"],
        sampler=make_sampler("tpe", seed=0, startup=options.pop("startup")),
    )
    hooks = DriverHooks(on_finished=lambda trial, pushed_off: None)
    if "still_leased" in options:
        hooks.still_leased = options.pop("still_leased")
    plan = DriverPlan(n_trials=options.pop("n_trials", 12), max_failed=0, models_dir=str(tmp_path), **options)
    return StudyDriver(study, space, StudyTrials(storage, study.study_name), plan, hooks)


def tiny_trial_setup(tmp_path, text, prune_steps: int, finetune_steps: int, n_head: int = 2):
    """A 2-layer model of ``n_head`` heads a layer pretrained for 4 steps on ``text``, and trials
    of these budgets."""
    from trainers.data import Corpus
    from trainers.hparams import PretrainConfig, TrialBudget
    from trainers.model import ModelConfig
    from trainers.pretrain import ensure_dense_checkpoint
    from trainers.trial import TrialSetup

    corpus = Corpus.load(text, block_size=16)
    model = ModelConfig(vocab_size=corpus.vocab_size, block_size=16, n_layer=2, n_head=n_head, d_model=16)
    dense = ensure_dense_checkpoint(
        corpus, model, PretrainConfig(steps=4, batch_size=4), tmp_path, eval_tokens=512
    )
    budget = TrialBudget(
        prune_steps=prune_steps, finetune_steps=finetune_steps, batch_size=4, eval_tokens=512
    )
    return TrialSetup(corpus, dense, budget)


def free_port() -> int:
    """A TCP port nothing listens on now (the OS picks it)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_url(kind: str) -> str:
    """The test server's URL. Where it does not answer the test is skipped with one line, except
    under CI (``CI`` set), where every storage test must run."""
    import socket

    import pytest

    url, port = SERVERS[kind]
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError:
        message = f"{kind} does not answer on 127.0.0.1:{port}"
        if os.environ.get("CI"):
            pytest.fail(f"{message} (CI is set: the storage tests must run)")
        pytest.skip(f"{message} (set CI=1 to make this a failure)")
    return url


def drop_study(url: str, name: str) -> None:
    """Remove a test's study from a shared server: Optuna's rows, the frontier, the lease, the
    replicates."""
    import sqlalchemy as sa

    from orchestrator.storage import ParetoPoint, Replicate, StudyLease, open_store

    store = open_store(url)
    with store.engine.begin() as conn:
        for table in (ParetoPoint, StudyLease, Replicate):
            conn.execute(sa.delete(table.__table__).where(table.study_name == name))
    with contextlib.suppress(KeyError):  # the test failed before creating it
        optuna.delete_study(study_name=name, storage=store.storage)


# Sessions (their leaders' pids) of the processes the running test started that may start Ray
# (tests/conftest.py empties it before each test). Ray's processes (GCS, raylet, agents, workers)
# stay in the session of the process that started them, so a test finds its own Ray processes by
# session, even while another pytest-xdist worker runs its studies beside it: a name pattern alone
# would count, or kill, that worker's processes. A Ray started inside the test process itself
# (tests/test_api.py) is in no such session: it is not counted.
OWN_SESSIONS: set[int] = set()


def start_own_session(args: list[str], **popen_kwargs) -> subprocess.Popen:
    """``subprocess.Popen`` in a new session, recorded in ``OWN_SESSIONS``."""
    proc = subprocess.Popen(args, start_new_session=True, **popen_kwargs)
    OWN_SESSIONS.add(proc.pid)
    return proc


def run_own_session(args: list[str], timeout: float, **popen_kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(..., capture_output=True, text=True)`` in a new session of our own."""
    proc = start_own_session(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen_kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):  # a pipe held open by an escaped child
            proc.communicate(timeout=10)
        raise
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def launch(
    *args: str, cwd: Path, timeout: float = 300, env: dict | None = None
) -> subprocess.CompletedProcess:
    """The console script, in a session of its own (``OWN_SESSIONS``); ``env`` adds variables."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    env.pop("HEADPRUNE_STORAGE", None)
    env.pop("RAY_ADDRESS", None)
    return run_own_session([str(LAUNCH_STUDY), *args], timeout, cwd=cwd, env=env)


def run_smoke_study(url: str, name: str, *extra: str, cwd: Path, **options) -> subprocess.CompletedProcess:
    """``launch-study run`` of the smoke study into ``url`` under ``name`` (``launch``'s options)."""
    return launch("run", str(SMOKE), "--storage", url, "--study-name", name, *extra, cwd=cwd, **options)


def cli_in_process(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The CLI's ``main`` in this process (no interpreter start-up): for the many quick error
    cases. Argument errors exit through SystemExit like the console script does."""
    import io
    from contextlib import chdir, redirect_stderr, redirect_stdout

    from orchestrator.cli import main

    out, err = io.StringIO(), io.StringIO()
    with chdir(cwd), redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exit_:
            code = exit_.code
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


RAY_PROCESSES = "raylet|gcs_server|ray::|ray/dashboard|ray/_private|ray/autoscaler"


def ray_processes(pattern: str = RAY_PROCESSES) -> set[int]:
    """Ray's processes that this test process started (``OWN_SESSIONS``): the cluster, its agents
    and workers (named ray::...), and the head node's autoscaler monitor
    (ray/autoscaler/_private/monitor.py), which outlives a killed head and which the pattern once
    missed (the cluster test left it running)."""
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    own = set()
    for pid in (int(p) for p in out.split()):
        with contextlib.suppress(OSError):
            # /proc/PID/stat: "pid (name) state ppid pgrp session ...", the name may hold spaces
            if int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3]) in OWN_SESSIONS:
                own.add(pid)
    return own - {os.getpid()}


def leftover_ray_processes(before: set[int], grace_seconds: float = 15.0) -> dict[int, str]:
    """Ray processes that appeared since ``before`` and are still there after a grace period
    (ray.shutdown() returns before every helper has exited): {pid: command line}."""
    import time

    deadline = time.time() + grace_seconds
    while True:
        new = ray_processes() - before
        if not new or time.time() > deadline:
            break
        time.sleep(0.25)
    found = {}
    for pid in new:
        with contextlib.suppress(OSError):
            found[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    return found


def kill_new_ray_processes(before: set[int]) -> None:
    """After a driver was SIGKILLed, Ray's agents outlive it (orphans of PID 1): stop them."""
    import signal
    import time

    for _ in range(20):  # the raylet and GCS exit by themselves within a few seconds
        leftovers = ray_processes() - before
        if not leftovers:
            return
        for pid in leftovers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)


def wait_until(condition, what: str, timeout: float = 120.0, every: float = 0.1):
    """Poll ``condition()`` until it returns something true (returned), or fail after
    ``timeout`` seconds saying ``what`` was awaited: a test waits on what it needs, never for a
    fixed time."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := condition():
            return found
        time.sleep(every)
    raise AssertionError(f"waited {timeout:.0f}s for {what}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def busy_trial_worker(before: set[int], cpu: float = 0.5, timeout: float = 120.0) -> set[int]:
    """The pids of this test's Ray trial workers once one of them has used ``cpu`` more seconds
    of CPU than when first seen: a trial is training, not starting."""
    seen: dict[int, float] = {}

    def training() -> set[int]:
        workers = ray_processes("ray::ImplicitFunc") - before
        for pid in workers:
            seen.setdefault(pid, cpu_seconds(pid))
        return workers if any(cpu_seconds(pid) - seen[pid] >= cpu for pid in workers) else set()

    return wait_until(training, f"a trial worker training ({cpu:g}s of CPU)", timeout)


def expected_front(study: optuna.Study) -> list[tuple[int, float, int]]:
    """The non-dominated COMPLETE trials, recomputed from Optuna's own records."""
    done = [t for t in study.get_trials() if t.state == optuna.trial.TrialState.COMPLETE]
    front = pareto_front(done, key=lambda t: (t.values[0], t.values[1]))
    return sorted((t.number, t.values[0], int(t.values[1])) for t in front)


def frontier_triples(rows: list[dict]) -> list[tuple[int, float, int]]:
    return sorted((r["trial_number"], r["val_perplexity"], r["n_params"]) for r in rows)


def hparams(trial: optuna.trial.FrozenTrial) -> dict:
    return trial.user_attrs["hparams"]


def heads(trial: optuna.trial.FrozenTrial) -> list[int]:
    value = trial.user_attrs["heads_per_layer"]
    return json.loads(value) if isinstance(value, str) else value


# The default study's model (4 layers x 8 heads) for driver tests that report synthetic results.
HEADS, LAYERS = 32, 4


def n_params(kept: int) -> int:
    """A 4 x 8-head model's size: 8,240 parameters a head (the default study's gpt)."""
    return 554_496 + 8_240 * kept


def per_layer(kept: int) -> list[int]:
    return [kept // LAYERS + (i < kept % LAYERS) for i in range(LAYERS)]


def worker_result(hparams: dict, ppl: float) -> dict:
    """What a worker reports for a finished trial, its heads as the target asks."""
    from trainers.trial import TrialResult

    kept = HEADS - round(hparams["sparsity"] * HEADS)
    outcome = TrialResult(
        val_perplexity=ppl,
        n_params=n_params(kept),
        n_params_nonembed=n_params(kept) - 10_000,
        sparsity=1 - kept / HEADS,
        heads_per_layer=per_layer(kept),
        kept_heads=[list(range(k)) for k in per_layer(kept)],
        method=hparams["method"],
        tokens_per_s=1.0,
        cpu_seconds=1.0,
    )
    return {"trial_result": json.dumps(outcome.to_dict())}
