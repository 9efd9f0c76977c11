VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test run bench clean

$(STAMP): setup.cfg pyproject.toml
	command -v java >/dev/null 2>&1 || { apt-get update -q && apt-get install -y -q default-jre-headless; }
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,pipeline]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

run: $(STAMP)
	$(PY) examples/two_nodes.py

bench: $(STAMP)
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) *.egg-info
