# The two commands a new user needs: `make run` and `make test` (and `make test-fast` while working).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Set these on the command line (`make run MODEL=gpt2 PORT=8001`); a MODEL or HOST exported
# for something else in the environment is not taken.
MODEL :=
HOST := 127.0.0.1
PORT := 8000
# One stamp per install: serving needs only the base dependencies, the tests the test extra.
SERVE_STAMP := $(VENV)/.installed-serve
TEST_STAMP := $(VENV)/.installed-test

.PHONY: run test test-fast lint install install-serve system clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Reinstall when the project's dependencies change. No torch, transformers, Playwright or
# pgserver here, so a fresh `make run` installs in a minute, not a 1.8 GB environment.
$(SERVE_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

$(TEST_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	touch $@

install-serve: $(SERVE_STAMP)

install: $(TEST_STAMP)

# Debian's packages the tests drive: Chromium for the browser tests (never a downloaded
# browser build); qemu-user to run the embedded store on emulated CPUs without AVX-512 or AVX2;
# HAProxy, the load balancer in front of several servers (tests/stores/test_pg_servers.py).
SYSTEM_PKGS := chromium:chromium qemu-x86_64:qemu-user haproxy:haproxy
# And the demo model's training text, which tests/test_token_counts.py counts again.
SYSTEM_FILES := /usr/share/wordnet/data.noun:wordnet-base /usr/share/games/fortunes/fortunes:fortunes-min \
	/usr/share/games/fortunes/art:fortunes
system:
	@missing=""; for p in $(SYSTEM_PKGS); do PATH="$$PATH:/usr/sbin:/sbin" command -v $${p%%:*} >/dev/null 2>&1 || missing="$$missing $${p#*:}"; done; \
	for f in $(SYSTEM_FILES); do [ -f $${f%%:*} ] || missing="$$missing $${f#*:}"; done; \
	[ -z "$$missing" ] || { if [ "$$(id -u)" = 0 ]; then apt-get update -q && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	  else echo "The tests need Debian's$$missing: sudo apt-get install$$missing"; exit 1; fi; }

# Serve the playground. With no MODEL: GPT-2 small (downloaded once, verified) or, when the
# hub can't be reached, the demo model that ships, saying so. `make run MODEL=gpt2` insists
# on GPT-2 small (an error offline); MODEL=demo or MODEL=PATH serve those.
run: $(SERVE_STAMP)
	$(BIN)/puffergpt serve $(if $(MODEL),--model '$(MODEL)' )--host $(HOST) --port $(PORT)

# The linter first: its findings take a second to read, a failing suite minutes.
lint: install
	$(BIN)/ruff check src tests scripts benchmarks

# Everything, offline: the browser, PostgreSQL with pgvector and the torch oracle included.
test: install lint system
	$(BIN)/python -m pytest -q

# The fast tier: the tests that need no Chromium, no PostgreSQL and no torch (the markers are
# applied in tests/conftest.py). Run `make test` before you commit.
test-fast: install lint system
	$(BIN)/python -m pytest -q -m "not browser and not pgvector and not oracle"

clean:
	rm -rf $(VENV) .pytest_cache artifacts
