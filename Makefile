# gpuaas: the two commands a newcomer needs are `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
START := $(shell date +%s)

.PHONY: demo test test-slow lint venv schema clean podresources-stubs

$(STAMP): requirements.txt
	@$(PYTHON) -c "import sys; assert sys.version_info[:2] == (3, 11), sys.version" 2>/dev/null || { echo "gpuaas needs Python 3.11: run make PYTHON=/path/to/python3.11"; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	@touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) manage.py demo

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/hadolint Dockerfile

# pytest on a marker selection; prints how long the make command took, and says so when the selection
# collected no test (pytest's exit 5: a marker that selects nothing is a failure, never a pass).
define pytest_timed
	@rc=0; $(PY) -m pytest -m "$(1)" || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make $@: pytest -m '$(1)' collected no tests (exit 5)" >&2; fi; \
	echo "make $@: $$(( $$(date +%s) - $(START) )) s"; \
	exit $$rc
endef

# Development targets run with DEBUG=1 (production defaults are safe: DEBUG off needs SECRET_KEY etc.).
# `manage.py demo` sets DEBUG=1 and per-install keys itself (gpuaas/demo/env.py); pytest uses gpuaas.settings_test.
# `make test` leaves out the slow fault and soak suites (marker `slow`): `make test-slow` runs them, and
# .ci/run runs both (README "Tests").
test: $(STAMP) lint
	$(VENV)/bin/lint-imports
	DEBUG=1 $(PY) manage.py makemigrations --check --dry-run
	$(call pytest_timed,not slow)

test-slow: $(STAMP)
	$(call pytest_timed,slow)

# Every benchmark at a small size, checked on its correctness targets only (benchmarks/smoke.py, docs/benchmarks.md).
# Runs on the configured DATABASE_URL/CELERY_BROKER_URL; benchmarks needing PostgreSQL or Redis are skipped without.
.PHONY: bench-smoke
bench-smoke: $(STAMP)
	$(PY) manage.py bench smoke

# Mutation score of the money modules (docs/benchmarks.md "mutation"): slow (every mutant is a pytest run), so
# not part of `make test`; .ci/run runs it when GPUAAS_CI_MUTATION=1. Each module prints its JSON line; one whose
# kill rate is under 0.9, or with a survivor not listed in its EQUIVALENT_MUTANTS.md, fails the target.
MUTATION_MODULES ?= billing/services/intervals.py billing/services/clock.py billing/periods.py \
	billing/services/lines.py billing/services/statements.py pricing/rates.py billing/services/metering.py \
	billing/measurements.py billing/services/rate_cards.py pricing/services.py \
	capacity/models/availability.py scheduling/policy.py pools/services/approval.py pools/units/free.py \
	pools/units/take.py capacity/picking.py monitoring/services/trespass.py monitoring/services/lending.py \
	capacity/mig/layout.py capacity/services/inventory.py pools/lending.py operations/reconfiguration/steps.py \
	scheduling/forecast/estimate.py scheduling/forecast/timeline.py scheduling/forecast/demand.py \
	scheduling/forecast/history.py
MUTATION_SAMPLE ?= 20
MUTATION_SEED ?= 8
# e.g. MUTATION_ALSO_SEEDS=1,2: the issue's three seeds in one run per module (one copy, one unmutated run)
MUTATION_ALSO_SEEDS ?=
.PHONY: mutation
mutation: $(STAMP)
	@rc=0; for module in $(MUTATION_MODULES); do \
		$(PY) manage.py bench mutation --module $$module --sample $(MUTATION_SAMPLE) --seed $(MUTATION_SEED) \
			--also-seeds "$(MUTATION_ALSO_SEEDS)" || rc=1; \
	done; exit $$rc

schema: $(STAMP)
	DEBUG=1 $(PY) manage.py spectacular --validate --fail-on-warn --file var/openapi.yaml

clean:
	rm -rf var/celery var/*.sqlite3* var/simcluster var/cache

# The kubelet PodResources stubs (capacity/adapters/podresources/README.md): regenerated from the vendored
# upstream api.proto with the grpcio-tools pinned there; the generated files are committed.
GRPC_TOOLS_PIN := grpcio-tools==1.85.1
.PHONY: podresources-stubs
podresources-stubs: $(STAMP)
	$(PY) -m pip install --quiet $(GRPC_TOOLS_PIN)
	$(PY) -m grpc_tools.protoc -I . --python_out=. --grpc_python_out=. capacity/adapters/podresources/v1/api.proto
