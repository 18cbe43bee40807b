"""The study's lease: one driver per study. The holder renews a heartbeat from a thread; a
lease silent for longer than its holder's TTL, or held by a driver of this machine whose process
is gone, may be taken over."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError

from orchestrator.errors import LeaseLost, UserError
from orchestrator.storage.schema import StudyLease
from orchestrator.storage.store import StudyStore, transaction


def _utc(moment: datetime) -> datetime:
    """SQLite returns naive datetimes: read them as UTC."""
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _pid_namespace() -> str:
    """Which process-id space this process's pid is counted in: a container sharing the host's
    name (``--network host``) counts its own, where the host's pids look gone."""
    try:
        return os.readlink("/proc/self/ns/pid").strip("pid:[]")
    except OSError:  # no /proc (macOS): one space per host
        return ""


def _lease_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}:{_pid_namespace()}"


def _died_here(owner: str) -> bool:
    """True when the owner was a driver on this machine, in this pid namespace, whose process is
    gone: its lease need not be waited out (a driver restarted after a crash takes over at once).
    An owner written before the namespace was recorded is judged by its host alone."""
    parts = owner.split(":")  # host:pid:nonce:namespace
    host, pid = parts[0], parts[1] if len(parts) > 1 else ""
    namespace = parts[3] if len(parts) > 3 else _pid_namespace()
    if host != socket.gethostname() or not pid.isdigit() or namespace != _pid_namespace():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, someone else's
        return False
    return False


@dataclass(frozen=True)
class Takeover:
    """Whose lease a driver took, and why it could."""

    previous_owner: str
    reason: str  # "died": a driver of this machine whose process is gone; "expired": silent too long

    def describe(self) -> str:
        if self.reason == "died":
            return f"took over the study from {self.previous_owner}, whose process on this machine is gone"
        return f"took over the study from {self.previous_owner}, whose lease had expired"


def _now() -> datetime:
    return datetime.now(UTC)


def acquire_lease(
    store: StudyStore, study_name: str, owner: str, ttl_seconds: float, now: datetime | None = None
) -> Takeover | None:
    """Take the study's lease; returns the takeover when another driver's lease was taken.
    Raises UserError while another driver's heartbeat is fresh by that driver's own TTL."""
    now = now or _now()
    try:
        with transaction(store.engine) as session:
            lease = session.get(StudyLease, study_name, with_for_update=True)
            if lease is None:
                session.add(
                    StudyLease(study_name=study_name, owner=owner, heartbeat_at=now, ttl_seconds=ttl_seconds)
                )
                return None
            age = (now - _utc(lease.heartbeat_at)).total_seconds()
            holder_ttl = lease.ttl_seconds or ttl_seconds
            died = lease.owner != owner and _died_here(lease.owner)
            if lease.owner != owner and age < holder_ttl and not died:
                raise UserError(
                    f"study {study_name!r} is being run by another driver ({lease.owner}, heartbeat "
                    f"{age:.0f}s ago); wait for it, or for its lease to expire ({holder_ttl:.0f}s after "
                    "its last heartbeat)"
                )
            previous = lease.owner
            # Taken only from the owner just read: SQLite ignores FOR UPDATE (its SELECT runs
            # outside a transaction), so two drivers restarted at once may both have read the
            # dead owner; the row changes hands once, and the second finds no row to update.
            taken = session.execute(
                sa.update(StudyLease)
                .where(StudyLease.study_name == study_name, StudyLease.owner == previous)
                .values(owner=owner, heartbeat_at=now, ttl_seconds=ttl_seconds)
                .execution_options(synchronize_session=False)
            )
            if taken.rowcount != 1:
                raise UserError(f"study {study_name!r} is being started by another driver")
            if previous == owner:
                return None
            return Takeover(previous, "died" if died else "expired")
    except sa.exc.IntegrityError:  # another driver inserted the row between our read and write
        raise UserError(f"study {study_name!r} is being started by another driver") from None


