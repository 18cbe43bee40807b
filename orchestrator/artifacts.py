"""Where a study's models live: a local folder, or an object store every node reaches.

``--artifacts`` names the root: a local path (one machine, or a folder every node mounts) or a
URI, ``s3://bucket/prefix`` (AWS or any S3-compatible endpoint) or ``gs://bucket/prefix``. Under
it, ``dense/<key>/`` holds a dense checkpoint (``key``: a digest of the corpus, model and
pretraining settings, ``trainers.pretrain.checkpoint_key``), ``trials/<folder>/<number>/`` each
trial's pruned model and its after-pruning checkpoint (``after_prune/``), ``ray/`` Tune's
experiment folder. Every model folder has the one format of ``trainers/export.py``: its
``config.json`` records the SHA-256 of every other file, and is uploaded last, so a folder whose
upload was cut short (no ``config.json``, or one that vouches for other bytes) is never trusted.

Object stores are reached through ``pyarrow.fs`` (the layer Ray Tune's own storage uses), built
on each node from the standard environment: ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` for
an S3-compatible endpoint, and the AWS SDK's default credential chain (``AWS_ACCESS_KEY_ID`` and
``AWS_SECRET_ACCESS_KEY``, a profile, an instance role). No key is ever passed in code, so none
can be pickled into a Tune config, logged or written to the database: what travels is the URI.

A node reads a model through its local cache (``$HEADPRUNE_CACHE``, default
``~/.cache/headprune``), one folder per weights digest, verified against its checksums whenever it
is used; a trial writes its model into a staging folder there and uploads it (``publish``). For a
local root nothing is copied: models are read and written in place, as before object stores.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from orchestrator.errors import UserError
from trainers.export import CONFIG, WEIGHTS, CorruptModel, read_config

CACHE_ENV = "HEADPRUNE_CACHE"
# What Ray Tune copies from the driver's environment into its workers' runtime environment,
# which Ray's runtime-env agent writes into its log (ray/tune/execution/class_cache.py).
AWS_SECRETS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")
_hidden: dict[str, str] = {}  # those variables, while ``credentials_hidden`` holds them
REMOTE_SCHEMES = {"s3": "s3", "gs": "gs", "gcs": "gs"}


def local_cache() -> Path:
    """This node's cache of models read from, or staged for, an object store."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "headprune").resolve()


def is_remote(location: str | Path) -> bool:
    return urlsplit(str(location)).scheme in REMOTE_SCHEMES


def join(location: str | Path, *names: str) -> str:
    """``location``/``names``: a URI keeps its scheme and slashes, a path is a path."""
    if is_remote(location):
        return "/".join([str(location).rstrip("/"), *names])
    return str(Path(location, *names))


def shown(url: str) -> str:
    """``url`` as messages show it: without a user, a password or a query (where credentials
    could be)."""
    parts = urlsplit(url)
    if not parts.scheme:
        return url
    return f"{parts.scheme}://{parts.hostname or ''}{f':{parts.port}' if parts.port else ''}{parts.path}"


def parse_root(text: str | Path, flag: str = "--artifacts") -> str:
    """The artifacts root as it is stored and passed around: an absolute path, or a URI without
    credentials (they come from the environment of each node). A mistake is a ``UserError``,
    which never repeats a user, a password or a query the URI held."""
    text = str(text)
    parts = urlsplit(text)
    if parts.scheme and len(parts.scheme) > 1 and ("@" in parts.netloc or parts.query):
        raise UserError(
            f"{flag} {shown(text)}: credentials and options do not go in the URI (they would be logged "
            "and stored); set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or a profile) and "
            "AWS_ENDPOINT_URL instead"
        )
    if parts.scheme in ("", "file") or (len(parts.scheme) == 1 and text[1:3] in (":\\", ":/")):
        return str(Path(parts.path if parts.scheme == "file" else text).resolve())
    if parts.scheme not in REMOTE_SCHEMES:
        known = ", ".join(f"{s}://" for s in ("s3", "gs"))
        raise UserError(f"{flag} {shown(text)}: unknown scheme {parts.scheme!r} (a local folder, {known})")
    if not parts.netloc:
        raise UserError(f"{flag} {text}: no bucket (expected {parts.scheme}://bucket/prefix)")
    if parts.fragment:
        raise UserError(f"{flag} {text}: no fragment (expected {parts.scheme}://bucket/prefix)")
    path = "/".join(p for p in parts.path.split("/") if p)
    return f"{REMOTE_SCHEMES[parts.scheme]}://{parts.netloc}" + (f"/{path}" if path else "")


