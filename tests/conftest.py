"""Shared fixtures: tiny models and corpora that make every test run in seconds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import CORPUS


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture
def small_text(tmp_path: Path) -> Path:
    """The first 20k characters of the shipped corpus."""
    path = tmp_path / "small.txt"
    path.write_text(CORPUS.read_text(encoding="utf-8")[:20000], encoding="utf-8")
    return path
