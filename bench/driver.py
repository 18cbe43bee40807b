"""Does the driver keep up with a large study? The real driver on a simulated cluster.

    python -m bench.driver              # PostgreSQL to 10,000 trials, SQLite beside it to 1,000
    python -m bench.driver --quick      # a few hundred trials on SQLite (what the tests run)
    python -m bench.driver --calibrate  # the simulator against Ray Tune at 100 and 1,000 trials

256 trials in flight on ``simulation.SimulatedExecutor``: no training and no Ray, the real
driver, study, sampler (TPE, the default study's), early stopping, warm starts, frontier table
and lease, on a real database. Trials are drawn from measured ones (``MeasuredTrials``); the
study asks 512 trials past the last size, so the sampler still asks when it is measured. At
100, 1,000 and 10,000 finished trials it reports, over the window of trials that finished just
before: finished trials per second of wall time; CPU milliseconds per finished trial of the
driver's process (all threads) plus the database server's, split into the sampler's ask, rung
decisions and bookkeeping (``driver_ms_per_trial`` is the last two); database statements per
trial; how many trials started the same (method, size) as one already running, or identical
to one (with 256 in flight, is TPE's ``constant_liar`` needed?). At the end the frontier table
must equal the front recomputed from every trial (``front_ok``). Progress lines go to stderr.

``--calibrate`` runs the same study on Ray Tune (``runner.TuneExecutor`` with trials that train
nothing, ``simulation.replay_on_worker``, 16 in flight on 2 CPUs) and on the simulator: what
Tune's controller costs the driver's process, which the simulator does not see.

Targets (issue 45): at 10,000 trials on PostgreSQL, >= 10 finished trials per second with the
ask included; driver ms per trial (ask excluded) <= 20 and <= 1.5x its value at 100.
The last line is one JSON object (``bench.common.print_json``).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import sqlalchemy as sa

from bench.common import print_json, print_table
from orchestrator.config import load_study_config
from orchestrator.execution import DriverTimings, Measurement
from orchestrator.runner import TuneExecutor, make_scheduler, open_driver, rung_context
from orchestrator.session import RunOptions
from orchestrator.simulation import MeasuredTrials, SimulatedExecutor, replay_on_worker
from orchestrator.storage import close_store, front_rows, hold_lease, open_store, read_frontier

REPO = Path(__file__).resolve().parents[1]
STUDY = REPO / "studies" / "tinyshakespeare.toml"
MEASURED = "bench/results/frontier_full400*_seed*.json"  # the 3-seed comparisons' trials
POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:5432/"
LAYER_HEADS = [8, 8, 8, 8]


def measured_trials(pattern: str = MEASURED) -> MeasuredTrials:
    """The trial model of the default study, from the 3-seed comparisons' trials."""
    points, seconds = [], []
    for path in sorted(glob.glob(str(REPO / pattern))):
        for seed in json.loads(Path(path).read_text())["seeds"]:
            for trials in seed["arms"].values():
                for t in trials:
                    if t.get("ppl") and t.get("seconds") and t.get("sparsity") is not None:
                        points.append((t["sparsity"], t["ppl"], t["params"]))
                        seconds.append(t["seconds"])
    if not points:
        raise SystemExit(f"no measured trials under {pattern}")
    return MeasuredTrials(points, seconds, LAYER_HEADS)


