"""The real ``launch-study`` on the smoke study: database, frontier table, CSV, reuse, processes."""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import re
import socket
import struct
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from wsgiref.util import setup_testing_defaults

import optuna
import optuna_dashboard
import pandas as pd
import pytest
from helpers import (
    CORPUS,
    LAUNCH_STUDY,
    SMOKE,
    cli_in_process,
    expected_front,
    free_port,
    frontier_triples,
    heads,
    hparams,
    launch,
    leftover_ray_processes,
    ray_processes,
)

from orchestrator.storage import models_folder, open_store, read_frontier
from trainers.data import Corpus, eval_windows
from trainers.export import generate, load_model
from trainers.gates import heads_to_keep
from trainers.hparams import TrialHParams
from trainers.training import mean_loss

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """The smoke study run twice: once to 3 trials, then resumed to 4 with the same command."""
    work = tmp_path_factory.mktemp("smoke")
    before = ray_processes()
    first = launch("run", str(SMOKE), cwd=work)
    second = launch("run", str(SMOKE), "--n-trials", "4", cwd=work)
    leftover = leftover_ray_processes(before)
    store = open_store(f"sqlite:///{work}/runs/smoke.db")
    study = optuna.load_study(study_name="smoke", storage=store.storage)
    vocab = Corpus.load(CORPUS, block_size=32).vocab_size
    return {
        "work": work,
        "vocab_size": vocab,
        "first": first,
        "second": second,
        "store": store,
        "study": study,
        "leftover": leftover,
    }


def test_both_runs_succeed(smoke):
    for run in (smoke["first"], smoke["second"]):
        assert run.returncode == 0, run.stderr[-3000:]


def test_study_holds_the_asked_complete_trials_with_both_values(smoke):
    trials = smoke["study"].get_trials()
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(complete) == 4
    assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    for t in complete:
        assert len(t.values) == 2 and all(math.isfinite(v) for v in t.values)
    assert smoke["study"].metric_names == ["val_perplexity", "n_params"]


def test_frontier_table_equals_front_recomputed_from_optuna(smoke):
    rows = read_frontier(smoke["store"], "smoke")
    assert rows and frontier_triples(rows) == expected_front(smoke["study"])


def test_csv_equals_the_frontier_table(smoke):
    csv = pd.read_csv(smoke["work"] / "runs" / "smoke_pareto.csv")
    rows = read_frontier(smoke["store"], "smoke")
    assert list(csv["trial_number"]) == [r["trial_number"] for r in rows]
    assert list(csv["val_perplexity"]) == pytest.approx([r["val_perplexity"] for r in rows], rel=1e-12)
    assert list(csv["n_params"]) == [r["n_params"] for r in rows]
    assert list(csv["heads_per_layer"]) == [r["heads_per_layer"] for r in rows]
    assert list(csv["n_params"]) == sorted(csv["n_params"])
    for column in ("n_params_nonembed", "sparsity", "method", "params_sparsity", "params_lr"):
        assert column in csv.columns


def test_first_trial_is_the_dense_control(smoke):
    first = smoke["study"].get_trials()[0]
    assert first.user_attrs["dense_control"] is True
    assert hparams(first)["sparsity"] == 0.0
    assert heads(first) == [4, 4]


def test_dense_control_samples_nothing(smoke):
    """smoke.toml searches lr: the control takes the trainer's default whatever the sampler
    would draw, and the sampler records no parameter for it."""
    first = smoke["study"].get_trials()[0]
    assert first.params == {}
    assert hparams(first)["lr"] == TrialHParams().lr
    assert hparams(first)["method"] == "dense"
    assert "searched" in first.user_attrs["control_hparams"]


def test_start_up_trials_spread_the_sparsity_range_from_its_high_end(smoke):
    # smoke.toml: sparsity in [0.25, 0.75], 3 trials -> 2 start-up trials after the dense control
    trials = smoke["study"].get_trials()
    assert [hparams(t)["sparsity"] for t in trials[1:3]] == [0.75, 0.5]
    assert [t.params["sparsity"] for t in trials[1:3]] == [0.75, 0.5]  # recorded for the sampler


