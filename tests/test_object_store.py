"""``--artifacts s3://…``: models on a real S3 API (moto's server on a free loopback port, a
process of its own, not its in-process mock), a study that resumes on a machine without the
first run's files, uploads that a reader trusts only whole, and mistakes caught before any write."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from helpers import SMOKE, cli_in_process, expected_front, frontier_triples, launch

from orchestrator.artifacts import exists, fetch, is_remote, join, parse_root, publish
from orchestrator.errors import UserError
from trainers.export import CONFIG, WEIGHTS, CorruptModel, load_model, save_model

MOTO = Path(sys.executable).parent / "moto_server"
REGION = "us-east-1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def s3_server(**env: str) -> Iterator[str]:
    """moto's S3 server on a free port of 127.0.0.1 (``env``: its settings), stopped after."""
    port = _free_port()
    proc = subprocess.Popen(
        [str(MOTO), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **env},
        start_new_session=True,
    )
    try:
        deadline = time.time() + 30
        while True:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            assert proc.poll() is None and time.time() < deadline, "moto_server did not start"
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)


def s3_client(endpoint: str, key: str = "test", secret: str = "test"):
    import boto3

    return boto3.client(
        "s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id=key, aws_secret_access_key=secret
    )


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with s3_server() as url:
        yield url


@pytest.fixture
def bucket(endpoint: str) -> str:
    name = f"headprune-{secrets.token_hex(4)}"
    s3_client(endpoint).create_bucket(Bucket=name)
    return name


@pytest.fixture
def aws(monkeypatch, endpoint: str, tmp_path: Path) -> dict[str, str]:
    """The environment of a node that reaches the store: endpoint, keys, a cache of its own."""
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "AKIA" + secrets.token_hex(8).upper(),
        "AWS_SECRET_ACCESS_KEY": secrets.token_urlsafe(30),
        "AWS_DEFAULT_REGION": REGION,
        "AWS_EC2_METADATA_DISABLED": "true",
        "HEADPRUNE_CACHE": str(tmp_path / "cache"),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def objects(endpoint: str, bucket: str) -> dict[str, bytes]:
    client = s3_client(endpoint)
    keys = [
        o["Key"]
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
        for o in page.get("Contents", [])
    ]
    return {key: client.get_object(Bucket=bucket, Key=key)["Body"].read() for key in keys}


def tiny_model_folder(folder: Path, seed: int = 0) -> Path:
    import torch

    from trainers.families import build_model
    from trainers.model import ModelConfig
    from trainers.tokenizers import CharTokenizer

    torch.manual_seed(seed)
    model = build_model(ModelConfig(vocab_size=8, block_size=8, n_layer=1, n_head=2, d_model=8))
    return save_model(model, CharTokenizer.train("abcdefg"), folder, extra={"seed": seed})


def test_roots_are_paths_or_uris_without_credentials(tmp_path):
    assert parse_root("s3://bucket//a/b/") == "s3://bucket/a/b"
    assert parse_root("gcs://bucket") == "gs://bucket"
    assert parse_root(tmp_path / "x") == str(tmp_path / "x")
    assert parse_root("file:///tmp/a") == "/tmp/a"
    assert join("s3://b/p", "trials", "3") == "s3://b/p/trials/3" and is_remote("s3://b/p")
    assert join("/a", "trials") == "/a/trials" and not is_remote("/a")
    for bad, said in (
        ("ftp://host/x", "unknown scheme 'ftp'"),
        ("s3://", "no bucket"),
        ("s3://b/p?access_key=AKIA&secret_key=hunter2", "credentials and options do not go in the URI"),
        ("s3://AKIA:hunter2@bucket/p", "credentials and options do not go in the URI"),
        ("https://AKIA:hunter2@host/p", "credentials and options do not go in the URI"),
    ):
        with pytest.raises(UserError, match=said) as err:
            parse_root(bad)
        assert "hunter2" not in str(err.value)


