# The two commands a new user needs: `make run` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
MODEL ?= demo
PROMPT ?= The list
STAMP := $(VENV)/.installed

.PHONY: run test install clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Reinstall when the project's dependencies change.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	touch $@

install: $(STAMP)

run: install
	$(BIN)/puffergpt load --model $(MODEL)
	$(BIN)/puffergpt generate --model $(MODEL) --temperature 0 -n 40 "$(PROMPT)"

test: install
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) .pytest_cache
