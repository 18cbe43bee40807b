"""Files written whole or not at all: a process killed mid-write leaves the old file (or none),
never half of a new one that a later run would trust."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path


def write_atomically(path: Path, write: Callable[[Path], object]) -> None:
    """``write(tmp)``, flushed to disk, then renamed over ``path``: a reader sees the old file or
    the new one, whole. The temporary name is unique (beside ``path``, hidden, ``.tmp``), so
    processes writing the same file at once do not rename each other's half-written file. A
    symbolic link stays one (the file it names is replaced); a pipe or a device (``--output
    /dev/stdout``) has nothing to replace and is written through."""
    path = Path(path)
    if path.exists() and not path.is_file():
        write(path)
        return
    path = path.resolve() if path.is_symlink() else path
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
