# Goodput: the two commands. `make demo` runs the console; `make test` runs the suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: demo test soak scale lint install install-dev clean-data

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -qq --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml requirements.lock
	@echo "Installing Goodput into $(VENV) (first run takes a minute)…"
	$(BIN)/pip install -qq -r requirements.lock
	PYTHONWARNINGS=ignore $(BIN)/pip install -qq --no-deps -e .
	@touch $@

$(DEV_STAMP): $(STAMP) requirements-dev.lock
	$(BIN)/pip install -qq -r requirements-dev.lock
	@touch $@

install: $(STAMP)
install-dev: $(DEV_STAMP)

# `make demo PORT=8001` serves on another port than 8000. Its output ends with the sign-in line;
# INFO log lines only with LOG_LEVEL=INFO, each start-up step with DEMO_ARGS=-v2.
PORT ?= 8000
demo: $(STAMP)
	LOG_LEVEL=$${LOG_LEVEL:-WARNING} $(BIN)/python manage.py demo --port $(PORT) $(DEMO_ARGS)

# Tests use real PostgreSQL and Redis: DATABASE_URL if set (else the embedded PostgreSQL), and
# REDIS_URL (default: database 15 of the local Redis, which the suite flushes). They run on 4
# parallel workers, worker N on Redis database 15 - N (tests/parallel.py); PYTEST_ARGS="-n 0" runs serially.
# Tests marked `solo` measure a page's own work on the machine's cores: they run alone afterwards
# (a selection with none of them is not an error).
test: $(DEV_STAMP)
	@export REDIS_URL=$${REDIS_URL:-redis://127.0.0.1:6379/15} \
	ALLOWED_HOSTS=$${ALLOWED_HOSTS:-127.0.0.1,localhost} \
	SECRET_KEY=$${SECRET_KEY:-test-only-secret-key}; \
	$(BIN)/python -m pytest -m "not solo" $(PYTEST_ARGS) || [ $$? -eq 5 ] || exit 1; \
	$(BIN)/python -m pytest -m solo -n 0 $(PYTEST_ARGS) || [ $$? -eq 5 ]

# The reliability soak on its own PostgreSQL and Redis: faults, live load, memory, backups
# (bench/soak.py; about 45 minutes). CI runs the short subset: `make soak SOAK_ARGS=--short`.
soak: $(DEV_STAMP)
	$(BIN)/python bench/soak.py $(SOAK_ARGS)

# A fleet of N GPUs on the console's own services, measured (bench/scale.py; 15 minutes at
# 100,000 GPUs by default): every GPU's samples every 10 s, 64-GPU training jobs on 80 % of the
# nodes reporting through the training API, a vLLM endpoint on each of the rest pushing its
# scrape, probes and websocket clients. CI runs `make scale SCALE_ARGS="--short --gpus 2000"`.
scale: $(DEV_STAMP)
	$(BIN)/python bench/scale.py $(SCALE_ARGS)

lint: $(DEV_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean-data:
	rm -rf var/
