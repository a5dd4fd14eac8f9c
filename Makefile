# Two commands for a new user: `make demo` and `make test`. Both build or refresh .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_OUT ?= demo_out
DEMO_ARGS ?=
PYTEST_ARGS ?=

.PHONY: venv demo test lint clean demo-tools test-tools

venv: $(STAMP)

# System tools: installed with apt-get when we are root on Debian/Ubuntu, otherwise named
# with the command that installs them. The demo downloads through data/hfd.sh (curl, jq,
# aria2c or wget); the tests exercise both aria2c and wget, and git hashes blobs.
DEMO_TOOLS := curl jq
TEST_TOOLS := curl jq aria2c wget git
define ensure_tools
	@missing=""; for t in $(1); do command -v $$t >/dev/null 2>&1 || missing="$$missing $$t"; done; \
	if [ "$(2)" = demo ] && ! command -v aria2c >/dev/null 2>&1 && ! command -v wget >/dev/null 2>&1; then missing="$$missing aria2c"; fi; \
	$(PYTHON) -c "import ensurepip, venv" 2>/dev/null || missing="$$missing python3-venv"; \
	pkgs=$$(echo $$missing | sed 's/aria2c/aria2/'); \
	if [ -n "$$pkgs" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing system packages: $$pkgs"; \
	    DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$pkgs >/dev/null; \
	  else echo "error: missing system packages:$$pkgs; install them with: sudo apt-get install $$pkgs" >&2; exit 1; fi; \
	fi
endef

demo-tools:
	$(call ensure_tools,$(DEMO_TOOLS),demo)

test-tools:
	$(call ensure_tools,$(TEST_TOOLS),test)

# src/install.py keeps a torch already in .venv (a CUDA build installed first, README "Training on
# GPUs"), installs the tested torch only where there is none, picks the one DALI variant for torch's
# CUDA version, and installs the requirements with torch and triton pinned to what is there.
# It runs again when the requirements change or torch or DALI in .venv were reinstalled since.
INSTALLED := $(wildcard $(VENV)/lib/python*/site-packages/torch-*.dist-info \
                        $(VENV)/lib/python*/site-packages/nvidia_dali_cuda*.dist-info)
$(STAMP): requirements.txt requirements-dev.txt src/install.py $(INSTALLED)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@rm -f $(STAMP)
	$(PY) -m src.install -r requirements-dev.txt
	@touch $(STAMP)

demo: demo-tools $(STAMP)
	$(PY) demo.py --output $(DEMO_OUT) $(DEMO_ARGS)

test: test-tools $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

clean:
	rm -rf $(VENV) .cache $(DEMO_OUT)