def endpoint() -> str | None:
    """The S3-compatible endpoint the environment names, as the AWS SDKs read it."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def filesystem(location: str | Path, *, attempts: int = 3):
    """(``pyarrow.fs`` filesystem, path inside it) for ``location``. Built anew from the
    environment: never pickled, so no credential travels with it."""
    from pyarrow import fs

    location = str(location)
    parts = urlsplit(location)
    if not is_remote(location):
        return fs.LocalFileSystem(), str(Path(location).resolve())
    path = parts.netloc + parts.path.rstrip("/")
    if REMOTE_SCHEMES[parts.scheme] == "gs":
        return fs.GcsFileSystem(retry_time_limit_seconds=30), path
    options: dict = {
        "connect_timeout": 5,
        "request_timeout": 60,
        "retry_strategy": fs.AwsStandardS3RetryStrategy(max_attempts=attempts),
    }
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        options["region"] = region
    if "AWS_ACCESS_KEY_ID" in _hidden:  # this process's own, never pickled (credentials_hidden)
        options |= {
            "access_key": _hidden["AWS_ACCESS_KEY_ID"],
            "secret_key": _hidden.get("AWS_SECRET_ACCESS_KEY"),
            "session_token": _hidden.get("AWS_SESSION_TOKEN") or _hidden.get("AWS_SECURITY_TOKEN"),
        }
    url = endpoint()
    if url:
        split = urlsplit(url if "://" in url else f"https://{url}")
        options |= {"endpoint_override": split.netloc, "scheme": split.scheme}
        options.setdefault("region", "us-east-1")  # else the SDK asks AWS where the bucket is
    return fs.S3FileSystem(**options), path


@contextlib.contextmanager
def credentials_hidden() -> Iterator[None]:
    """The AWS credentials leave this process's environment for the duration (Ray Tune would copy
    them into its workers' runtime environment, which Ray logs) and are kept here, in memory, for
    this process's own filesystems. A local Ray's workers already have them: they inherit the
    environment ``ray.init`` started Ray with. A cluster's workers have their own."""
    held = {name: os.environ.pop(name) for name in AWS_SECRETS if name in os.environ}
    _hidden.update(held)
    try:
        yield
    finally:
        for name in held:
            _hidden.pop(name, None)
        os.environ.update(held)


def _failure(err: OSError) -> str:
    """What an object store's error means to a user, in a few words (never a credential)."""
    text = str(err)
    lowered = text.lower()
    if any(s in lowered for s in ("couldn't connect", "connection", "resolve host", "timed out", "curl")):
        url = endpoint()
        return f"cannot reach the object store ({shown(url) if url else 'the default endpoint'})"
    if any(
        s in text
        for s in (
            "ACCESS_DENIED",
            "AccessDenied",
            "InvalidAccessKeyId",
            "SignatureDoesNotMatch",
            "INVALID_ACCESS_KEY",
            "SIGNATURE",
            "403",
            "Forbidden",
        )
    ):
        return "the credentials were refused (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or the profile)"
    return text.splitlines()[0] if text else type(err).__name__


def check_root(root: str, flag: str = "--artifacts", write: bool = True) -> None:
    """An object-store root answers, its bucket exists, and (``write``) an object can be written
    and removed there (a probe with a unique name, deleted at once): checked before a run writes
    anything. One ``UserError`` line otherwise. A local root is checked by ``preflight``."""
    from pyarrow.fs import FileType

    if not is_remote(root):
        return
    try:
        store, path = filesystem(root, attempts=1)
        bucket = path.split("/", 1)[0]
        if store.get_file_info(bucket).type == FileType.NotFound:
            raise UserError(f"{flag} {root}: bucket {bucket!r} does not exist (create it first)")
        if write:
            probe = f"{path}/.headprune-probe-{uuid.uuid4().hex}"
            with store.open_output_stream(probe) as out:
                out.write(b"probe")
            store.delete_file(probe)
    except OSError as err:
        raise UserError(f"{flag} {root}: {_failure(err)}") from None


