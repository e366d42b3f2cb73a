# The two commands a new user needs: `make run` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
MODEL ?= gpt2
HOST ?= 127.0.0.1
PORT ?= 8000
STAMP := $(VENV)/.installed

.PHONY: run test install browser clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Reinstall when the project's dependencies change.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	touch $@

install: $(STAMP)

# The browser tests drive Debian's Chromium (never a downloaded browser build).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; \
	  else echo "The browser tests need Debian's chromium: sudo apt-get install chromium"; exit 1; fi; }

# Serve the playground: GPT-2 small by default, `make run MODEL=demo` for the model that ships.
run: install
	$(BIN)/puffergpt serve --model $(MODEL) --host $(HOST) --port $(PORT)

test: install browser
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) .pytest_cache artifacts
