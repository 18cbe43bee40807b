"""The compose cluster, end to end: docker/compose.yaml as shipped, its images in its variables.

Run by scripts/cluster_test.sh (`make cluster-test`), which has built the images and started the
engine; not collected by the unit tests' `pytest` (the name matches no test_*.py). It starts
PostgreSQL, the S3 store, a Ray head, two Ray workers (no volume shared with anything) and
optuna-dashboard; runs the smoke study with warm starts from a driver container, on PostgreSQL
and `--artifacts s3://...`; kills worker 2's container in its first trial and the driver's
container once the start-up trials are done (with trials running); resumes from a new driver
container, on worker 2 alone (a new container) until a warm start there has finished from a
parent trained on worker 1, then on both (worker 1 in a new container): so that check is certain,
not a coin toss. Then it checks the study (finished trials, none lost or duplicated, the front),
where trials ran (trial user attr `node_id`), a model exported into a fresh container, one
downloaded through the dashboard, and that the store's secret key (and the database password) is
in no bucket object, log or database row. It tears the cluster down whatever happens.

Prints each phase and its duration, then `N passed, N failed` (one per check).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import re
import secrets
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WORK = REPO / "build" / "cluster"
ENV_FILE = WORK / "compose.env"
PROJECT = "headprune-ci"
COMPOSE = ["docker-compose", "-f", str(REPO / "docker" / "compose.yaml"), "-p", PROJECT]
WORKERS = ("ray-worker-1", "ray-worker-2")
STUDY = "smoke"
BUCKET = "headprune-ci"
PREFIX = "study"

N_TRIALS = int(os.environ.get("CLUSTER_TEST_TRIALS", "12"))
STARTUP_TRIALS = 4  # spread over sparsity before any warm start (and the dense control before them)
KILL_DRIVER_AFTER = STARTUP_TRIALS + 1  # COMPLETE trials before the driver is killed (one running)
RUN_ARGS = [
    f"--n-trials {N_TRIALS}",
    "--max-concurrent 2",
    "--set study.warm_start=true",
    f"--set study.startup_trials={STARTUP_TRIALS}",
    "--set study.lease_seconds=10",  # the new driver takes over 10 s after the dead one's last beat
    "--set study.cpus_per_trial=1",
    "--set trial.finetune_steps=300",  # trials long enough to be killed in the middle of one
]

IMAGES = {  # what scripts/cluster_prereqs.sh and cluster_test.sh built (docker/ci/lib.sh)
    "HEADPRUNE_IMAGE": "headprune-ci/headprune:test",
    "HEADPRUNE_BASE_IMAGE": "headprune-base:bookworm",
    "HEADPRUNE_POSTGRES_IMAGE": "headprune-ci/postgres:15",
    "HEADPRUNE_S3_IMAGE": "headprune-ci/s3:moto",
}


# --- reporting ----------------------------------------------------------------------------------

RESULTS: list[tuple[str, bool, str]] = []
T0 = time.monotonic()


def say(message: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {message}", flush=True)


def check(name: str, ok: bool, detail: object = "") -> bool:
    RESULTS.append((name, bool(ok), str(detail)))
    say(f"{'PASS' if ok else 'FAIL'} {name}{'' if ok or not detail else f': {detail}'}")
    return bool(ok)


@contextlib.contextmanager
def phase(name: str):
    say(f"== {name}")
    start = time.monotonic()
    try:
        yield
    finally:
        say(f"-- {name}: {time.monotonic() - start:.1f} s")


class Failed(Exception):
    """A step the rest of the scenario cannot go on without."""


def require(name: str, ok: bool, detail: object = "") -> None:
    if not check(name, ok, detail):
        raise Failed(name)


def wait(what: str, condition, timeout: float, every: float = 1.0):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise Failed(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


# --- the cluster --------------------------------------------------------------------------------


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_blocks(count: int, size: int, taken: set[int]) -> list[int]:
    """``count`` blocks of ``size`` free ports, below Linux's ephemeral range (32768-60999), so
    that no client connection can take one of them before its server starts."""
    found: list[int] = []
    while len(found) < count:
        base = random.randrange(20000, 32700 - size, 100)
        block = set(range(base, base + size))
        if block & taken or not all(port_free(p) for p in block):
            continue
        taken |= block
        found.append(base)
    return found


def write_env() -> dict[str, str]:
    taken: set[int] = set()
    singles = free_blocks(5, 1, taken)
    head, worker1, worker2, driver = free_blocks(4, 60, taken)
    env = {
        **IMAGES,
        "HEADPRUNE_PG_PORT": singles[0],
        "HEADPRUNE_S3_PORT": singles[1],
        "HEADPRUNE_S3_CONSOLE_PORT": singles[2],
        "HEADPRUNE_RAY_PORT": singles[3],
        # Ray keeps this loopback address; it would swap 127.0.0.1 for the host's outward one.
        "HEADPRUNE_RAY_IP": "127.0.0.2",
        "HEADPRUNE_DASHBOARD_PORT": singles[4],
        "HEADPRUNE_RAY_HEAD_PORTS": head,
        "HEADPRUNE_RAY_WORKER1_PORTS": worker1,
        "HEADPRUNE_RAY_WORKER2_PORTS": worker2,
        "HEADPRUNE_RAY_DRIVER_PORTS": driver,
        "HEADPRUNE_DB_PASSWORD": secrets.token_urlsafe(18),
        "AWS_ACCESS_KEY_ID": "HP" + secrets.token_hex(8).upper(),
        "AWS_SECRET_ACCESS_KEY": secrets.token_urlsafe(30),
        "AWS_DEFAULT_REGION": "us-east-1",
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
        "HEADPRUNE_BUCKET": BUCKET,
        "HEADPRUNE_ARTIFACTS_PREFIX": PREFIX,
        "HEADPRUNE_STUDY": "studies/smoke.toml",
        "HEADPRUNE_RUN_ARGS": " ".join(RUN_ARGS),
    }
    env = {k: str(v) for k, v in env.items()}
    WORK.mkdir(parents=True, exist_ok=True)
    ENV_FILE.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    ENV_FILE.chmod(0o600)
    return env


def compose(*args: str, check: bool = True, timeout: float = 300, capture: bool = True):
    done = subprocess.run(
        [*COMPOSE, "--env-file", str(ENV_FILE), *args],
        cwd=REPO,
        capture_output=capture,
        text=True,
        timeout=timeout,
        env={k: v for k, v in os.environ.items() if not k.startswith(("HEADPRUNE_", "AWS_", "RAY_"))},
    )
    if check and done.returncode != 0:
        raise Failed(
            f"docker-compose {' '.join(args)}: exit {done.returncode}\n{(done.stderr or '')[-3000:]}"
        )
    return done


def container(service: str) -> str:
    """The id of the service's container (running or not); '' if there is none."""
    return compose("ps", "-q", service).stdout.strip()


