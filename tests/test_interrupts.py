"""SIGTERM after Ray has shut down is still the run's own: ``ray.shutdown`` puts the signal back
to the system's default beneath Python's handler, and a SIGTERM then (the front refreshed, the
CSV written, the lease released) killed the driver without a word and left its lease held."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import REPO, leftover_ray_processes, ray_processes

AFTER_SHUTDOWN = """
import os, signal, time, types
from orchestrator.interrupts import Interrupted, raise_on_sigterm
from orchestrator.runner import ray_session

raise_on_sigterm()
with ray_session(types.SimpleNamespace(ray_address=None, max_concurrent=1), 1):
    pass
try:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(10)
except Interrupted as stop:
    print("wound down:", stop.exit_code)
"""


@pytest.mark.slow
def test_sigterm_after_ray_shut_down_raises_interrupted():
    before = ray_processes()
    run = subprocess.run(
        [sys.executable, "-c", AFTER_SHUTDOWN], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])  # -15: killed by the signal
    assert "wound down: 143" in run.stdout
    assert not leftover_ray_processes(before)