def test_a_model_is_trusted_only_once_its_upload_is_whole(aws, endpoint, bucket, tmp_path, monkeypatch):
    """publish uploads config.json last and removes the old one first: an upload killed part-way,
    over an older model or none, leaves a folder that neither ``exists`` nor ``fetch`` trusts."""
    location = f"s3://{bucket}/trials/s/1"
    first = tiny_model_folder(tmp_path / "first", seed=0)
    assert not exists(location)
    publish(first, location)
    assert exists(location)
    digest = json.loads((first / CONFIG).read_text())["sha256"][WEIGHTS]
    got = fetch(location, digest)
    assert (
        got == tmp_path / "cache" / "models" / digest
        and (got / WEIGHTS).read_bytes() == (first / WEIGHTS).read_bytes()
    )
    load_model(got)

    second = tiny_model_folder(tmp_path / "second", seed=1)
    import orchestrator.artifacts as artifacts

    real_copy = artifacts.shutil.copyfileobj

    def killed_at_config(source, out, *args):
        if source.name.endswith(CONFIG):
            raise KeyboardInterrupt  # the worker dies before the config goes up
        real_copy(source, out, *args)

    with monkeypatch.context() as patched, pytest.raises(KeyboardInterrupt):
        patched.setattr(artifacts.shutil, "copyfileobj", killed_at_config)
        publish(second, location)
    assert not exists(location)  # the new weights are there, no config.json vouches for them
    with pytest.raises(CorruptModel, match="no config.json"):
        fetch(location)
    # The cached copy of the first model is still the first model, checked by its digest.
    assert fetch(location, digest) == got
    (got / WEIGHTS).write_bytes(b"flipped")  # a damaged cache is downloaded again, not trusted
    with pytest.raises(CorruptModel):
        fetch(location, digest)
    assert not got.exists()

    publish(second, location)  # the retry's upload, whole
    other = json.loads((second / CONFIG).read_text())["sha256"][WEIGHTS]
    with pytest.raises(CorruptModel, match="not the expected"):
        fetch(location, digest)  # a reader that expects the first model is refused the second
    assert (fetch(location, other) / WEIGHTS).read_bytes() == (second / WEIGHTS).read_bytes()
    assert not list((tmp_path / "cache" / "tmp").iterdir())  # nothing half-downloaded is left


def _trials(url: str, name: str) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=name, storage=url).get_trials()


def _summary(trials: list[optuna.trial.FrozenTrial]) -> list[tuple]:
    return [(t.number, t.state.name, t.params, t.values, t.user_attrs.get("warm_start_from")) for t in trials]


