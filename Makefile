VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# How long `make run`'s fleet runs, in seconds (starting, stopping and the audit come on top).
RUN_SECONDS ?= 60

.PHONY: test run bench clean

$(STAMP): setup.cfg pyproject.toml
	# Debian packages the tests use: java for Spark, tmux for the chat terminal test,
	# chromium for the status page test. Installed only when missing.
	missing=""; \
	command -v java >/dev/null 2>&1 || missing="$$missing default-jre-headless"; \
	command -v tmux >/dev/null 2>&1 || missing="$$missing tmux"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	if [ -n "$$missing" ]; then apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; fi
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,pipeline,chat]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

run: $(STAMP)
	$(PY) examples/fleet.py --duration $(RUN_SECONDS)

bench: $(STAMP)
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) *.egg-info
