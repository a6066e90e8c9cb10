# Two entry points: `make demo` (the main job) and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test demo venv bench clean

venv: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

demo: $(STAMP)
	$(PY) experiments/toy_tool_math.py $(DEMO_ARGS)

bench: $(STAMP)
	for b in experiments/bench_*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) runs .pytest_cache
