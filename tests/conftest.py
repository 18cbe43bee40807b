"""Shared fixtures: tiny models and corpora that make every test run in seconds."""

from __future__ import annotations

import os

# One thread per process, set before torch is imported, here and in every process a test starts
# (the CLI inherits it; a Ray worker takes its trial's cpus_per_trial, 1 in the tests' studies):
# two test processes run side by side (pytest-xdist), and torch's default of a thread per core,
# twice over, made each of them many times slower (its threads spin waiting for each other on the
# shared cores).
os.environ["OMP_NUM_THREADS"] = "1"

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import CORPUS, OWN_SESSIONS  # noqa: E402

# The fast lane (`make test-fast`): no Ray, no database server, no process started, no training
# longer than a second. It deselects the tests marked slow or server, and with this variable set
# the guard below fails any test that still reaches for one of those: a marker cannot go missing.
FAST_LANE_ENV = "HEADPRUNE_FAST_LANE"
SERVER_KINDS = frozenset({"postgresql", "mysql"})  # a storage test's backend parameter (helpers.SERVERS)
SERVER_FIXTURES = frozenset({"endpoint"})  # tests/test_object_store.py: a moto S3 server


def _needs_server(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    params = callspec.params.values() if callspec else ()
    return any(isinstance(p, str) and p in SERVER_KINDS for p in params) or bool(
        SERVER_FIXTURES & set(getattr(item, "fixturenames", ()))
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests on a database server or an object store are marked ``server``. The end-to-end
    studies (marked slow) first: run by two processes (pytest-xdist), the suite then ends with
    short tests filling the gaps rather than one long study running alone."""
    for item in items:
        if _needs_server(item):
            item.add_marker(pytest.mark.server)
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


# What the fast lane may not start: an interpreter (the CLI, a moto server), Ray, Docker.
HEAVY_PROGRAMS = ("python", "launch-study", "ray", "moto_server", "docker")


@pytest.fixture(autouse=True)
def _fast_lane_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    """In the fast lane, starting Ray or one of ``HEAVY_PROGRAMS``, or opening a database on one
    of the test servers' ports, fails the test with what to mark it."""
    if os.environ.get(FAST_LANE_ENV) != "1":
        return
    import subprocess

    import ray
    import sqlalchemy
    from helpers import SERVERS

    def refuse(what: str) -> None:
        pytest.fail(f"the fast lane has no {what}: mark this test slow (or server)", pytrace=False)

    monkeypatch.setattr(ray, "init", lambda *args, **kwargs: refuse("Ray"))
    popen = subprocess.Popen.__init__

    def light_processes_only(self, args, *rest, **kwargs):
        program = Path(str(args if isinstance(args, str | Path) else args[0])).name
        if program.startswith(HEAVY_PROGRAMS):
            refuse(f"{program} process")
        popen(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", light_processes_only)
    server_ports = {sqlalchemy.make_url(url).port for url, _ in SERVERS.values()}
    for module in (sqlalchemy, sqlalchemy.engine):

        def no_server(url, *args, _create=module.create_engine, **kwargs):
            if sqlalchemy.make_url(str(url)).port in server_ports:
                refuse("database server")
            return _create(url, *args, **kwargs)

        monkeypatch.setattr(module, "create_engine", no_server)


@pytest.fixture
def small_text(tmp_path: Path) -> Path:
    """The first 20k characters of the shipped corpus."""
    path = tmp_path / "small.txt"
    path.write_text(CORPUS.read_text(encoding="utf-8")[:20000], encoding="utf-8")
    return path


@pytest.fixture(autouse=True)
def _own_sessions_of_this_test() -> None:
    """A test counts the Ray processes of the sessions it started (helpers.OWN_SESSIONS), not
    those of earlier tests: once a session has no process left, the system may give its number to
    a process of the other test process, whose Ray processes would then look like ours."""
    OWN_SESSIONS.clear()


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
