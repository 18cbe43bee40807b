"""Progress lines for long work: pretraining steps with an ETA, and each finished trial."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class PhaseProgress:
    """Prints ``phase step/total loss ETA`` lines; pass as a trainers ``Progress`` callback."""

    def __init__(self, stream: TextIO = sys.stderr, every_seconds: float = 10.0) -> None:
        self.stream, self.every = stream, every_seconds
        self.started: dict[str, float] = {}
        self.last_print = 0.0

    def __call__(self, phase: str, step: int, total: int, loss: float) -> None:
        now = time.perf_counter()
        start = self.started.setdefault(phase, now)
        if step < total and now - self.last_print < self.every:
            return
        self.last_print = now
        rate = (now - start) / max(1, step - 1) if step > 1 else 0.0
        eta = rate * (total - step)
        print(f"{phase}: step {step}/{total}  loss {loss:.3f}  eta {eta:4.0f}s", file=self.stream, flush=True)


def say(message: str, stream: TextIO = sys.stderr) -> None:
    print(message, file=stream, flush=True)