def docker(*args: str, timeout: float = 120, check: bool = True, text: bool = True):
    done = subprocess.run(["docker", *args], capture_output=True, text=text, timeout=timeout)
    if check and done.returncode != 0:
        raise Failed(f"docker {' '.join(args[:3])}: exit {done.returncode}: {done.stderr!s:.2000}")
    return done


def state(cid: str) -> dict:
    return json.loads(docker("inspect", "-f", "{{json .State}}", cid).stdout)


def processes(cid: str) -> list[str]:
    """The command lines of a running container's processes (Ray sets its workers' titles)."""
    code = (
        "import os\n"
        "for p in os.listdir('/proc'):\n"
        "    if p.isdigit():\n"
        "        try: print(open(f'/proc/{p}/cmdline','rb').read().replace(b'\\0',b' ').decode().strip())\n"
        "        except OSError: pass\n"
    )
    done = docker("exec", cid, "python", "-c", code, check=False)
    return done.stdout.splitlines() if done.returncode == 0 else []


def output(cid: str) -> str:
    """The end of a container's output (standard output and error)."""
    done = docker("logs", "--tail", "60", cid, check=False)
    return (done.stdout + done.stderr)[-4000:]


def node_id(cid: str) -> str:
    """The Ray node id of the raylet in a container (its --node_id flag, as Ray finds it)."""
    for line in processes(cid):
        if "raylet" in line and (m := re.search(r"--node_id=([0-9a-f]+)", line)):
            return m.group(1)
    return ""