@pytest.mark.slow
def test_a_study_on_s3_resumed_without_its_local_files_ends_as_on_local_disk(aws, endpoint, bucket, tmp_path):
    """The smoke study with warm starts, run to 4 trials and resumed to 6, once on local disk and
    once on the store with the driver's cache deleted between the runs (as a new machine): the
    same trials, values and front. The bucket holds the dense checkpoint once and every trial's
    model; the secret key is in no object, database, output or Ray log; replicate, status and
    export-model then work from yet another empty cache."""
    root = f"s3://{bucket}/study"
    warm = ["--set", "study.warm_start=true"]
    local, remote = tmp_path / "local", tmp_path / "remote"
    local.mkdir(), remote.mkdir()
    runs = []
    for n in ("4", "6"):
        runs.append(launch("run", str(SMOKE), "--n-trials", n, *warm, cwd=local))
        env = {"HEADPRUNE_CACHE": str(tmp_path / f"cache-{n}")}  # the second run: a fresh machine
        runs.append(
            launch("run", str(SMOKE), "--n-trials", n, *warm, "--artifacts", root, cwd=remote, env=env)
        )
        for run in runs[-2:]:
            assert run.returncode == 0, run.stderr[-3000:]
    assert not (remote / "runs" / "artifacts").exists()  # nothing went to a local folder

    url_local, url_remote = (f"sqlite:///{d}/runs/smoke.db" for d in (local, remote))
    on_disk, on_store = _trials(url_local, "smoke"), _trials(url_remote, "smoke")
    assert _summary(on_store) == _summary(on_disk)
    assert sum(t.user_attrs.get("warm_start_from") is not None for t in on_store[4:]) >= 1  # after the resume
    study = optuna.load_study(study_name="smoke", storage=url_remote)
    assert expected_front(study) == expected_front(optuna.load_study(study_name="smoke", storage=url_local))
    from orchestrator.storage import front_rows

    assert frontier_triples(front_rows(study)) == expected_front(study)
    assert (remote / "runs" / "smoke_pareto.csv").read_text() == (
        local / "runs" / "smoke_pareto.csv"
    ).read_text()

    stored = objects(endpoint, bucket)
    dense = {key.split("/")[2] for key in stored if key.startswith("study/dense/")}
    assert len(dense) == 1 and f"study/dense/{dense.pop()}/{WEIGHTS}" in stored  # uploaded once
    for trial in on_store:
        assert trial.user_attrs["model_dir"].startswith(f"{root}/trials/")
        prefix = trial.user_attrs["model_dir"].removeprefix(f"s3://{bucket}/")
        assert {f"{prefix}/{WEIGHTS}", f"{prefix}/{CONFIG}"} <= set(stored)
        digest = json.loads(stored[f"{prefix}/{CONFIG}"])["sha256"][WEIGHTS]
        assert trial.user_attrs["model_sha256"] == digest

    # Any machine that reaches the database and the store: replicate, status, export-model.
    elsewhere = {"HEADPRUNE_CACHE": str(tmp_path / "cache-other")}
    replicate = launch(
        "replicate", str(SMOKE), "--seeds", "1", *warm, "--artifacts", root, cwd=remote, env=elsewhere
    )
    assert replicate.returncode == 0, replicate.stderr[-3000:]
    status = launch("status", "--storage", url_remote, "--study-name", "smoke", cwd=remote, env=elsewhere)
    assert status.returncode == 0 and "complete 6" in status.stdout
    child = next(t for t in on_store if t.user_attrs.get("warm_start_from") is not None)
    export = launch(
        "export-model",
        "--storage",
        url_remote,
        "--study-name",
        "smoke",
        "--trial",
        str(child.number),
        "--output",
        str(tmp_path / "exported"),
        cwd=remote,
        env=elsewhere,
    )
    assert export.returncode == 0, export.stderr[-2000:]
    model, _ = load_model(tmp_path / "exported")
    assert list(model.cfg.layer_heads) == child.user_attrs["heads_per_layer"]

    # The dashboard lists the child's model under its trial and serves it for download.
    tar = dashboard_download(url_remote, root, "smoke", child.number)
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        archive.extractall(tmp_path / "downloaded", filter="data")
    downloaded, _ = load_model(tmp_path / "downloaded" / f"trial-{child.number}")
    assert list(downloaded.cfg.layer_heads) == child.user_attrs["heads_per_layer"]

    secret = aws["AWS_SECRET_ACCESS_KEY"].encode()
    assert not [key for key, body in objects(endpoint, bucket).items() if secret in body]
    assert secret not in (remote / "runs" / "smoke.db").read_bytes()
    for run in [*runs, replicate, status, export]:
        assert aws["AWS_SECRET_ACCESS_KEY"] not in run.stdout + run.stderr
    ray_logs = subprocess.run(["grep", "-rl", aws["AWS_SECRET_ACCESS_KEY"], "/tmp/ray"], capture_output=True)
    assert not ray_logs.stdout, ray_logs.stdout.decode()


def dashboard_download(url: str, root: str, study_name: str, number: int) -> bytes:
    """A trial's model as optuna-dashboard serves it (``launch-study dashboard``'s app, with the
    study's artifacts), found the way its page finds it: the study, then the trial's artifacts."""
    from wsgiref.util import setup_testing_defaults

    from optuna_dashboard import wsgi

    from orchestrator.artifacts import TrialArtifacts
    from orchestrator.storage import open_store

    app = wsgi(open_store(url, create=False).storage, artifact_store=TrialArtifacts(root))

    def get(path: str) -> bytes:
        environ = {"PATH_INFO": path, "QUERY_STRING": "", "HTTP_ACCEPT_ENCODING": "identity"}
        setup_testing_defaults(environ)
        status = []
        body = b"".join(app(environ, lambda code, headers, *exc: status.append(code)))
        assert status[0].startswith("200"), (path, status, body[:200])
        return body

    studies = json.loads(get("/api/studies"))["study_summaries"]
    study_id = next(s["study_id"] for s in studies if s["study_name"] == study_name)
    trials = json.loads(get(f"/api/studies/{study_id}"))["trials"]
    trial = next(t for t in trials if t["number"] == number)
    (artifact,) = trial["artifacts"]
    assert artifact["filename"] == f"trial-{number}.tar"
    return get(f"/artifacts/{study_id}/{trial['trial_id']}/{artifact['artifact_id']}")


def _refused(tmp_path: Path, root: str, said: str) -> None:
    run = cli_in_process("run", str(SMOKE), "--artifacts", root, cwd=tmp_path)
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and said in lines[0], run.stderr
    assert os.environ["AWS_SECRET_ACCESS_KEY"] not in run.stderr + run.stdout


