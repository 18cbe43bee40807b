"""Ctrl-C and SIGTERM: the run winds down, loses nothing, and exits 130 or 143.

During the search the first signal only sets a flag (``wind_down``): the driver stops asking for
trials, Tune stops the running ones, and the runner fails them and asks for them again (a resumed
run continues them from their after-pruning checkpoints), refreshes the frontier table and raises
``Interrupted``. Elsewhere (pretraining, set-up) SIGTERM raises ``Interrupted`` at once, as Ctrl-C
raises KeyboardInterrupt: the lease is released on the way out. A second signal during the
wind-down stops at once.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """The run was stopped by a signal; ``exit_code`` is the shell's 128 + its number. A
    BaseException, like KeyboardInterrupt, so that no ``except Exception`` swallows it."""

    def __init__(self, signum: int, message: str = "") -> None:
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(message or f"interrupted ({signal.Signals(signum).name})")


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()  # signal.signal works only there


def raise_on_sigterm() -> Callable[[], None]:
    """SIGTERM as an exception (Python's default for it kills the process without cleaning up);
    returns what puts the previous handler back. Off the main thread, nothing changes."""
    if not _main_thread():
        return lambda: None

    def handler(signum: int, frame) -> None:
        raise Interrupted(signum)

    previous = signal.signal(signal.SIGTERM, handler)
    return lambda: signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def keep_sigterm_handler() -> Iterator[None]:
    """The SIGTERM handler before the block is the one after it: ``ray.init`` installs its own
    (``sys.exit``), which would end the run without a word between trials, and ``ray.shutdown``
    resets the signal to the system's default beneath Python's handler, which ``getsignal`` still
    reports (setting it again re-installs it)."""
    previous = signal.getsignal(signal.SIGTERM) if _main_thread() else None
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def wind_down(on_signal: Callable[[int], None]) -> Iterator[None]:
    """In the block, the first SIGINT or SIGTERM calls ``on_signal(signum)`` and returns (the run
    winds down by itself); a second one raises ``Interrupted`` at once."""
    if not _main_thread():  # run_study from a thread of a notebook: its caller handles signals
        yield
        return
    received: list[int] = []

    def handler(signum: int, frame) -> None:
        if received:
            raise Interrupted(signum)
        received.append(signum)
        on_signal(signum)

    previous = {s: signal.signal(s, handler) for s in SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
