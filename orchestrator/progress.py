"""Progress for long work: pretraining steps with an ETA, and each finished trial.

On a terminal the pretraining line redraws itself in place; in a log (not a terminal) it is
written rarely, so CI logs and files stay short.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class PhaseProgress:
    """``phase step/total loss ETA``; pass as a trainers ``Progress`` callback."""

    def __init__(self, stream: TextIO = sys.stderr, log_every_seconds: float = 60.0) -> None:
        self.stream = stream
        self.live = stream.isatty()
        self.every = 0.5 if self.live else log_every_seconds
        self.started: dict[str, float] = {}
        self.last_print = float("-inf")

    def __call__(self, phase: str, step: int, total: int, loss: float) -> None:
        now = time.perf_counter()
        start = self.started.setdefault(phase, now)
        first, last = step <= 1, step >= total
        if not (first or last or now - self.last_print >= self.every):
            return
        self.last_print = now
        eta = (now - start) / max(1, step - 1) * (total - step) if step > 1 else 0.0
        line = f"{phase}: step {step}/{total}  loss {loss:.3f}  eta {eta:4.0f}s"
        if self.live:
            print(f"\r{line}\x1b[K", end="\n" if last else "", file=self.stream, flush=True)
        else:
            print(line, file=self.stream, flush=True)


def say(message: str, stream: TextIO = sys.stderr) -> None:
    print(message, file=stream, flush=True)