def running_trial(cid: str) -> bool:
    """A trial executing in this container: Tune's function trainable, titled by Ray."""
    return any(line.startswith("ray::ImplicitFunc.train") for line in processes(cid))


def keep_logs(service: str, cid: str, secrets_found: dict[str, list[str]], secret_values: list[str]) -> None:
    """A container's output and Ray's log folder, saved and searched for the secrets before it
    is removed (a removed container takes both with it)."""
    out = docker("logs", cid, check=False)
    text = (out.stdout or "") + (out.stderr or "")
    (WORK / f"{service}-{cid[:12]}.log").write_text(text)
    ray_logs = subprocess.run(["docker", "cp", f"{cid}:/tmp/ray", "-"], capture_output=True, timeout=120)
    for value in secret_values:
        if value in text:
            secrets_found.setdefault(value, []).append(f"output of {service} {cid[:12]}")
        if value.encode() in ray_logs.stdout:
            secrets_found.setdefault(value, []).append(f"/tmp/ray of {service} {cid[:12]}")


# --- the study in the database ------------------------------------------------------------------


def states(url: str) -> dict[str, int]:
    import psycopg

    try:
        with psycopg.connect(url.replace("postgresql+psycopg", "postgresql"), connect_timeout=5) as db:
            rows = db.execute(
                "SELECT t.state, count(*) FROM trials t JOIN studies s ON s.study_id = t.study_id "
                "WHERE s.study_name = %s GROUP BY t.state",
                (STUDY,),
            ).fetchall()
    except psycopg.Error:
        return {}  # no tables yet
    return {str(state): n for state, n in rows}


def load_study(url: str):
    import optuna

    from orchestrator.storage import open_store

    store = open_store(url)
    return store, optuna.load_study(study_name=STUDY, storage=store.storage)


# --- the scenario -------------------------------------------------------------------------------


