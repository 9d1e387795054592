# Each target sets up .venv itself (scripts/setup.sh), so these work on a fresh machine.
PY := .venv/bin/python
export PYTHONUNBUFFERED := 1
export OMP_NUM_THREADS ?= 1

.PHONY: setup train test test-unit test-distributed test-recipes bench

setup:
	./scripts/setup.sh

# The main job: meta-train SmolLM2-135M on the built-in CLDR task suite, then evaluate it.
train: setup
	$(PY) recipes/train.py $(ARGS)

test: setup
	$(PY) -m pytest tests -q $(ARGS)

test-unit: setup
	$(PY) -m pytest tests/unit -q $(ARGS)

test-distributed: setup
	$(PY) -m pytest tests/distributed -q $(ARGS)

test-recipes: setup
	$(PY) -m pytest tests/recipes -q $(ARGS)

bench: setup
	for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done
