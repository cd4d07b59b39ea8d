# Two commands set everything up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=
PYTEST_ARGS ?=

.PHONY: install run test test-fast docs bench clean

# uv installs the same packages as pip from the same index (PyPI) in about half the time: it downloads and
# unpacks in parallel (docs/guide/development.md). It compiles the bytecode as pip does. If uv cannot
# be installed or fails, pip installs everything instead.
$(VENV)/.installed: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q uv && $(PY) -m uv pip install -q --python $(PY) --compile-bytecode -e '.[test]' \
	  || { echo "uv failed: installing with pip"; $(PY) -m pip install -q --upgrade pip && $(PY) -m pip install -q -e '.[test]'; }
	touch $@

install: $(VENV)/.installed

## Train the default embedded setup (synthetic data, W&B offline) with fused async Adam.
run: install
	$(PY) -m runner optimizer=async_adam $(ARGS)

## The whole suite, slow tests included (what CI runs).
test: install
	$(PY) -m pytest -n 2 --dist worksteal --durations=30 $(PYTEST_ARGS)

## Everything but the slow (subprocess, sweep) tests.
test-fast: install
	$(PY) -m pytest -n 2 --dist worksteal -m "not slow" $(PYTEST_ARGS)

## The documentation site, into site/ (strict: a broken link or API reference fails). make test builds it too.
docs: install
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

## The benchmark suite (writes benchmarks/results/).
bench: install
	$(PY) -m benchmarks $(ARGS)

clean:
	rm -rf $(VENV) outputs/*/ multirun/ .pytest_cache .jax_cache build site
