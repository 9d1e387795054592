# Each target sets up .venv itself (scripts/setup.sh), so these work on a fresh machine.
PY := .venv/bin/python
export PYTHONUNBUFFERED := 1
# Tests run several processes on few cores: one thread each avoids oversubscription.
# DeepSpeed JIT-builds its CPU comm op into torch's extension cache, which is keyed by name only:
# two checkouts sharing one home directory would rebuild it over each other and can leave a stale
# lock that hangs every later launch, so each checkout builds into its own venv.
# Inductor's compile pool is one process more per compile for no gain at one thread.
TEST_ENV := OMP_NUM_THREADS=1 TORCHINDUCTOR_COMPILE_THREADS=1 DS_ACCELERATOR=$${DS_ACCELERATOR:-cpu} \
	TORCH_EXTENSIONS_DIR=$${TORCH_EXTENSIONS_DIR:-$(CURDIR)/.venv/torch_extensions}
# pytest-xdist workers: each test runs single-threaded, so one worker per core of the 2-core CI
# machine. A file's tests stay on one worker (--dist loadfile), so its module fixtures are built once;
# the recipe runs many files share are built once per session (tests/_once.py).
TEST_WORKERS ?= 2

.PHONY: setup train lint ops bytecode test test-unit test-distributed test-recipes bench gpu-wheels

setup:
	./scripts/setup.sh

# The main job: meta-train SmolLM2-135M on the built-in CLDR task suite, then evaluate it.
train: setup
	$(PY) recipes/train.py $(ARGS)

# ruff (lint) over all Python, mypy over the library; settings in pyproject.toml.
lint: setup
	$(PY) -m ruff check .
	$(PY) -m mypy

# DeepSpeed JIT-builds its CPU shared-memory all-reduce (C++) on a venv's first launch: ~50 CPU
# seconds that the first distributed test paid inside the tests' time. Built beside the lint instead,
# whose mypy keeps one core of two busy: lint and build together took 61 s cold, mypy alone 44 s.
ops: setup
	$(TEST_ENV) $(PY) -c "from deepspeed.comm.torch import build_shm_op; build_shm_op()"

# Where PYTHONDONTWRITEBYTECODE is set (the 2-core machines the suite is timed on set it), no
# process caches the bytecode of the repository's modules, and each of the suite's ~280 interpreters
# compiled fmmeta again (0.35 s of imports against 0.17 s from bytecode, -X importtime). Compiled
# once here, every process reads it.
bytecode: setup
	$(PY) -m compileall -q fmmeta recipes benchmarks scripts tests

test: setup
	$(MAKE) --no-print-directory -j2 -O lint ops bytecode
	$(TEST_ENV) $(PY) -m pytest tests -q -n $(TEST_WORKERS) --dist loadfile $(ARGS)

test-unit: setup bytecode
	$(TEST_ENV) $(PY) -m pytest tests/unit -q $(ARGS)

test-distributed: setup bytecode
	$(TEST_ENV) $(PY) -m pytest tests/distributed -q $(ARGS)

test-recipes: setup bytecode
	$(TEST_ENV) $(PY) -m pytest tests/recipes -q $(ARGS)

# Every benchmark at its default size for this machine's device. adapt_many.py adapts the default
# run, so a missing one is trained first (make train).
bench: setup
	test -f runs/default/eval/eval.json || $(PY) recipes/train.py
	for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# wheels/ for scripts/gpu_check.sh on a GPU machine without the package index (Python 3.12).
gpu-wheels: setup
	./scripts/gpu_wheels.sh wheels