class ServerCPU:
    """CPU seconds of the PostgreSQL server's processes (from /proc): the database's share of
    the driver's cost (nothing else on this machine uses the server meanwhile). The processes
    are found again at most every ``rescan_seconds`` (a connection the pool opens is a new one):
    reading them at each of the driver's sections must cost little beside what it measures."""

    def __init__(self, rescan_seconds: float = 2.0) -> None:
        self.rescan_seconds, self.scanned_at, self.pids = rescan_seconds, -float("inf"), []
        self.gone = 0.0  # CPU of processes seen once and gone since: kept in the total
        self.last: dict[str, float] = {}
        self.tick = os.sysconf("SC_CLK_TCK")

    def _read(self, pid: str) -> float | None:
        try:
            text = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        fields = text[text.rindex(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / self.tick  # utime, stime

    def __call__(self) -> float:
        now = time.monotonic()
        if now - self.scanned_at > self.rescan_seconds:
            self.scanned_at = now
            self.pids = []
            for stat in glob.glob("/proc/[0-9]*/comm"):
                with contextlib.suppress(OSError):
                    if Path(stat).read_text().startswith("postgres"):
                        self.pids.append(stat.split("/")[2])
            for pid in set(self.last) - set(self.pids):  # ended between two scans
                self.gone += self.last.pop(pid)
        total = 0.0
        for pid in self.pids:
            seconds = self._read(pid)
            if seconds is None:
                self.gone += self.last.pop(pid, 0.0)
            else:
                self.last[pid] = seconds
                total += seconds
        return total + self.gone


@dataclass
class Window:
    """The trials that finished between two study sizes, and what they cost."""

    size: int
    trials: int = 0
    wall: float = 0.0
    cost: dict[str, float] = field(default_factory=dict)
    statements: int = 0


class Probe:
    """What the driver spends, read at each study size: CPU of this process plus the database
    server's (``cpu``, the clock ``DriverTimings`` measures sections with), wall time, and the
    statements sent on the database's engines."""

    def __init__(self, engines: list[sa.Engine], server: bool) -> None:
        self.server = ServerCPU() if server else None
        self.statements = 0
        for engine in engines:
            sa.event.listen(engine, "before_cursor_execute", self._count)

    def _count(self, *args) -> None:
        self.statements += 1

    def cpu(self) -> float:
        return time.process_time() + (self.server() if self.server else 0.0)


def _run(url: str, sizes: list[int], in_flight: int, seed: int, on_tune: bool = False) -> dict:
    """One study to ``sizes[-1]`` finished trials on ``url``, simulated (or, ``on_tune``, on
    Ray Tune with trials that train nothing, ``simulation.replay_on_worker``); a window per
    size."""
    cfg = load_study_config(STUDY, [f"study.cpus_per_trial={2 / in_flight}"] if on_tune else [])
    with tempfile.TemporaryDirectory() as scratch:
        opts = RunOptions.for_study(
            cfg,
            storage=url,
            study_name="driver-bench",
            n_trials=sizes[-1] + 2 * in_flight,  # still asking when the last window closes
            max_concurrent=in_flight,
            artifacts="s3://simulated/bench",  # nothing is stored: warm starts choose from the database
            output=Path(scratch) / "front.csv",
        )
        store = open_store(url)
        probe = Probe([store.engine], server=url.startswith("postgresql"))
        with hold_lease(store, opts.study_name, cfg.study.lease_seconds) as lease:
            # no model to attach to the dashboard; the driver timed on the CPU of both processes
            driver = open_driver(
                cfg,
                opts,
                store,
                lease,
                LAYER_HEADS,
                attach_models=False,
                timings=DriverTimings(clock=probe.cpu),
            )
            rungs = tuple(cfg.early_stopping.rungs())
            driver.measure_under(Measurement(rung_context=rung_context(None, rungs, 0)))
            scheduler = make_scheduler(cfg, driver.study, len(rungs), driver.measurement.rung_context)
            trial_model = measured_trials()
            if on_tune:
                executor = TuneExecutor(
                    cfg, opts, partial(replay_on_worker, trial_model=trial_model, rungs=rungs)
                )
            else:
                executor = SimulatedExecutor(trial_model, in_flight=in_flight, rungs=rungs, seed=seed)
                executor.timings = driver.timings  # its own work and the rung decisions, apart
            windows = _measure(driver, scheduler, executor, probe, sizes)
            table = sorted(_key(r) for r in read_frontier(store, opts.study_name))
            brute_force = sorted(_key(r) for r in front_rows(driver.study))  # from every COMPLETE trial
            trials = driver.study.get_trials(deepcopy=False)
        close_store(store)
    finished = [t for t in trials if t.state.is_finished() and t.state.name != "FAIL"]
    stats = getattr(executor, "stats", None)
    return {
        "windows": windows,
        "front_ok": bool(table) and table == brute_force,
        "finished": len(finished),
        # every trial the driver started was told: none left RUNNING or WAITING
        "none_left_running": not any(t.state.name in ("RUNNING", "WAITING") for t in trials),
        "stopped_at_rung": sum(t.state.name == "PRUNED" for t in trials),
        "warm_started": sum("warm_start_from" in t.user_attrs for t in trials),
        **(
            {
                "same_as_running": stats.same_as_running,
                "identical_to_running": stats.identical_to_running,
                "started": stats.started,
                "most_in_flight": stats.most_in_flight,
            }
            if stats
            else {}
        ),
    }


def _key(row: dict) -> tuple:
    return (row["trial_number"], row["val_perplexity"], row["n_params"])


def _measure(driver, scheduler, executor, probe: Probe, sizes: list[int]) -> list[Window]:
    """Runs the simulation, reading the probe as the study passes each size: the window of a
    size is the trials from 90% of it to it (the first: from 50%)."""
    marks = sorted({int(s * (0.5 if i == 0 else 0.9)) for i, s in enumerate(sizes)} | set(sizes))
    readings: dict[int, tuple[float, float, dict[str, float], int]] = {}

    def on_finished(trial, pushed_off) -> None:
        if driver.n_finished in marks and driver.n_finished not in readings:
            seconds = dict(driver.timings.seconds)
            readings[driver.n_finished] = (time.perf_counter(), probe.cpu(), seconds, probe.statements)

    driver.also_on_finished(on_finished)
    executor.run(driver, scheduler)  # on Tune, its controller and the rung decisions are in "total"
    windows = []
    for i, size in enumerate(sizes):
        start = int(size * (0.5 if i == 0 else 0.9))
        if size not in readings or start not in readings:
            continue
        (w0, c0, s0, n0), (w1, c1, s1, n1) = readings[start], readings[size]
        cost = {k: s1.get(k, 0.0) - s0.get(k, 0.0) for k in s1}
        cost["total"] = c1 - c0
        windows.append(Window(size, size - start, w1 - w0, cost, n1 - n0))
    return windows


def summary(windows: list[Window]) -> dict[str, dict]:
    """Per study size: the figures the JSON line and the table show."""
    out = {}
    for w in windows:
        ask, rung, simulator = (w.cost.get(k, 0.0) for k in ("ask", "rung decisions", "simulator"))
        driver = w.cost["total"] - ask - simulator
        out[str(w.size)] = {
            "trials_per_s": round(w.trials / w.wall, 2),
            "driver_ms_per_trial": round(1000 * driver / w.trials, 2),
            "ask_ms": round(1000 * ask / w.trials, 2),
            "rung_ms": round(1000 * rung / w.trials, 2),
            "bookkeeping_ms": round(1000 * (driver - rung) / w.trials, 2),
            "statements_per_trial": round(w.statements / w.trials, 1),
        }
    return out


@contextlib.contextmanager
def postgres_database() -> Iterator[str]:
    """A database of its own on the PostgreSQL server, dropped after."""
    name = f"headprune_driver_bench_{os.getpid()}"
    admin = sa.create_engine(POSTGRES + "postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}")
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    try:
        yield POSTGRES + name
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.dispose()


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m bench.driver", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few hundred trials on SQLite (the tests)")
    parser.add_argument("--in-flight", type=int, default=256)
    parser.add_argument("--sizes", type=int, nargs="+", help="study sizes (default 100 1000 10000)")
    parser.add_argument("--sqlite-sizes", type=int, nargs="*", help="SQLite's (default 100 1000)")
    parser.add_argument(
        "--calibrate",
        action="store_true",
        help="the simulator against Ray Tune running trials that train nothing (SQLite, 16 in flight)",
    )
    args = parser.parse_args(argv)
    sizes = args.sizes or ([50, 200] if args.quick else [100, 1000, 10_000])
    sqlite_sizes = args.sqlite_sizes if args.sqlite_sizes is not None else ([] if args.quick else [100, 1000])
    in_flight = 32 if args.quick and args.in_flight == 256 else args.in_flight
    if args.calibrate:
        return calibrate(args.sizes or [100, 1000], 16 if args.in_flight == 256 else args.in_flight)
    runs: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as scratch:
        if not args.quick:
            with postgres_database() as url:
                runs["postgresql"] = _run(url, sizes, in_flight, seed=0)
        for_sqlite = sizes if args.quick else sqlite_sizes
        if for_sqlite:
            runs["sqlite"] = _run(f"sqlite:///{scratch}/bench.db", for_sqlite, in_flight, seed=0)
    payload: dict = {"in_flight": in_flight}
    for backend, run in runs.items():
        figures = summary(run.pop("windows"))
        rows = [[backend, size, *map(str, f.values())] for size, f in figures.items()]
        print_table(
            f"driver on {backend}, {in_flight} in flight",
            [
                "database",
                "trials",
                "trials/s",
                "driver ms",
                "ask ms",
                "rung ms",
                "bookkeeping ms",
                "statements",
            ],
            rows,
        )
        print(f"{backend}: " + ", ".join(f"{k} {v}" for k, v in run.items()))
        payload[backend] = {"sizes": figures, **run}
    main_backend = "postgresql" if "postgresql" in payload else "sqlite"
    payload["front_ok"] = all(payload[b]["front_ok"] for b in runs)
    payload |= payload[main_backend]["sizes"].get(str(sizes[-1]), {})
    print_json("driver", payload)
    return payload


def calibrate(sizes: list[int], in_flight: int) -> dict:
    """The same study on Ray Tune (trials that report at once, ``in_flight`` sharing 2 CPUs)
    and on the simulator: Tune's controller costs the driver's process what the simulator does
    not see. Both on SQLite; the error is Tune's figure over the simulator's, minus 1."""
    runs = {}
    for name, on_tune in (("simulator", False), ("ray_tune", True)):
        with tempfile.TemporaryDirectory() as scratch:
            runs[name] = summary(
                _run(f"sqlite:///{scratch}/c.db", sizes, in_flight, seed=0, on_tune=on_tune)["windows"]
            )
    rows, payload = [], {"in_flight": in_flight, "calibration": runs}
    for size in runs["simulator"]:
        simulated, tune_ = runs["simulator"][size], runs["ray_tune"].get(size)
        if tune_ is None:
            continue
        error = {
            key: round(tune_[key] / simulated[key] - 1, 3)
            for key in ("trials_per_s", "driver_ms_per_trial")
            if simulated[key]
        }
        payload.setdefault("simulator_error", {})[size] = error
        rows.append(
            [size, *(f"{runs[n][size][k]}" for k in ("trials_per_s", "driver_ms_per_trial") for n in runs)]
        )
    print_table(
        f"the simulator against Ray Tune, {in_flight} in flight, SQLite",
        ["trials", "trials/s simulated", "trials/s Tune", "driver ms simulated", "driver ms Tune"],
        rows,
    )
    payload["front_ok"] = True
    print_json("driver", payload)
    return payload


if __name__ == "__main__":
    main()
