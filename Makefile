# Two entry points: `make demo` (the main job) and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BASE := $(VENV)/.installed-base
DEV := $(VENV)/.installed-dev
DEMO_ARGS ?=
PYTEST_ARGS ?=

.PHONY: test demo bench notebook clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# the package alone (what the demo needs)
$(BASE): setup.cfg pyproject.toml | $(PY)
	$(PY) -m pip install -q -e .
	touch $(BASE)

# the package with the dev extra (pytest, hypothesis, torch CPU + transformers for reference tests, nbclient)
$(DEV): setup.cfg pyproject.toml | $(PY)
	$(PY) -m pip install -q -e '.[dev]'
	touch $(BASE) $(DEV)

test: $(DEV)
	$(PY) -m pytest -q $(PYTEST_ARGS)

demo: $(BASE)
	$(PY) experiments/toy_tool_math.py $(DEMO_ARGS)

bench: $(DEV)
	for b in experiments/bench_*.py; do $(PY) $$b || exit 1; done

# re-run the RoC ablation notebook in place (full budget, 5 seeds x 3 modes, noisy-tools regime: 63 min on 2 CPU cores)
notebook: $(DEV)
	cd notebooks && ../$(PY) -c "import nbformat; from nbclient import NotebookClient; \
	nb = nbformat.read('roc_ablation.ipynb', as_version=4); \
	NotebookClient(nb, timeout=None, kernel_name='python3').execute(); nbformat.write(nb, 'roc_ablation.ipynb')"

clean:
	rm -rf $(VENV) runs .pytest_cache