def scenario(env: dict[str, str]) -> None:
    pg_port, s3_port = env["HEADPRUNE_PG_PORT"], env["HEADPRUNE_S3_PORT"]
    ray_address = f"{env['HEADPRUNE_RAY_IP']}:{env['HEADPRUNE_RAY_PORT']}"
    dash = f"http://127.0.0.1:{env['HEADPRUNE_DASHBOARD_PORT']}"
    url = f"postgresql+psycopg://headprune@127.0.0.1:{pg_port}/headprune"
    os.environ.update(
        PGPASSWORD=env["HEADPRUNE_DB_PASSWORD"],
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{s3_port}",
        AWS_ACCESS_KEY_ID=env["AWS_ACCESS_KEY_ID"],
        AWS_SECRET_ACCESS_KEY=env["AWS_SECRET_ACCESS_KEY"],
        AWS_DEFAULT_REGION="us-east-1",
    )
    secret_values = [env["AWS_SECRET_ACCESS_KEY"], env["HEADPRUNE_DB_PASSWORD"]]
    found: dict[str, list[str]] = {}
    workers: dict[str, str] = {}  # Ray node id -> worker service

    with phase("cluster start"):
        compose("up", "-d", "postgres", "s3", "bucket", "ray-head", *WORKERS, timeout=600)
        wait("the bucket service", lambda: not state(container("bucket"))["Running"], 120)
        bucket = container("bucket")
        require(
            "the bucket service ran",
            bucket and state(bucket)["ExitCode"] == 0,
            compose("logs", "bucket").stdout[-1500:],
        )
        head = container("ray-head")

        def joined():
            for service in ("ray-head", *WORKERS):
                if not state(container(service))["Running"]:
                    raise Failed(f"{service} exited:\n{compose('logs', '--tail', '30', service).stdout}")
            out = docker("exec", head, "ray", "status", f"--address={ray_address}", check=False).stdout
            nodes = re.findall(r"^\s*1 node_[0-9a-f]+", out, flags=re.M)
            return out if len(nodes) == 3 and re.search(r"/2\.0 CPU", out) else None

        status = wait("the head and 2 workers in `ray status`", joined, timeout=120, every=2)
        check("ray status: head + 2 workers, 2 CPUs", True)
        (WORK / "ray-status.txt").write_text(status)
        for service in WORKERS:
            workers[wait(f"{service}'s raylet", lambda s=service: node_id(container(s)), 60)] = service
        check("each worker a Ray node of its own", len(workers) == 2, workers)
        for service in WORKERS:
            mounts = json.loads(docker("inspect", "-f", "{{json .Mounts}}", container(service)).stdout)
            check(f"{service} shares no volume", not mounts, mounts)

    before_kill: dict[int, list[float]] = {}
    # The order of the kills makes a cross-worker warm start all but certain, not a coin toss
    # (two workers taking trials in turn): every trial before the driver's kill runs on worker 1
    # (worker 2 killed in its first trial), so every parent the resumed study starts with was
    # trained there; the resumed study runs on worker 2 alone (a new container; worker 1 stopped)
    # until a warm start there has finished from one of them, then on both.
    with phase("study: first driver; worker 2 killed mid-trial; the driver killed mid-study"):
        compose("up", "-d", "--no-deps", "driver")
        driver1 = container("driver")

        def alive():
            if not state(driver1)["Running"]:
                raise Failed(f"the first driver exited early:\n{output(driver1)}")
            return states(url)

        def first_trial_on_worker2():
            if alive().get("COMPLETE", 0) >= 2:  # the first two trials start together, one a worker
                raise Failed("no trial seen running on ray-worker-2 among the first two")
            return running_trial(container("ray-worker-2"))

        wait("a trial on ray-worker-2", first_trial_on_worker2, 600, 0.5)
        old = container("ray-worker-2")
        compose("kill", "ray-worker-2")
        say(f"killed ray-worker-2 ({old[:12]}) mid-trial, {states(url)}")
        keep_logs("ray-worker-2", old, found, secret_values)
        compose("rm", "-f", "ray-worker-2")

        wait("the first COMPLETE trial", lambda: alive().get("COMPLETE", 0) >= 1, 600, 1)
        # optuna-dashboard refuses a database without a study: started once the driver made it.
        compose("up", "-d", "--no-deps", "dashboard")

        def dashboard_up():
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{dash}/api/studies", timeout=5) as r:
                return r.status == 200
            return False

        require(
            "optuna-dashboard answers",
            wait("the dashboard", dashboard_up, 90),
            compose("logs", "dashboard").stdout[-2000:],
        )

        def mid_study():
            now = alive()
            return now.get("COMPLETE", 0) >= KILL_DRIVER_AFTER and now.get("RUNNING", 0) > 0

        wait(f"{KILL_DRIVER_AFTER} COMPLETE trials and one running", mid_study, 900, 0.5)
        check("the first driver survived the worker's death", state(driver1)["Running"])
        compose("kill", "driver")
        _, study = load_study(url)  # what the dead driver left: nothing changes it until the next
        before_kill = {t.number: t.values for t in study.get_trials() if t.state.name == "COMPLETE"}
        say(f"killed the driver ({driver1[:12]}) with {len(before_kill)} trials COMPLETE, {states(url)}")
        keep_logs("driver", driver1, found, secret_values)
        compose("rm", "-f", "driver")

    with phase("study: resumed by a new driver container, on worker 2 (new), then on both"):
        compose("stop", "-t", "10", "ray-worker-1")
        compose("up", "-d", "--no-deps", "ray-worker-2")  # a fresh container: nothing of the old one
        workers[wait("ray-worker-2's new raylet", lambda: node_id(container("ray-worker-2")), 60)] = (
            "ray-worker-2"
        )
        compose("up", "-d", "--no-deps", "driver")
        driver2 = container("driver")
        check("the second driver is a new container", driver2 and driver2 != driver1)

        def crossed_on_worker2():
            if not state(driver2)["Running"]:
                return True
            _, study = load_study(url)
            return crossings(study.get_trials(), workers)

        wait("a warm start on ray-worker-2 from a parent of ray-worker-1", crossed_on_worker2, 900, 2)
        old = container("ray-worker-1")
        keep_logs("ray-worker-1", old, found, secret_values)
        compose("rm", "-f", "ray-worker-1")
        compose("up", "-d", "--no-deps", "ray-worker-1")
        workers[wait("ray-worker-1's new raylet", lambda: node_id(container("ray-worker-1")), 60)] = (
            "ray-worker-1"
        )
        say(f"ray-worker-1 back in a new container, {states(url)}")
        wait("the second driver to finish", lambda: not state(driver2)["Running"], 1200, 2)
        exit_code = state(driver2)["ExitCode"]
        keep_logs("driver", driver2, found, secret_values)
        require("the second driver exits 0", exit_code == 0, output(driver2))

    with phase("checks: the study"):
        check_study(url, before_kill, workers)

    with phase("export-model into a fresh container"):
        store, study = load_study(url)
        number = pick_trial(study)
        script = (
            f"launch-study export-model --study-name {STUDY} --trial {number} --output /tmp/model && "
            "python -c \"from trainers import load_pruned; m = load_pruned('/tmp/model'); "
            "print('loaded', type(m[0] if isinstance(m, tuple) else m).__name__)\""
        )
        done = compose(
            "run",
            "--rm",
            "--no-deps",
            "-T",
            "--entrypoint",
            "sh",
            "driver",
            "-c",
            script,
            check=False,
            timeout=300,
        )
        (WORK / "export-model.log").write_text(done.stdout + done.stderr)
        for value in secret_values:
            if value in done.stdout + done.stderr:
                found.setdefault(value, []).append("export-model's output")
        check(
            f"export-model of trial {number} loads with trainers.load_pruned",
            done.returncode == 0 and "loaded" in done.stdout,
            (done.stdout + done.stderr)[-2000:],
        )

    with phase("a model downloaded through the dashboard"):
        check_dashboard_download(dash)

    with phase("checks: the secrets"):
        scan_secrets(env, secret_values, found)


