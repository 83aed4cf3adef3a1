# Set-up is part of each target: a fresh machine needs only python3 (>= 3.10).
VENV   ?= .venv
PYTHON ?= python3
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.peakcut-installed
TORCH  ?= torch==2.13.0

.PHONY: demo test check-torch lint clean bench bench-quick

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q $(TORCH)
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/peakcut optimize bert-base --size paper --latency-limit 1.1 --time-budget 30 --device h200 --out out/demo

test: check-torch
	$(PY) -m pytest -q -n 2 --dist worksteal --durations=15   # two xdist workers (CI has 2 cores); an idle one takes tests queued for the other; the slowest tests listed

# The tests run on the pinned torch only: a package install that moved it fails here, by name.
check-torch: $(STAMP)
	@$(PY) -c "import re, sys, torch; pin = sys.argv[1]; m = re.search(r'torch==([^\s+]+)', pin); \
	have = torch.__version__.split('+')[0]; sys.exit(None if m is None or have == m[1] else \
	f'$(VENV) has torch {torch.__version__}, not {m[1]} as TORCH={pin} pins: a package install replaced it; ' \
	'run make clean, then make test')" '$(TORCH)'

bench: $(STAMP)
	$(PY) -m bench.peers            # peers vs peakcut: tiny measured (~20 min) + paper simulated (~15 min)

bench-quick: $(STAMP)
	$(PY) -m bench.peers --quick

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy src/peakcut  # default checks everywhere, strict on ir, memory, schedule (pyproject [tool.mypy])

clean:
	rm -rf $(VENV) out .pytest_cache