def renew_lease(store: StudyStore, study_name: str, owner: str, now: datetime | None = None) -> bool:
    """Refresh the heartbeat; False when the lease is no longer ours."""
    with transaction(store.engine) as session:
        updated = session.execute(
            sa.update(StudyLease)
            .where(StudyLease.study_name == study_name, StudyLease.owner == owner)
            .values(heartbeat_at=now or _now())
        )
    return updated.rowcount == 1


def release_lease(store: StudyStore, study_name: str, owner: str) -> None:
    with transaction(store.engine) as session:
        session.execute(
            sa.delete(StudyLease).where(StudyLease.study_name == study_name, StudyLease.owner == owner)
        )


class HeldLease:
    """A driver's hold on its study. ``beat`` renews it (a thread calls it every ttl/6 s, so a
    failed renewal is retried twice before 2/3 of the TTL). ``lost`` is set once the lease is
    another driver's, or once no renewal has succeeded for 2/3 of the TTL (from the whole TTL on
    another driver may take it at any moment). ``held`` is what the driver asks before each ask
    and tell: it judges the time since the last renewal itself, since a renewal stuck in a
    half-dropped connection never returns to say it failed."""

    def __init__(self, store: StudyStore, study_name: str, ttl_seconds: float, clock=_now) -> None:
        self.store, self.study_name, self.ttl_seconds, self.clock = store, study_name, ttl_seconds, clock
        self.owner = _lease_owner()
        self.beat_every = ttl_seconds / 6  # seconds between renewals (hold_lease's thread)
        self.takeover = acquire_lease(store, study_name, self.owner, ttl_seconds, now=clock())
        self.last_renewed = clock()
        self.lost = threading.Event()
        self.lost_reason = ""

    def beat(self) -> None:
        now = self.clock()
        try:
            if renew_lease(self.store, self.study_name, self.owner, now=now):
                self.last_renewed = now
                return
            self._lose("another driver took the study's lease")
        except SQLAlchemyError as err:  # a missed beat is retried on the next
            self._lose_if_silent(now, f" ({type(err).__name__})")

    def held(self) -> bool:
        """Whether the driver may still ask and tell."""
        self._lose_if_silent(self.clock(), " (none has succeeded since)")
        return not self.lost.is_set()

    def _lose_if_silent(self, now: datetime, why: str) -> None:
        # Given up at 2/3 of the TTL: from the whole TTL on another driver may take the study,
        # and this one must have stopped telling by then (it beats every TTL/6).
        silent = (now - self.last_renewed).total_seconds()
        if silent >= self.ttl_seconds * 2 / 3:
            self._lose(
                f"the lease could not be renewed for {silent:.0f}s of its {self.ttl_seconds:.0f}s{why}"
            )

    def _lose(self, reason: str) -> None:
        if not self.lost.is_set():
            self.lost_reason = reason
            self.lost.set()

    def check(self, unrecorded: str = "its running trials (the study's holder resumes them)") -> None:
        """Raise LeaseLost once the lease is gone, saying what was not recorded."""
        if not self.held():
            raise LeaseLost(
                f"study {self.study_name!r}: {self.lost_reason}; this driver stopped without recording "
                f"{unrecorded}"
            )


@contextlib.contextmanager
def hold_lease(store: StudyStore, study_name: str, ttl_seconds: float) -> Iterator[HeldLease]:
    """Hold the study's lease for the block, renewing it from a thread every ttl/6 seconds."""
    held = HeldLease(store, study_name, ttl_seconds)
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(held.beat_every) and not held.lost.is_set():
            held.beat()

    thread = threading.Thread(target=beat, name="lease-heartbeat", daemon=True)
    thread.start()
    try:
        yield held
    finally:
        stop.set()
        thread.join()
        if not held.lost.is_set():
            release_lease(store, study_name, held.owner)
