VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# How long `make run`'s fleet runs, in seconds (starting, stopping and the audit come on top).
RUN_SECONDS ?= 60
# `make run FOLLOW=1`: mconn-pipeline --follow shows the fleet live on http://127.0.0.1:8090/.
FOLLOW ?=

.PHONY: test lint run bench clean

$(STAMP): setup.cfg pyproject.toml setup.py mconn/core/_speedups.pyx mconn/net/_wsframe.pyx
	# Debian packages the tests use: java for Spark, tmux for the chat terminal test,
	# chromium for the status page test, prometheus for the /metrics test, nginx and
	# squid for the WebSocket proxy tests, iproute2 for the network namespaces of the
	# IPv6 prefix tests; gcc and the Python headers for the compiled twin of the
	# per-packet path (mconn/core/_speedups.pyx). Installed only when missing; a policy-rc.d
	# keeps the packages' own services from starting (the tests start their own on
	# loopback and stop them by PID).
	missing=""; \
	command -v java >/dev/null 2>&1 || missing="$$missing default-jre-headless"; \
	command -v tmux >/dev/null 2>&1 || missing="$$missing tmux"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	test -x /usr/bin/prometheus || missing="$$missing prometheus"; \
	test -x /usr/sbin/nginx || missing="$$missing nginx"; \
	test -x /usr/sbin/squid || missing="$$missing squid"; \
	command -v ip >/dev/null 2>&1 || missing="$$missing iproute2"; \
	command -v gcc >/dev/null 2>&1 || missing="$$missing gcc"; \
	python3 -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
	  || missing="$$missing python3-dev"; \
	if [ -n "$$missing" ]; then \
	  policy=""; if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && policy=1; fi; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; rc=$$?; \
	  if [ -n "$$policy" ]; then rm -f /usr/sbin/policy-rc.d; fi; \
	  test $$rc -eq 0; \
	fi
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# Builds the compiled twin too (setup.py; Cython is a build dependency); if that
	# fails the install goes on and mconn runs on pure Python. The line says which.
	$(PY) -m pip install -q -e '.[test,pipeline,chat,typed]'
	$(VENV)/bin/mconn --version
	touch $(STAMP)

# ruff and mypy read their settings from pyproject.toml (ruff skips .venv, bench/out and
# tests/artifacts; mypy checks mconn/, strict for mconn/core/).
lint: $(STAMP)
	$(PY) -m ruff format --check .
	$(PY) -m ruff check .
	$(PY) -m mypy

# The whole suite runs on what `mconn --version` says (the compiled twin when it is built);
# tests/core, tests/adapter and PURE_WIRE_TESTS run a second time on the pure-Python functions.
# The real-socket tests of the data path (TCP, TLS, ws and wss; resume, limits, hostile
# peers), run again on the pure-Python twins: they are what the compiled ones replace.
PURE_WIRE_TESTS = $(addprefix tests/integration/test_,$(addsuffix .py,loopback resume resume_scenarios \
	packet_floor packet_size limits_every_transport hostile websocket websocket_direct websocket_packets \
	websocket_resume write_through tls read_at_accept))

test: lint
	$(PY) -m pytest -q
	MCONN_PURE=1 $(PY) -m pytest -q tests/core tests/adapter $(PURE_WIRE_TESTS)

run: $(STAMP)
	$(PY) examples/fleet.py --duration $(RUN_SECONDS) $(if $(FOLLOW),--follow)

bench: $(STAMP)
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) *.egg-info build mconn/core/_speedups.c mconn/core/_speedups.*.so
