# Two entry points: `make demo` and `make test`. Each creates or refreshes the virtual environment first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: venv demo test test-slow bench-cost-curve clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,serve,train]'
	touch $(STAMP)

venv: $(STAMP)

demo: venv
	$(VENV)/bin/oospec demo

test: venv
	$(PY) -m pytest -q

test-slow: venv
	$(PY) -m pytest -q -m slow

bench-cost-curve: venv
	$(VENV)/bin/oospec bench cost-curve --model qwen2.5-coder-1.5b --out runs/cost-curve.json

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