def pick_trial(study) -> int:
    complete = [t for t in study.get_trials() if t.state.name == "COMPLETE"]
    pruned = [t for t in complete if not t.user_attrs.get("dense_control")]
    return (pruned or complete)[-1].number


def crossings(trials, workers: dict[str, str]) -> list[tuple[int, int]]:
    """(trial, parent) of the COMPLETE warm starts whose parent ran on the other worker."""
    where = {
        t.number: workers.get(t.user_attrs.get("node_id", "")) for t in trials if t.state.name == "COMPLETE"
    }
    return [
        (t.number, t.user_attrs["warm_start_from"])
        for t in trials
        if t.number in where
        and "warm_start_from" in t.user_attrs
        and where.get(t.user_attrs["warm_start_from"]) not in (None, where[t.number])
    ]


def check_study(url: str, before_kill: dict[int, list[float]], workers: dict[str, str]) -> None:
    from orchestrator.frontier import pareto_front
    from orchestrator.storage import read_frontier

    store, study = load_study(url)
    trials = study.get_trials()
    by_state: dict[str, list[int]] = {}
    for t in trials:
        by_state.setdefault(t.state.name, []).append(t.number)
    say(f"trials by state: {by_state}")
    finished = [t for t in trials if t.state.name in ("COMPLETE", "PRUNED")]
    check(f"exactly {N_TRIALS} finished trials", len(finished) == N_TRIALS, by_state)
    check(
        "no trial left RUNNING or WAITING",
        not by_state.get("RUNNING") and not by_state.get("WAITING"),
        by_state,
    )
    # Lost: a trial COMPLETE before the kill no longer so, or a failed trial never asked again.
    changed = [
        n for n, v in before_kill.items() if trials[n].state.name != "COMPLETE" or trials[n].values != v
    ]
    retried = {t.user_attrs["retry_of"] for t in trials if "retry_of" in t.user_attrs}
    unretried = [t.number for t in trials if t.state.name == "FAIL" and t.number not in retried]
    check(
        "0 lost (COMPLETE trials kept, every FAIL trial asked again)",
        not changed and not unretried,
        f"changed {changed}, FAIL never retried {unretried}",
    )
    # Duplicated: a retry of a trial that had completed, or one trial retried to completion twice.
    completed_retries = [t.user_attrs["retry_of"] for t in finished if "retry_of" in t.user_attrs]
    bad = [n for n in completed_retries if trials[n].state.name != "FAIL"]
    twice = sorted({n for n in completed_retries if completed_retries.count(n) > 1})
    check(
        "0 duplicated (retries only of FAIL trials, each completed once)",
        not bad and not twice,
        f"retries of non-FAIL {bad}, twice {twice}",
    )
    check("the driver kill left a trial to retry", bool(retried), "no trial has retry_of")
    survived = [t.number for t in finished if t.user_attrs.get("worker_retries")]
    check("the worker's death: its trial retried by Tune and finished (worker_retries)", bool(survived))

    complete = [t for t in trials if t.state.name == "COMPLETE"]
    expected = sorted(
        (t.number, t.values[0], int(t.values[1]))
        for t in pareto_front(complete, key=lambda t: (t.values[0], t.values[1]))
    )
    stored = sorted(
        (r["trial_number"], r["val_perplexity"], r["n_params"]) for r in read_frontier(store, STUDY)
    )
    check(
        "the stored front equals the one recomputed from the trials",
        stored == expected and bool(stored),
        f"stored {stored}\nexpected {expected}",
    )

    where = {t.number: workers.get(t.user_attrs.get("node_id", "")) for t in complete}
    say(f"trial -> worker: {where}")
    check("every COMPLETE trial ran on a known worker", all(where.values()), where)
    check("trials ran on both workers", set(where.values()) == set(WORKERS), where)
    crossed = crossings(trials, workers)
    starts = {
        t.number: t.user_attrs["warm_start_from"] for t in complete if "warm_start_from" in t.user_attrs
    }
    check(
        "a warm start's parent was trained on the other worker",
        bool(crossed),
        f"warm starts (trial: parent) {starts}",
    )
    say(f"warm starts (trial: parent) {starts}; across workers: {crossed}")


