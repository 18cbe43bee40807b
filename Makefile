# Each target sets up what it needs (scripts/bootstrap.sh: .venv, torch, the package) by itself.
VENV := .venv
BIN := $(VENV)/bin
STUDY ?= studies/tinyshakespeare.toml

.PHONY: study smoke test test-fast lint bootstrap clean docs

bootstrap:
	@scripts/bootstrap.sh

# The default study on tinyshakespeare, in runs/<study>.db, ending with runs/<study>_pareto.csv.
study: bootstrap
	$(BIN)/launch-study run $(STUDY)

smoke: bootstrap
	$(BIN)/launch-study run studies/smoke.toml

test: bootstrap
	$(BIN)/python -m pytest

# Under a minute: no Ray, no database server, no process started (tests/conftest.py enforces it).
test-fast: bootstrap
	HEADPRUNE_FAST_LANE=1 $(BIN)/python -m pytest -q -m "not slow and not server"

# Style, formatting, the layers' contracts (import-linter: bench -> orchestrator -> trainers,
# trainers free of Optuna, Ray and SQL, no import cycle) and the generated references up to date.
lint: bootstrap
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/python -m orchestrator.reference_docs --check

clean:
	rm -rf runs .pytest_cache

# docs/reference/*.md, generated from the code (tests/test_reference_docs.py holds them equal).
docs: bootstrap
	$(BIN)/python -m orchestrator.reference_docs

# docker/compose.yaml end to end, with images built here (scripts/cluster_test.sh). Once per
# machine, as root: scripts/cluster_prereqs.sh (Docker, docker-compose, base images, wheels).
.PHONY: cluster-test
cluster-test: bootstrap
	@scripts/cluster_test.sh