def exists(location: str | Path) -> bool:
    """A model folder is there whole enough to try: its ``config.json`` (uploaded last) is."""
    from pyarrow.fs import FileType

    store, path = filesystem(location)
    return store.get_file_info(f"{path}/{CONFIG}").type == FileType.File


def stored_digest(location: str) -> str | None:
    """The weights' digest the stored ``config.json`` at ``location`` vouches for (read alone,
    not the weights); None where there is no readable one."""
    store, path = filesystem(location)
    try:
        with store.open_input_stream(f"{path}/{CONFIG}") as source:
            return json.loads(source.read()).get("sha256", {}).get(WEIGHTS)
    except FileNotFoundError:
        return None
    except (ValueError, AttributeError):  # cut short or not ours: as good as absent
        return None


def publish(folder: Path, location: str | Path) -> None:
    """Upload the model folder ``folder`` (its files, not its sub-folders) to ``location``: the
    old ``config.json`` removed first, every other file, then ``config.json`` under a hidden
    name, copied into place in one server-side step (a stream cut short by an exception is
    still stored on close, so it never goes to the name readers trust), then each object's size
    checked. A writer killed part-way leaves a folder no reader trusts. Nothing to do for a
    local ``location``, where the model was written in place."""
    if not is_remote(location):
        return
    from pyarrow.fs import FileType

    store, path = filesystem(location)
    files = [p for p in Path(folder).iterdir() if p.is_file() and not p.name.startswith(".")]
    staged = f"{path}/.{CONFIG}.{uuid.uuid4().hex}"
    try:
        if store.get_file_info(f"{path}/{CONFIG}").type == FileType.File:
            store.delete_file(f"{path}/{CONFIG}")
        for file in sorted(files, key=lambda p: p.name == CONFIG):  # config.json last
            target = staged if file.name == CONFIG else f"{path}/{file.name}"
            with open(file, "rb") as source, store.open_output_stream(target) as out:
                shutil.copyfileobj(source, out, 1 << 22)
        targets = [staged if file.name == CONFIG else f"{path}/{file.name}" for file in files]
        for file, info in zip(files, store.get_file_info(targets)):  # before config.json vouches
            if info.type != FileType.File or info.size != file.stat().st_size:
                raise OSError(f"{file.name}: the stored object differs from the file")
        store.copy_file(staged, f"{path}/{CONFIG}")
    except OSError as err:
        raise OSError(f"uploading {folder} to {location}: {_failure(err)}") from None
    finally:
        with contextlib.suppress(OSError):
            store.delete_file(staged)


def _download(location: str, into: Path) -> None:
    from pyarrow.fs import FileSelector, FileType

    store, path = filesystem(location)
    try:
        infos = store.get_file_info(FileSelector(path, recursive=False))
    except FileNotFoundError:
        infos = []
    except OSError as err:  # a bucket that is not there holds no model (not a network failure)
        if "NO_SUCH_BUCKET" not in str(err):
            raise
        infos = []
    if not any(i.base_name == CONFIG and i.type == FileType.File for i in infos):
        raise CorruptModel(f"{location}: no {CONFIG} (not uploaded, or cut short)")
    into.mkdir(parents=True, exist_ok=True)
    for info in infos:
        if info.type == FileType.File and not info.base_name.startswith("."):
            with store.open_input_stream(info.path) as source, open(into / info.base_name, "wb") as out:
                shutil.copyfileobj(source, out, 1 << 22)


def fetch(location: str | Path, digest: str | None = None) -> Path:
    """A local folder holding the model at ``location``, checked against its checksums (a
    ``CorruptModel`` otherwise: missing, cut short, other weights than ``digest``; an ``OSError``
    when the store cannot be reached). A local ``location`` is that folder itself. A remote one
    is downloaded into this node's cache: under its weights' ``digest`` when given (reused while
    it verifies and matches it), else into a fresh folder the caller removes when done."""
    if not is_remote(location):
        return Path(location)
    cache = local_cache()
    if digest:
        cached = cache / "models" / digest
        if cached.is_dir():
            try:
                if read_config(cached)["sha256"][WEIGHTS] == digest:
                    return cached
            except (CorruptModel, KeyError):
                pass
            shutil.rmtree(cached, ignore_errors=True)
    staging = cache / "tmp" / uuid.uuid4().hex
    try:
        _download(str(location), staging)
        found = read_config(staging).get("sha256", {}).get(WEIGHTS)
        if digest and found != digest:
            raise CorruptModel(f"{location}: holds weights {found}, not the expected {digest}")
    except OSError as err:  # the store or the network: another try may succeed
        shutil.rmtree(staging, ignore_errors=True)
        raise OSError(f"{location}: {_failure(err)}") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if not digest:
        return staging
    keep_in_cache(staging, digest)
    return cache / "models" / digest