def check_dashboard_download(dash: str) -> None:
    def get(path: str) -> bytes:
        with urllib.request.urlopen(dash + path, timeout=60) as r:
            return r.read()

    studies = json.loads(get("/api/studies"))["study_summaries"]
    study_id = next(s["study_id"] for s in studies if s["study_name"] == STUDY)
    detail = json.loads(get(f"/api/studies/{study_id}"))
    listed = [(t["number"], t["trial_id"], a) for t in detail["trials"] for a in t.get("artifacts", [])]
    if not check(
        "the dashboard lists trial artifacts", bool(listed), f"{len(detail['trials'])} trials, no artifact"
    ):
        return
    number, trial_id, artifact = listed[-1]
    body = get(f"/artifacts/{study_id}/{trial_id}/{artifact['artifact_id']}")
    with tempfile.TemporaryDirectory() as scratch:
        try:
            with tarfile.open(fileobj=io.BytesIO(body)) as tar:
                tar.extractall(scratch, filter="data")
        except tarfile.TarError as err:
            check(f"trial {number}'s artifact is a tar of the model", False, f"{err}; {len(body)} bytes")
            return
        folders = {p.parent for p in Path(scratch).rglob("config.json")}
        from trainers import load_pruned

        try:
            load_pruned(next(iter(folders)))
            ok, detail = True, ""
        except Exception as err:  # noqa: BLE001 - reported as the check's failure
            ok, detail = (
                False,
                f"{type(err).__name__}: {err}; files {sorted(p.name for p in Path(scratch).rglob('*'))}",
            )
        check(f"trial {number}'s model downloaded from the dashboard ({len(body):,} bytes) loads", ok, detail)


