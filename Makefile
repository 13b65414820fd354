# Fresh machine: `make demo` and `make test` create .venv and install what they need.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: install demo test test-quick lint format bench bench-peer-env bench-render docs docs-serve clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned: this picks the local CPU build instead of several GB of CUDA wheels
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e ".[all,dev]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/isotrope demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/python -m ruff check src connectors tests benchmarks docs/_hooks
	$(BIN)/python -m ruff format --check src connectors tests benchmarks docs/_hooks
	$(BIN)/python -m mypy

format: $(STAMP)
	$(BIN)/python -m ruff check --fix src connectors tests benchmarks docs/_hooks
	$(BIN)/python -m ruff format src connectors tests benchmarks docs/_hooks

# everything but the tests marked slow (@pytest.mark.slow: more than ~3 s each)
test-quick: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

# the documentation site (mkdocs.yml): built strictly into site/, or served at http://127.0.0.1:8000
docs: $(STAMP)
	$(BIN)/python -m mkdocs build --strict

docs-serve: $(STAMP)
	$(BIN)/python -m mkdocs serve

# the encode topic, quick (a few minutes on 2 idle cores); other topics: python -m benchmarks --help
DATA_DIR ?= ../shared/data
PEER := .venv-st-onnx
bench: $(STAMP)
	$(BIN)/python -m benchmarks encode --quick --data-dir $(DATA_DIR)

# the peers: sentence-transformers' ONNX backends for the encode topic (optimum-onnx pins transformers 4.57,
# so they live in an environment of their own that borrows torch (and the rest) from .venv through a .pth
# file), and LlamaIndex's BM25Retriever for the hybrid topic (into .venv)
bench-peer-env: $(STAMP)
	$(PYTHON) -m venv $(PEER)
	$(BIN)/python -c "import site; print(site.getsitepackages()[0])" > $$(ls -d $(PEER)/lib/python3*/site-packages)/main-venv.pth
	$(PEER)/bin/pip install -q "optimum-onnx==0.1.0" "transformers==4.57.6" "sentence-transformers>=5,<6"
	$(BIN)/pip install -q -e ".[bench-peers]"

bench-render: $(STAMP)
	$(BIN)/python -m benchmarks render

clean:
	rm -rf $(VENV) .isotrope-demo .pytest_cache site
