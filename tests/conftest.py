"""Shared fixtures: tiny models and corpora that make every test run in seconds."""

from __future__ import annotations

import os

# One thread per process, set before torch is imported, here and in every process a test starts
# (the CLI, Ray's workers inherit it): two test processes run side by side (pytest-xdist), and
# torch's default of a thread per core, twice over, made each of them many times slower (its
# threads spin waiting for each other on the shared cores).
os.environ["OMP_NUM_THREADS"] = "1"

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import CORPUS  # noqa: E402


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The end-to-end studies (marked slow) first: run by two processes (pytest-xdist), the suite
    then ends with short tests filling the gaps rather than one long study running alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture
def small_text(tmp_path: Path) -> Path:
    """The first 20k characters of the shipped corpus."""
    path = tmp_path / "small.txt"
    path.write_text(CORPUS.read_text(encoding="utf-8")[:20000], encoding="utf-8")
    return path
