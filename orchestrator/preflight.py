"""What ``launch-study run`` checks before it writes anything: the study's name, the places it
will write to, the devices the study file asks for, the Ray cluster it is told to join.

Each failure is a ``UserError`` (one line, exit 2). These run after the study file and corpus
are read and before the database is opened, so a mistake found here leaves the database, the
artifacts folder and the CSV exactly as they were: nothing here leaves a file or a folder behind
(a folder's writability is probed with a temporary file, removed at once).
"""

from __future__ import annotations

import math
import os
import re
import socket
import tempfile
from pathlib import Path

from orchestrator.errors import UserError

# A study name becomes a file name (runs/<name>.db, <name>_pareto.csv) and a folder
# (<artifacts>/trials/<name>): letters, digits, '.', '_', '-', not starting with '.', and short
# enough for every file system and for the 512-character name columns of the database.
STUDY_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}")
RAY_CONNECT_SECONDS = 5.0


def check_study_name(name: str, where: str = "study name") -> str:
    if not STUDY_NAME.fullmatch(name):
        shown = name if len(name) <= 60 else name[:57] + "..."
        raise UserError(
            f"{where} {shown!r}: use 1-100 letters, digits, '.', '_' or '-', not starting with '.' "
            "(it names files and folders)"
        )
    return name


def _nearest_existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_writable_folder(what: str, folder: Path, shown: Path | None = None) -> None:
    """``folder`` exists and can be written, or can be created under a writable ancestor
    (``shown``: the path to name in the error, when the folder is a file's)."""
    folder, shown = Path(folder), Path(shown or folder)
    if folder.exists() and not folder.is_dir():
        raise UserError(f"{what} {shown}: {folder} is a file, not a folder")
    base = _nearest_existing(folder)
    if not base.is_dir():
        raise UserError(f"{what} {shown}: {base} is a file, not a folder")
    try:  # os.access says yes to root everywhere, even on /proc: a file made and removed says more
        fd, probe = tempfile.mkstemp(prefix=".headprune-probe-", dir=base)
    except OSError as err:
        raise UserError(f"{what} {shown} cannot be written ({base}: {err.strerror or err})") from None
    os.close(fd)
    os.unlink(probe)


def check_writable_file(what: str, path: Path) -> None:
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{what} {path} is a folder, not a file")
    if path.exists() and not os.access(path, os.W_OK):
        raise UserError(f"{what} {path} cannot be written")
    check_writable_folder(what, path.parent, shown=path)


def check_not_an_input(what: str, path: Path, inputs: dict[str, Path | str | None]) -> None:
    """What we are about to write (a file, or a folder replaced whole) is none of the inputs it
    must leave alone (``inputs``: what each is, by name: the study file, the SQLite database,
    the corpus, a user's model folder, a trial's own folder), is not inside one, and does not
    hold one: an --output that did would replace it."""
    target = Path(path).resolve()
    for name, source in inputs.items():
        if not source:
            continue
        source = Path(source).resolve()
        # SQLite's -wal, -shm and -journal files beside the database are the database too.
        beside = [source.with_name(source.name + suffix) for suffix in ("-wal", "-shm", "-journal")]
        if target == source or target in beside:
            relation = "is"
        elif source in target.parents:
            relation = "is in"
        elif target in source.parents:
            relation = "holds"
        else:
            continue
        raise UserError(f"{what} {path} {relation} the {name} ({source}): choose another")


def check_sqlite_path(database: str | None) -> None:
    """An SQLite URL's file: its folder must be creatable (``open_store`` creates it)."""
    if database and database != ":memory:":
        check_writable_file("SQLite database", Path(database))


def check_devices(device: str, gpus_per_trial: float, joining_cluster: bool) -> None:
    """``trial.device`` and ``study.gpus_per_trial`` name hardware this machine has (on a cluster
    the workers' GPUs are Ray's to count, so only the device name is checked here)."""
    import torch

    if device.startswith("cuda") and not joining_cluster and not torch.cuda.is_available():
        raise UserError(
            f"[trial] device = {device!r}, but this machine has no CUDA GPU (use 'auto' or 'cpu')"
        )
    if gpus_per_trial > 0 and not joining_cluster:
        have = torch.cuda.device_count()
        if have < math.ceil(gpus_per_trial):
            raise UserError(
                f"[study] gpus_per_trial = {gpus_per_trial:g}, but this machine has {have} GPU(s) "
                "(use --ray-address to run on a cluster that has them)"
            )


def check_ray_address(address: str | None) -> None:
    """A ``host:port`` (or ``ray://host:port``) to join must answer; 'auto' and 'local' are Ray's
    own lookups and are left to it."""
    if not address or address in ("auto", "local"):
        return
    hostport = address.removeprefix("ray://")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise UserError(f"--ray-address {address!r}: expected host:port (e.g. 10.0.0.5:6379) or 'auto'")
    try:
        with socket.create_connection((host, int(port)), timeout=RAY_CONNECT_SECONDS) as conn:
            speaks_grpc = os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true") or _speaks_http2(conn)
    except OSError as err:
        raise UserError(f"cannot reach the Ray cluster at {address}: {err.strerror or err}") from None
    if not speaks_grpc:
        raise UserError(
            f"--ray-address {address}: something answers there, but not Ray (the head's GCS port, "
            "6379 unless `ray start --port` said otherwise, or ray://HOST:10001 for Ray Client)"
        )


# An HTTP/2 client's first bytes: the connection preface and an empty SETTINGS frame.
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def _speaks_http2(conn: socket.socket) -> bool:
    """Whether the server on ``conn`` is an HTTP/2 one, as Ray's GCS and Ray Client are (gRPC):
    such a server's first frame is SETTINGS (frame type 4). A database or another service on a
    mistyped port answers otherwise or closes, where ``ray.init`` would hang on it for minutes
    after the study was written. (A cluster with TLS, ``RAY_USE_TLS``, is not probed.)"""
    try:
        conn.settimeout(RAY_CONNECT_SECONDS)
        conn.sendall(HTTP2_PREFACE)
        header = b""
        while len(header) < 9:
            chunk = conn.recv(9 - len(header))
            if not chunk:
                return False
            header += chunk
    except OSError:
        return False
    return header[3] == 4