def scan_secrets(env: dict[str, str], secret_values: list[str], found: dict[str, list[str]]) -> None:
    import boto3

    s3 = boto3.client("s3")
    keys = [
        o["Key"]
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET)
        for o in page.get("Contents", [])
    ]
    check("the bucket holds the study's objects", bool(keys), "empty bucket")
    for key in keys:
        body = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        for value in secret_values:
            if value.encode() in body:
                found.setdefault(value, []).append(f"s3://{BUCKET}/{key}")
    say(f"searched {len(keys)} bucket objects")
    logs = compose("logs", "--no-color", timeout=120)
    (WORK / "compose.log").write_text(logs.stdout + logs.stderr)
    for value in secret_values:
        if value in logs.stdout + logs.stderr:
            found.setdefault(value, []).append("docker-compose logs")
    for cid in compose("ps", "-q").stdout.split():
        keep_logs("container", cid, found, secret_values)
    dump = compose("exec", "-T", "postgres", "pg_dump", "-U", "headprune", "headprune", timeout=120)
    for value in secret_values:
        if value in dump.stdout:
            found.setdefault(value, []).append("a database row (pg_dump)")
    say(f"searched the database dump ({len(dump.stdout):,} characters)")
    for path in WORK.glob("*.log"):
        text = path.read_text(errors="replace")
        for value in secret_values:
            if value in text:
                found.setdefault(value, []).append(str(path.relative_to(REPO)))
    names = {
        env["AWS_SECRET_ACCESS_KEY"]: "the S3 secret key",
        env["HEADPRUNE_DB_PASSWORD"]: "the database password",
    }
    for value in secret_values:
        check(
            f"{names[value]} in no bucket object, log or database row", value not in found, found.get(value)
        )


def teardown() -> None:
    with phase("teardown"):
        if ENV_FILE.exists():
            compose("down", "-v", "--remove-orphans", "--timeout", "5", check=False, timeout=180)
        left = docker(
            "ps", "-aq", "--filter", f"label=com.docker.compose.project={PROJECT}", check=False
        ).stdout.split()
        if left:
            docker("rm", "-f", *left, check=False)
        label = f"label=com.docker.compose.project={PROJECT}"
        left = docker("ps", "-aq", "--filter", label, check=False)
        volumes = docker("volume", "ls", "-q", "--filter", label, check=False)
        check(
            "no container or volume left",
            left.returncode == volumes.returncode == 0 and not (left.stdout + volumes.stdout).strip(),
            left.stdout + left.stderr + volumes.stdout + volumes.stderr,
        )


def interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    # Interrupted (Ctrl-C, or a CI's SIGTERM), the teardown still runs: the cluster comes down.
    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    sys.path.insert(0, str(REPO))
    for stale in [*WORK.glob("*-*.log"), WORK / "compose.log", WORK / "export-model.log"]:
        if not stale.name.startswith(("build-", "dockerd", "wheels")):
            stale.unlink(missing_ok=True)  # an earlier run's containers
    env = write_env()
    say(f"compose project {PROJECT}, env file {ENV_FILE.relative_to(REPO)}; {N_TRIALS} trials")
    try:
        compose(
            "down", "-v", "--remove-orphans", "--timeout", "5", check=False, timeout=180
        )  # an earlier run's
        scenario(env)
    except Exception as err:  # noqa: BLE001 - whatever it is, the cluster comes down
        detail = err if isinstance(err, Failed) else traceback.format_exc()
        check("the scenario ran to its end", False, detail)
        with contextlib.suppress(Exception):
            logs = compose("logs", "--no-color", "--tail", "60", check=False, timeout=60)
            (WORK / "compose-tail.log").write_text(logs.stdout)
            print(logs.stdout[-6000:])
    finally:
        teardown()
    passed = sum(ok for _, ok, _ in RESULTS)
    failed = len(RESULTS) - passed
    for name, ok, _ in RESULTS:
        if not ok:
            print(f"FAILED: {name}")
    print(f"cluster-test: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
