"""Everything that touches the database, one module per job.

One database holds a study: Optuna's tables (trials, values, attributes; what optuna-dashboard
reads) and this project's (``schema``): ``pareto_frontier``, kept equal to the non-dominated set
of the study's COMPLETE trials, ``trial_replicates``, the front's points trained again with other
seeds, and ``study_lease``, which driver holds the study.

- ``urls``: where the database is, and the only forms of its URL that may be shown;
- ``store``: opening it (one engine per database, Optuna's) and the session discipline
  (``transaction`` for each unit of work, ``reading`` for reads; no session is kept);
- ``schema``: this project's tables and their Alembic migrations (``migrations/``);
- ``studies``: a study made, found and checked to be this project's;
- ``frontier_table``, ``replicate_table``: the two result tables;
- ``retries``: unfinished trials failed and asked for again;
- ``lease``: one driver per study;
- ``driver``, ``trial_rows``: the driver's in-memory view of the study, writing through.

What the rest of the project uses is imported from here.
"""

from orchestrator.storage.frontier_table import (
    FRONTIER_COLUMNS,
    change_frontier,
    front_rows,
    read_frontier,
    refresh_frontier,
)
from orchestrator.storage.lease import (
    HeldLease,
    Takeover,
    acquire_lease,
    hold_lease,
    release_lease,
    renew_lease,
)
from orchestrator.storage.replicate_table import ReplicateResult, read_replicates, record_replicate
from orchestrator.storage.retries import fail_and_ask_again, fail_orphaned_trials
from orchestrator.storage.schema import ParetoPoint, Replicate, StudyLease
from orchestrator.storage.store import StudyStore, close_store, open_store, upgrade_schema
from orchestrator.storage.studies import (
    DIRECTIONS,
    MODELS_FOLDER_KEY,
    check_objectives,
    check_store,
    complete_trials,
    create_or_load_study,
    load_existing_study,
    models_folder,
    study_exists,
)
from orchestrator.storage.urls import (
    STORAGE_ENV,
    redact,
    redact_command,
    resolve_url,
    scrub,
    sqlite_database,
)

__all__ = [
    "DIRECTIONS",
    "FRONTIER_COLUMNS",
    "MODELS_FOLDER_KEY",
    "STORAGE_ENV",
    "HeldLease",
    "ParetoPoint",
    "Replicate",
    "ReplicateResult",
    "StudyLease",
    "StudyStore",
    "Takeover",
    "acquire_lease",
    "change_frontier",
    "check_objectives",
    "check_store",
    "close_store",
    "complete_trials",
    "create_or_load_study",
    "fail_and_ask_again",
    "fail_orphaned_trials",
    "front_rows",
    "hold_lease",
    "load_existing_study",
    "models_folder",
    "open_store",
    "read_frontier",
    "read_replicates",
    "record_replicate",
    "redact",
    "redact_command",
    "refresh_frontier",
    "release_lease",
    "renew_lease",
    "resolve_url",
    "scrub",
    "sqlite_database",
    "study_exists",
    "upgrade_schema",
]
