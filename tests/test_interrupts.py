"""Signals around Ray. SIGTERM after Ray has shut down is still the run's own (``ray.shutdown``
puts the signal back to the system's default beneath Python's handler, and a SIGTERM then, while
the front was refreshed, the CSV written or the lease released, killed the driver without a word
and left its lease held); a second Ctrl-C that Ray wraps is still an interrupt."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import REPO, leftover_ray_processes, ray_processes

AFTER_SHUTDOWN = """
import os, signal, time, types
from orchestrator.interrupts import Interrupted, raise_on_sigterm
from orchestrator.on_tune import ray_session

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


def test_a_second_ctrl_c_that_ray_wraps_still_exits_130_in_one_line(monkeypatch, capsys):
    """A signal handler that raises while Ray's C extension waits comes back as SystemError
    ("returned a result with an exception set") around the Interrupted: a traceback, exit 1."""
    import signal

    import orchestrator.cli as cli
    from orchestrator.interrupts import Interrupted

    def wrapped(args):
        try:
            raise Interrupted(signal.SIGINT)
        except Interrupted:
            # implicitly chained, as Ray's C extension raises it
            raise SystemError("<cyfunction CoreWorker.wait> returned a result with an exception set")  # noqa: B904

    monkeypatch.setattr(cli, "_status", wrapped)
    assert cli.main(["status", "--study-name", "s"]) == 130
    assert capsys.readouterr().err == "launch-study: interrupted (SIGINT)\n"

    def other(args):
        raise SystemError("not a signal")

    monkeypatch.setattr(cli, "_status", other)
    with pytest.raises(SystemError):
        cli.main(["status", "--study-name", "s"])
