# Two entry points: `make demo` (the main job) and `make test`. Both create .venv on first use and
# install through the lock (requirements/lock.txt: every dependency pinned); `make lock` regenerates it.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
BASE := $(VENV)/.installed-base
DEV := $(VENV)/.installed-dev
LOCK := requirements/lock.txt
LOCK_VENV ?= /tmp/rstar2_jax-lock-venv
DEMO_ARGS ?=
PYTEST_ARGS ?=
# pytest-xdist workers (one per core here); a test file is one unit, the Ray files share one (tests/conftest.py)
TEST_WORKERS ?= 2
BENCH ?= $(sort $(wildcard experiments/bench_*.py))

.PHONY: test test-fast demo demo-seeds bench notebook lock clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# the package alone (what the demo needs), versions from the lock
$(BASE): setup.cfg pyproject.toml $(LOCK) | $(PY)
	$(PY) -m pip install -q -c $(LOCK) -e .
	touch $(BASE)

# the package with the dev extra (pytest, hypothesis, torch CPU + transformers for reference tests, nbclient,
# pyarrow, ipywidgets), versions from the lock
$(DEV): setup.cfg pyproject.toml $(LOCK) | $(PY)
	$(PY) -m pip install -q -c $(LOCK) -e '.[dev]'
	touch $(BASE) $(DEV)

test: $(DEV)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# the pure-function tests only (modules marked `pytestmark = pytest.mark.fast`: RoC, advantages, penalties, losses,
# reward extraction and equivalence, the page table, config parsing): under a minute, one process
test-fast: $(DEV)
	$(PY) -m pytest -q -m fast -n 0 $(PYTEST_ARGS)

demo: $(BASE)
	$(PY) experiments/toy_tool_math.py $(DEMO_ARGS)

# the demo for seeds 0, 1, 2 (fresh processes) and one table: held-out accuracy after SFT and after RL, minutes,
# mean and spread, the commit (about 4 min a seed on 2 CPU cores)
demo-seeds: $(BASE)
	$(PY) experiments/demo_seeds.py -- $(DEMO_ARGS)

# every benchmark, one after another (a miss or a crash does not stop the rest), then a table of their
# summary lines; fails at the end if any missed a target. Logs in runs/bench/<name>.log.
# A subset: make bench BENCH="experiments/bench_sandbox.py experiments/bench_logprobs.py"
bench: $(DEV)
	$(PY) -m rstar2_jax.utils.bench $(BENCH)

# re-run the RoC ablation notebook in place (full budget, 5 seeds x 3 modes, noisy-tools regime: 63 min on 2 CPU cores)
notebook: $(DEV)
	cd notebooks && ../$(PY) -c "import nbformat; from nbclient import NotebookClient; \
	nb = nbformat.read('roc_ablation.ipynb', as_version=4); \
	NotebookClient(nb, timeout=None, kernel_name='python3').execute(); nbformat.write(nb, 'roc_ablation.ipynb')"

# regenerate the lock: resolve setup.cfg's open ranges (package + dev extra) afresh in a scratch venv and pin
# what was installed (local version labels such as torch's +cpu dropped: `==2.13.0` matches 2.13.0+cpu too)
lock:
	rm -rf $(LOCK_VENV)
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install -q --upgrade pip
	$(LOCK_VENV)/bin/python -m pip install -q -e '.[dev]'
	{ echo "# Pinned versions that make installs from (pip install -c $(LOCK) -e '.[dev]'); setup.cfg keeps the open"; \
	  echo "# ranges for library users. Regenerate with: make lock (resolved with $$($(LOCK_VENV)/bin/python -V) on $$(uname -sm))."; \
	  $(LOCK_VENV)/bin/python -m pip freeze --exclude-editable | sed -E 's/\+[A-Za-z0-9.]+$$//'; } > $(LOCK).tmp
	! grep -n ' @ ' $(LOCK).tmp  # a direct URL or path (not from an index) would not install elsewhere
	mv $(LOCK).tmp $(LOCK)
	rm -rf $(LOCK_VENV)

clean:
	rm -rf $(VENV) runs .pytest_cache