def staging_for(location: str | Path) -> Path:
    """Where a trial writes the model it will ``publish`` to ``location``: the place itself
    when it is local, else a fresh folder in this node's cache."""
    if not is_remote(location):
        return Path(location)
    return local_cache() / "tmp" / uuid.uuid4().hex


def keep_in_cache(folder: Path, digest: str) -> None:
    """After ``publish``: the staged model becomes this node's cached copy (a warm start from it
    on this node downloads nothing), or goes if that copy is already there."""
    cached = local_cache() / "models" / digest
    cached.parent.mkdir(parents=True, exist_ok=True)
    try:
        folder.rename(cached)
    except OSError:
        shutil.rmtree(folder, ignore_errors=True)


@dataclass(frozen=True)
class ModelRef:
    """A model a trial reads: where it is stored and the digest of its weights (None: not
    recorded, for a study of an earlier version)."""

    location: str
    digest: str | None = None

    def local(self) -> Path:
        return fetch(self.location, self.digest)


class TrialArtifacts:
    """Optuna's artifact store (the ``optuna.artifacts`` protocol: ``open_reader``, ``write``,
    ``remove``) under ``<artifacts>/optuna-artifacts/``, on a local root or an object store alike.
    Each COMPLETE trial's model is uploaded there as one ``.tar`` (``attach_model``), so that
    optuna-dashboard lists it under the trial and serves it for download."""

    def __init__(self, root: str) -> None:
        self.root = root

    def _where(self, artifact_id: str):
        return filesystem(join(self.root, "optuna-artifacts", artifact_id))

    def open_reader(self, artifact_id: str):
        from optuna.artifacts.exceptions import ArtifactNotFound

        store, path = self._where(artifact_id)
        try:
            return store.open_input_stream(path)
        except FileNotFoundError:
            raise ArtifactNotFound(f"no artifact {artifact_id} under {self.root}") from None

    def write(self, artifact_id: str, content_body) -> None:
        store, path = self._where(artifact_id)
        if not is_remote(self.root):
            store.create_dir(path.rsplit("/", 1)[0])
        with store.open_output_stream(path) as out:
            shutil.copyfileobj(content_body, out, 1 << 22)

    def remove(self, artifact_id: str) -> None:
        store, path = self._where(artifact_id)
        store.delete_file(path)


def attach_model(trial, root: str, model_dir: str, digest: str) -> str:
    """Upload a COMPLETE trial's model (at ``model_dir`` on the object store ``root``, weights of
    digest ``digest``) to Optuna's artifact store there as ``trial-<number>.tar`` (the model's
    files, not its after-pruning checkpoint), before the trial is told: Optuna records artifacts
    only on a trial still running. The model is downloaded for it and not kept. Returns the
    artifact's id."""

    folder = fetch(model_dir)
    try:
        if read_config(folder)["sha256"][WEIGHTS] != digest:
            raise CorruptModel(f"{model_dir}: not the weights the trial reported")
        return _upload_tar(trial, folder, root)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _upload_tar(trial, folder: Path, root: str) -> str:
    import tarfile
    import tempfile

    from optuna.artifacts import upload_artifact

    with tempfile.TemporaryDirectory() as scratch:
        archive = Path(scratch) / f"trial-{trial.number}.tar"
        with tarfile.open(archive, "w") as tar:
            for file in sorted(folder.iterdir()):
                if file.is_file() and not file.name.startswith("."):
                    tar.add(file, arcname=f"trial-{trial.number}/{file.name}")
        return upload_artifact(
            artifact_store=TrialArtifacts(root),
            file_path=str(archive),
            study_or_trial=trial,
            mimetype="application/x-tar",
        )
