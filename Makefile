# Two commands for a new user: `make demo` and `make test`. Both build or refresh .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_OUT ?= demo_out
DEMO_ARGS ?=
PYTEST_ARGS ?=

.PHONY: venv demo test lint bench clean

venv: $(STAMP)

# torch is installed on its own first: an unpinned resolver run would otherwise be free to
# pull a multi-GB CUDA build where the pinned CPU wheel is what this machine has.
$(STAMP): requirements.txt requirements-dev.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q --disable-pip-version-check "torch==2.13.0"
	$(PY) -m pip install -q --disable-pip-version-check -r requirements-dev.txt
	@touch $(STAMP)

demo: $(STAMP)
	$(PY) demo.py --output $(DEMO_OUT) $(DEMO_ARGS)

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(PY) -m ruff check .

clean:
	rm -rf $(VENV) .cache $(DEMO_OUT)
