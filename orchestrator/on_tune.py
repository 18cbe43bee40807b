"""Ray and Ray Tune as every command that trains uses them: a Ray session for the run (a local
instance of our own, or the cluster named), the tuner with each trial's resources, Tune's
retries and our signal handling, and where Tune keeps its experiment folder."""

from __future__ import annotations

import contextlib
import math
import os
import signal
from collections.abc import Iterator
from pathlib import Path

from orchestrator.artifacts import (
    ModelRef,
    credentials_hidden,
    is_remote,
    local_cache,
)
from orchestrator.config import StudyConfig
from orchestrator.execution import (
    RunStopper,
    Stoppable,
)
from orchestrator.inputs import dense_location
from orchestrator.interrupts import Interrupted, keep_sigterm_handler, wind_down
from orchestrator.session import RunOptions
from trainers.plugins import PLUGINS_ENV, plugin_modules
from trainers.pretrain import DenseCheckpoint
from trainers.trial import dense_weights


@contextlib.contextmanager
def ray_session(opts: RunOptions, cpus_per_trial: float) -> Iterator[None]:
    """Ray for one run of trials: the cluster ``opts.ray_address`` names, else a local instance
    with the CPUs of ``max_concurrent`` trials, shut down after; a notebook's own Ray (already
    initialised) is used as it is and left running."""
    import ray

    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # our own progress lines, not Tune's tables
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")  # no TensorBoard/CSV files
    local = {} if opts.ray_address else {"num_cpus": max(1, math.ceil(cpus_per_trial * opts.max_concurrent))}
    joined = ray.is_initialized()
    if not joined:
        try:
            with keep_sigterm_handler():
                _init_ray(opts, local)
        except BaseException as stop:  # stopped or failed while it starts: what it started goes
            with contextlib.suppress(Exception), keep_sigterm_handler():
                ray.shutdown()
            # ray.init's own SIGTERM handler, there while it starts, exits 15: the interrupt it is
            if isinstance(stop, SystemExit) and stop.code == signal.SIGTERM:
                raise Interrupted(signal.SIGTERM) from None
            raise
    try:
        yield
    finally:
        if not joined:
            # ray.shutdown puts SIGTERM back to the system's default under Python's handler: a
            # SIGTERM after it (the front refreshed, the CSV written, the lease released) would
            # kill the run without a word and leave its lease held. Set again, ours is back.
            with keep_sigterm_handler():
                ray.shutdown()


def dense_ref(opts: RunOptions, dense: DenseCheckpoint) -> ModelRef | None:
    """How a worker reads the dense checkpoint: from the object store by its weights' digest;
    None where the driver's path is the workers' too (a local ``--artifacts``)."""
    if not is_remote(opts.artifacts):
        return None
    return ModelRef(dense_location(opts.artifacts, dense), dense_weights(dense))


def fit_on_tune(
    cfg: StudyConfig,
    opts: RunOptions,
    trainable,
    tune_config,
    *,
    name: str,
    callback,
    driver: Stoppable,
    param_space: dict | None = None,
) -> None:
    """Tune runs ``trainable`` with each trial's resources, its experiment folder under
    ``<artifacts>/ray/<name>``, ``callback`` told of each trial, Tune's retries of a dead worker,
    and our signal handling: the first Ctrl-C or SIGTERM goes to ``driver.interrupt`` and
    ``RunStopper`` stops the running trials (interrupts.py). Inside ``ray_session``."""
    from ray import tune

    tuner = tune.Tuner(
        tune.with_resources(trainable, {"cpu": cfg.study.cpus_per_trial, "gpu": cfg.study.gpus_per_trial}),
        param_space=param_space,
        tune_config=tune_config,
        run_config=tune.RunConfig(
            name=name,
            storage_path=str(tune_folder(opts.artifacts)),
            callbacks=[callback],
            stop=RunStopper(driver),
            failure_config=tune.FailureConfig(max_failures=cfg.study.max_retries),
            verbose=0,
        ),
    )
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"  # ours (interrupts.py) winds the run down
    # Tune would copy the store's credentials into its workers' runtime environment, and Ray logs it
    with wind_down(driver.interrupt), credentials_hidden():
        tuner.fit()


def tune_folder(artifacts: str) -> Path:
    """Tune's experiment folder: ``<artifacts>/ray``, or this machine's cache with an object
    store. It is a cache either way (the database holds the study, the store the models), and
    kept off the store: while Tune runs the credentials are out of the driver's environment
    (``artifacts.credentials_hidden``), so Tune's filesystem would need them as explicit keys,
    which it would pickle into its experiment state and ship to every worker."""
    return local_cache() / "ray" if is_remote(artifacts) else Path(artifacts) / "ray"


def _init_ray(opts: RunOptions, local: dict) -> None:
    import ray

    if opts.ray_address and plugin_modules():  # a cluster's workers do not inherit our environment
        local = {**local, "runtime_env": {"env_vars": {PLUGINS_ENV: os.environ[PLUGINS_ENV]}}}
    ray.init(
        # "local": a fresh instance of our own, never whatever cluster `ray start` left recorded
        # in /tmp/ray; joining a cluster is what --ray-address / RAY_ADDRESS is for.
        address=opts.ray_address or "local",
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=True,
        logging_level="ERROR",
        **local,
    )
