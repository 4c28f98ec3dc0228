# Two commands: `make demo` and `make test`. Both create .venv and install
# everything they need into it, so they work on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast install clean bench-gpu

# Two xdist workers (one per core of the 2-core CI machine). Tests that share
# one expensive child run compute it once (tests/isolation.py, computed_once)
# and go to one worker as one unit, the longest units first
# (tests/scheduling.py).
PYTEST := $(PY) -m pytest -q -n 2

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test,jax]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m keras_yolo_mgpu.demo

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PYTEST) --durations=15 tests

# The inner loop: everything but the tests marked slow (the float64 replica
# runs, end-to-end training runs). `make test` stays the full suite (CI's).
test-fast: $(STAMP)
	$(PYTEST) -m "not slow" tests

# One-GPU benchmark (training speed per mode, input pipeline, replication cost):
# writes bench_gpu/results.jsonl and the Markdown tables bench_gpu/report.md (BENCHMARKS.md, "GPU").
bench-gpu: $(STAMP)
	$(PY) scripts/bench_gpu.py --results bench_gpu

clean:
	rm -rf $(VENV) demo_output .pytest_cache