def test_a_longer_start_up_gives_each_trial_a_head_count_of_its_own(tmp_path):
    """Through launch-study, so through the runner's sized search space: the smoke study's 8
    heads over [0.25, 0.75] hold 5 sizes (2 to 6 kept, half rounded to even), which the plain
    spread's first 5 values do not reach (its 5th, 0.6875, keeps 2 again)."""
    before = ray_processes()
    run = launch("run", str(SMOKE), "--n-trials", "6", "--set", "study.startup_trials=5", cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert not leftover_ray_processes(before)
    study = optuna.load_study(study_name="smoke", storage=f"sqlite:///{tmp_path}/runs/smoke.db")
    start_up = study.get_trials()[1:6]
    assert [sum(heads(t)) for t in start_up] == [2, 4, 3, 5, 6]


def test_achieved_sparsity_is_the_target_to_the_nearest_head(smoke):
    for t in smoke["study"].get_trials(states=(optuna.trial.TrialState.COMPLETE,)):
        target = hparams(t)["sparsity"]
        assert sum(heads(t)) == heads_to_keep(8, target)
        assert t.user_attrs["sparsity"] == pytest.approx(1 - sum(heads(t)) / 8)


def test_stored_parameter_count_is_the_saved_models(smoke):
    """The objective is what the trial's own saved model holds (tied weights once)."""
    for t in smoke["study"].get_trials(states=(optuna.trial.TrialState.COMPLETE,)):
        model, _ = load_model(t.user_attrs["model_dir"])
        unique = {p.data_ptr(): p.numel() for p in model.parameters()}
        embeddings = model.tok_emb.weight.numel() + model.pos_emb.weight.numel()
        assert sum(unique.values()) == t.values[1]
        assert sum(unique.values()) - embeddings == t.user_attrs["n_params_nonembed"]
        assert model.cfg.layer_heads == tuple(heads(t))


def test_trial_models_stay_in_the_studys_own_folder_across_a_resume(smoke):
    folder = (smoke["work"] / "runs" / "artifacts" / "trials" / models_folder(smoke["study"])).resolve()
    complete = smoke["study"].get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    saved = [(smoke["work"] / t.user_attrs["model_dir"]).resolve() for t in complete]
    assert folder.name.startswith("smoke-") and len(saved) == 4  # 3 from the first run, 1 resumed
    assert all(path.parent == folder and (path / "model.safetensors").is_file() for path in saved)


def test_second_run_reuses_the_dense_checkpoint(smoke):
    assert "pretrained in" in smoke["first"].stderr
    assert "reused" in smoke["second"].stderr
    assert "pretrain: step" not in smoke["second"].stderr
    assert len(list((smoke["work"] / "runs" / "artifacts" / "dense").iterdir())) == 1


def test_a_finished_study_run_again_does_no_work(smoke):
    third = launch("run", str(SMOKE), "--n-trials", "4", cwd=smoke["work"])
    assert third.returncode == 0
    assert "already holds 4 finished trials" in third.stderr
    assert len(smoke["study"].get_trials()) == 4


def test_export_command_writes_the_same_csv(smoke, tmp_path):
    out = tmp_path / "front.csv"
    url = f"sqlite:///{smoke['work']}/runs/smoke.db"
    run = launch("export", "--storage", url, "--study-name", "smoke", "--output", str(out), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert pd.read_csv(out).equals(pd.read_csv(smoke["work"] / "runs" / "smoke_pareto.csv"))
    everything = launch("export", "--storage", url, "--study-name", "smoke", "--all", cwd=tmp_path)
    assert everything.returncode == 0
    assert len(everything.stdout.strip().splitlines()) == 1 + 4


def test_no_ray_process_is_left_behind(smoke):
    assert smoke["leftover"] == {}


# --- Looking at the finished study -----------------------------------------------------------


def smoke_url(smoke) -> str:
    return f"sqlite:///{smoke['work']}/runs/smoke.db"


def on_smoke(smoke, command: str, *args: str, cwd):
    """``launch-study COMMAND --storage <smoke db> --study-name smoke ARGS``, in this process (the
    console script itself runs in the tests above and in test_cli_errors)."""
    return cli_in_process(command, "--storage", smoke_url(smoke), "--study-name", "smoke", *args, cwd=cwd)


def test_json_export_equals_the_frontier_table(smoke, tmp_path):
    out = tmp_path / "front.json"
    run = on_smoke(
        smoke,
        "export",
        "--format",
        "json",
        "--output",
        str(out),
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    records = json.loads(out.read_text())
    rows = read_frontier(smoke["store"], "smoke")
    assert [(r["trial_number"], r["val_perplexity"], r["n_params"]) for r in records] == [
        (r["trial_number"], r["val_perplexity"], r["n_params"]) for r in rows
    ]


def test_export_with_a_plot_keeps_stdout_data_only(smoke, tmp_path):
    """The plot's paths go to stderr: stdout parses as CSV, and as JSON with --format json;
    heads_per_layer is a list in JSON; --output x.json means JSON."""
    plot = str(tmp_path / "front.png")
    as_csv = on_smoke(smoke, "export", "--plot", plot, cwd=tmp_path)
    assert as_csv.returncode == 0, as_csv.stderr
    frame = pd.read_csv(__import__("io").StringIO(as_csv.stdout))
    assert frame["trial_number"].dtype.kind == "i"
    assert plot in as_csv.stderr and plot not in as_csv.stdout
    as_json = on_smoke(smoke, "export", "--plot", plot, "--format", "json", cwd=tmp_path)
    records = json.loads(as_json.stdout)
    assert [r["trial_number"] for r in records] == frame["trial_number"].tolist()
    assert all(isinstance(r["heads_per_layer"], list) for r in records)
    by_suffix = on_smoke(smoke, "export", "--output", str(tmp_path / "f.json"), cwd=tmp_path)
    assert by_suffix.returncode == 0 and json.loads((tmp_path / "f.json").read_text()) == records


def test_plot_writes_two_valid_pngs(smoke, tmp_path):
    out = tmp_path / "front.png"
    run = on_smoke(
        smoke,
        "export",
        "--plot",
        str(out),
        "--output",
        str(tmp_path / "f.csv"),
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    for path in (out, tmp_path / "front_heads.png"):
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = struct.unpack(">II", data[16:24])
        assert width >= 300 and height >= 200 and len(data) > 5000


def test_status_reports_states_front_and_hypervolume(smoke, tmp_path):
    run = on_smoke(smoke, "status", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    front = len(read_frontier(smoke["store"], "smoke"))
    assert "complete 4" in run.stdout
    assert f"front: {front} trials" in run.stdout
    assert "hypervolume" in run.stdout and "dense control" in run.stdout
    # Bits per byte beside perplexity, for the dense checkpoint and each band's best trial.
    best = [line for line in run.stdout.splitlines() if line.strip().startswith("best at sparsity")]
    assert best and all("bits/byte" in line for line in best)
    assert re.search(r"dense checkpoint: perplexity [\d.]+, [\d.]+ bits/byte", run.stdout)


def test_exported_model_reloads_with_the_recorded_perplexity(smoke, tmp_path):
    trial = max(
        smoke["study"].get_trials(states=(optuna.trial.TrialState.COMPLETE,)),
        key=lambda t: t.user_attrs["sparsity"],
    )
    out = tmp_path / "model"
    run = on_smoke(
        smoke,
        "export-model",
        "--trial",
        str(trial.number),
        "--output",
        str(out),
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    model, tokenizer = load_model(out)
    corpus = Corpus.load(CORPUS, block_size=32)
    assert tokenizer.vocab == corpus.tokenizer.vocab
    ppl = math.exp(mean_loss(model, eval_windows(corpus.val, 32, 2048)))
    assert ppl == pytest.approx(trial.values[0], rel=1e-5)
    assert model.cfg.layer_heads == tuple(heads(trial))
    assert len(generate(model, tokenizer, "ROMEO:", 20)) == len("ROMEO:") + 20


def test_export_model_refuses_to_overwrite_unless_forced(smoke, tmp_path):
    trial = smoke["study"].get_trials(states=(optuna.trial.TrialState.COMPLETE,))[-1]
    out = tmp_path / "model"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    args = ("export-model", "--trial", str(trial.number), "--output")
    refused = on_smoke(smoke, *args, str(out), cwd=tmp_path)
    assert refused.returncode == 2 and "not empty; --force replaces it" in refused.stderr
    assert (out / "mine.txt").read_text() == "keep me"
    forced = on_smoke(smoke, *args, str(out), "--force", cwd=tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert not (out / "mine.txt").exists() and (out / "model.safetensors").is_file()
    source = trial.user_attrs["model_dir"]
    onto_source = on_smoke(smoke, *args, source, "--force", cwd=tmp_path)
    assert onto_source.returncode == 2 and "the trial's own folder" in onto_source.stderr
    assert (Path(source) / "model.safetensors").is_file()
    (tmp_path / "file").write_text("x")
    onto_file = on_smoke(smoke, *args, str(tmp_path / "file"), cwd=tmp_path)
    assert onto_file.returncode == 2 and "is a file" in onto_file.stderr


def test_export_of_a_study_without_complete_trials_is_a_user_error(tmp_path):
    url = f"sqlite:///{tmp_path}/e.db"
    optuna.create_study(study_name="empty", storage=url, directions=["minimize", "minimize"])
    run = launch("export", "--storage", url, "--study-name", "empty", cwd=tmp_path)
    assert run.returncode == 2 and "has no complete trial" in run.stderr


def test_dashboard_serves_the_study_in_process(smoke):
    app = optuna_dashboard.wsgi(smoke["store"].storage)

    def get(path: str) -> dict:
        environ: dict = {}
        setup_testing_defaults(environ)
        environ["PATH_INFO"] = path
        status = {}
        body = b"".join(app(environ, lambda s, h, exc=None: status.setdefault("s", s)))
        assert status["s"].startswith("200"), body[:300]
        return json.loads(body)

    summaries = get("/api/studies")["study_summaries"]
    study_id = next(s["study_id"] for s in summaries if s["study_name"] == "smoke")
    detail = get(f"/api/studies/{study_id}")
    assert detail["objective_names"] == ["val_perplexity", "n_params"]
    assert len(detail["trials"]) == 4
    keys = {a["key"] for a in detail["trials"][1]["user_attrs"]}
    assert {
        "heads_per_layer",
        "sparsity",
        "method",
        "n_params_nonembed",
        "phase_seconds",
        "tokens_per_s",
    } <= keys
    assert "Pareto front" in detail["note"]["body"]
    assert (
        "Dense control: trial 0" in detail["note"]["body"] and "**dense control**" in detail["note"]["body"]
    )
    study_attrs = {a["key"] for a in summaries[0]["user_attrs"]}
    assert {"config", "dense_val_perplexity", "versions"} <= study_attrs


def test_optunas_own_plots_draw_the_study(smoke):
    """optuna.visualization needs plotly, a dependency of ours for that reason."""
    figure = optuna.visualization.plot_pareto_front(smoke["study"], target_names=["val perplexity", "params"])
    complete = smoke["study"].get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert sum(len(trace.x) for trace in figure.data) == len(complete)


def test_optuna_cli_reads_the_same_study(smoke):
    optuna_cli = LAUNCH_STUDY.parent / "optuna"
    run = subprocess.run(
        [str(optuna_cli), "trials", "--study-name", "smoke", "--storage", smoke_url(smoke), "-f", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert len(json.loads(run.stdout)) == 4


def test_dashboard_command_serves_the_study_on_localhost_and_stops(smoke, tmp_path):
    """Stopped with SIGTERM while pages poll it and a client holds a connection without a
    request: on one thread, a signal that came during a request was swallowed by wsgiref's
    error handling and the dashboard ran on (8 of 8 tries)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/api/studies"
    server = subprocess.Popen(
        [str(LAUNCH_STUDY), "dashboard", "--storage", smoke_url(smoke), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    polling, answered = threading.Event(), []

    def poll() -> None:  # as the dashboard's page does, only faster
        while polling.is_set():
            with (
                contextlib.suppress(OSError, http.client.HTTPException),
                urllib.request.urlopen(url, timeout=2) as response,
            ):
                answered.append(response.status)

    pollers = [threading.Thread(target=poll) for _ in range(3)]
    idle = None
    try:
        deadline, body = time.time() + 60, None
        while body is None and time.time() < deadline:
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    body = json.loads(response.read())
            except OSError:
                time.sleep(0.3)
        assert body is not None, "the dashboard did not answer"
        assert [s["study_name"] for s in body["study_summaries"]] == ["smoke"]
        idle = socket.create_connection(("127.0.0.1", port))  # connected, never asks
        polling.set()
        for poller in pollers:
            poller.start()
        deadline = time.time() + 30
        while len(answered) < 10 and time.time() < deadline:
            time.sleep(0.1)
        assert len(answered) >= 10 and set(answered) == {200}
    finally:
        server.terminate()
        try:
            code = server.wait(timeout=30)
        finally:
            polling.clear()
            for poller in pollers:
                if poller.is_alive():
                    poller.join()
            if idle is not None:
                idle.close()
            if server.poll() is None:
                server.kill()
                server.wait()
    stderr = server.stderr.read()
    assert code == 143 and "Traceback" not in stderr, stderr  # SIGTERM: a clean exit, the port free again
    with socket.socket() as s, pytest.raises(OSError):
        s.connect(("127.0.0.1", port))
