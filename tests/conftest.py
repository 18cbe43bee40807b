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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The end-to-end studies (marked slow) first: run by two processes (pytest-xdist), the suite
    then ends with short tests filling the gaps rather than one long study running alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def _own_sessions_of_this_test() -> None:
    """A test counts the Ray processes of the sessions it started (helpers.OWN_SESSIONS), not
    those of earlier tests: once a session has no process left, the system may give its number to
    a process of the other test process, whose Ray processes would then look like ours."""
    OWN_SESSIONS.clear()


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture
def small_text(tmp_path: Path) -> Path:
    """The first 20k characters of the shipped corpus."""
    path = tmp_path / "small.txt"
    path.write_text(CORPUS.read_text(encoding="utf-8")[:20000], encoding="utf-8")
    return path