def test_a_wrong_endpoint_or_a_missing_bucket_is_one_line_before_anything_is_written(
    aws, bucket, tmp_path, monkeypatch
):
    _refused(tmp_path, "s3://no-such-bucket/x", "bucket 'no-such-bucket' does not exist")
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_free_port()}")
    _refused(tmp_path, f"s3://{bucket}/x", "cannot reach the object store")
    _refused(tmp_path, "ftp://host/x", "unknown scheme")
    assert not (tmp_path / "runs").exists()  # no database, no CSV, no folder
    assert not (tmp_path / "cache").exists()  # and no cache: the corpus is read after the checks


def test_credentials_the_store_refuses_are_one_line_and_the_database_is_untouched(aws, tmp_path, monkeypatch):
    """moto with its credential checks on (after the set-up's first actions): a user whose key
    may write, and a secret that does not match it."""
    with s3_server(INITIAL_NO_AUTH_ACTION_COUNT="4") as url:
        import boto3

        iam = boto3.client(
            "iam", endpoint_url=url, region_name=REGION, aws_access_key_id="a", aws_secret_access_key="b"
        )
        iam.create_user(UserName="study")
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        iam.put_user_policy(UserName="study", PolicyName="all", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName="study")["AccessKey"]
        s3_client(url, key["AccessKeyId"], key["SecretAccessKey"]).create_bucket(Bucket="guarded")
        database = tmp_path / "runs" / "smoke.db"
        database.parent.mkdir()
        optuna.create_study(study_name="smoke", storage=f"sqlite:///{database}", directions=["minimize"] * 2)
        before = database.read_bytes()
        monkeypatch.setenv("AWS_ENDPOINT_URL", url)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"] + "x")
        _refused(tmp_path, "s3://guarded/x", "the credentials were refused")
        assert database.read_bytes() == before
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])
        from orchestrator.artifacts import check_root

        check_root("s3://guarded/x")  # the right secret passes the same check
        listed = s3_client(url, key["AccessKeyId"], key["SecretAccessKey"]).list_objects_v2(Bucket="guarded")
        assert not [o for o in listed.get("Contents", []) if "probe" in o["Key"]]  # its probe is gone


def test_a_retry_resumes_from_the_after_pruning_checkpoint_on_the_store(
    aws, bucket, tmp_path, small_text, monkeypatch
):
    """A first try's after-pruning checkpoint, uploaded as its worker does (``on_checkpoint``),
    is what a retry on another node (an empty cache) continues from; a location with none
    resumes nothing."""
    from helpers import tiny_trial_setup

    from orchestrator.execution import _resumable
    from trainers.hparams import TrialHParams
    from trainers.trial import AFTER_PRUNE, TrialIO, run_trial

    setup = tiny_trial_setup(tmp_path, small_text, prune_steps=2, finetune_steps=2, n_head=4)
    hp = TrialHParams(method="importance", sparsity=0.5)
    location = f"s3://{bucket}/trials/s/7"
    uploaded = []

    def upload(folder: Path) -> None:
        publish(folder, join(location, folder.name))
        uploaded.append(folder.name)

    first = run_trial(setup, hp, TrialIO(save_dir=tmp_path / "first-node", on_checkpoint=upload))
    assert uploaded == [AFTER_PRUNE]
    monkeypatch.setenv("HEADPRUNE_CACHE", str(tmp_path / "second-node"))  # another node
    folder = _resumable(location)
    assert folder is not None and folder.is_relative_to(tmp_path / "second-node")
    again = run_trial(setup, hp, TrialIO(resume_dirs=[folder]))
    assert "prune_resumed" in again.phase_seconds and again.kept_heads == first.kept_heads
    assert again.val_perplexity == pytest.approx(first.val_perplexity, rel=1e-6)
    assert _resumable(f"s3://{bucket}/trials/s/8") is None


def test_a_store_that_does_not_answer_is_a_transient_failure_not_a_corrupt_model(aws, monkeypatch):
    """A worker that cannot reach the store raises what Tune retries (``TransientTrialError``);
    a model that is not there, or not whole, is a deterministic ``CorruptModel``."""
    from orchestrator.execution import _reaching_store, _resumable
    from trainers.trial import TRANSIENT_ERRORS

    with pytest.raises(CorruptModel):
        fetch("s3://no-such-bucket/trials/s/1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_free_port()}")
    with pytest.raises(OSError, match="cannot reach the object store") as err:
        fetch("s3://bucket/trials/s/1", "0" * 64)
    assert not isinstance(err.value, CorruptModel)
    with pytest.raises(TRANSIENT_ERRORS), _reaching_store():
        _resumable("s3://bucket/trials/s/1")
