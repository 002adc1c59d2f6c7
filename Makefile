# The two commands of the README. Each creates .venv and installs what it needs.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: test report showcase lab refs lint clean browser

# the report tests open every HTML report in headless Chromium (Debian's package)
browser:
	@command -v chromium >/dev/null 2>&1 || [ -n "$$CHROMIUM" ] || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "the report tests need chromium: run 'sudo apt-get install chromium' or set CHROMIUM" >&2; exit 1; fi; }

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m ipykernel install --sys-prefix --name kdtree-workbench --display-name "kdtree-workbench" >/dev/null
	touch $(STAMP)

# lint (its S101 rule keeps assert out of the package, so no behaviour rests on it), then the suite
test: $(STAMP) browser
	$(PY) -m ruff check .
	$(PY) -m pytest -q -n 3 --dist worksteal -p no:cacheprovider --durations=15

# the notebooks into reports/local/ (git-ignored)
report: $(STAMP)
	$(PY) -m workbench report

# the committed showcase: the notebooks into reports/ itself, replacing the last one whole (tracked
# files change; commit them). reports/bench/ (the benchmark results) is left as it is.
SHOWCASE_FILES := reports/[0-9]*.html reports/index.html reports/manifest.json reports/data reports/figures reports/logs
showcase: $(STAMP)
	rm -rf $(SHOWCASE_FILES)
	$(PY) -m workbench report --out reports

# JupyterLab on the notebooks: jupytext pairs, the kdtree-workbench kernel, kernels at the repo root
# (lab/jupyter_server_config.py). On a remote machine: make lab LAB_ARGS=--no-browser
lab: $(STAMP)
	JUPYTER_CONFIG_PATH="$(CURDIR)/lab" $(PY) -m jupyterlab $$([ "$$(id -u)" = 0 ] && echo --allow-root) $(LAB_ARGS)

refs: $(STAMP)
	$(PY) -m workbench build-refs

lint: $(STAMP)
	$(PY) -m ruff check .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
