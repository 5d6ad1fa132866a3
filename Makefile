# The user-facing interface of the pipeline. Every target is a thin call into the one CLI
# (`python -m xla_wheels`); `make help` lists the targets and the variables each reads.
#
# Variables are passed through, never defaulted here: the defaults live in
# src/xla_wheels/options.py (and `python -m xla_wheels <command> --help` shows them). The
# block below is the one place where make's short variables become the CLI's flags; an
# unset variable adds no flag, so the CLI's XLA_WHEELS_* environment and defaults apply.

SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON_FOR_VENV ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CLI := $(PY) -m xla_wheels
VENV_STAMP := $(VENV)/.installed-$(shell cat requirements-dev.txt pyproject.toml 2>/dev/null | sha256sum | cut -c1-16)

# --- make variable -> CLI flag (the one mapping) ------------------------------------
flag = $(if $($(1)),$(2) '$($(1))',)
truthy = $(filter 1 true yes on,$(1))
BUNDLE_FLAGS = $(call flag,BUNDLE,--bundle) $(call flag,MIRROR,--mirror)
DRY_RUN_FLAG = $(if $(call truthy,$(DRY_RUN)),--dry-run,)
BUILD_FLAGS = $(call flag,ENGINE,--engine) $(call flag,BUILD_MODE,--mode) \
  $(call flag,JOBS,--jobs) $(call flag,BUILDER_IMAGE,--image) \
  $(call flag,HOST_PYTHON,--host-python)
INDEX_FLAGS = $(call flag,INDEX_URL,--index-url)
GATE_FLAGS = $(call flag,PYTHON,--python) $(call flag,GATE_DEVICE,--device) \
  $(call flag,WORKLOAD,--workload)

.PHONY: help venv test lint bundles diff sources patch patches-check wheels lock lock-check clean
.PHONY: builder-image container-tools

help: ## list the targets and the variables each one reads
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | \
	  awk 'BEGIN {FS = ":.*## "} {printf "  make %-16s %s\n", $$1, $$2}'
	@echo "Variables are passed as the CLI flags above; unset ones take the CLI's defaults"
	@echo "(XLA_WHEELS_* in the environment, then src/xla_wheels/options.py)."

$(VENV_STAMP): requirements-dev.txt pyproject.toml
	@command -v git >/dev/null || { echo "error: git is required (apt-get install git)"; exit 2; }
	@$(PYTHON_FOR_VENV) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
	  { echo "error: Python >= 3.11 is required for the pipeline (set PYTHON_FOR_VENV=)"; exit 2; }
	@# venv needs Debian's python3-venv where Python comes from Debian; install it if missing.
	@$(PYTHON_FOR_VENV) -m venv --help >/dev/null 2>&1 || \
	  { apt-get update -qq && apt-get install -y -qq python3-venv; }
	@# Under flock: two make runs in one checkout must not rebuild .venv at the same time
	@# (one would delete the interpreter the other is installing with).
	@flock $(VENV).lock bash -euc '\
	  if [ -e $@ ]; then touch $@; exit 0; fi; \
	  echo "creating $(VENV) from requirements-dev.txt"; \
	  rm -rf $(VENV); \
	  $(PYTHON_FOR_VENV) -m venv $(VENV); \
	  $(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt; \
	  $(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .; \
	  touch $@'

venv: $(VENV_STAMP) ## create .venv with the pinned development dependencies [PYTHON_FOR_VENV=python3]

# The build-stage container tests need podman, buildah and debootstrap: installed from
# Debian when missing and we are root; otherwise those tests skip and say why.
container-tools:
	@if command -v podman >/dev/null && command -v buildah >/dev/null && command -v debootstrap >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman buildah debootstrap >/dev/null; \
	else echo "note: podman/buildah/debootstrap missing and not root: the container build tests will skip"; fi

test: $(VENV_STAMP) container-tools ## install everything needed, then run ruff, mypy and the whole test suite [PYTEST_ARGS=] [PYTHON_FOR_VENV=]
	$(PY) -m ruff check src tests scripts
	$(PY) -m mypy
	$(PY) -m pytest $(PYTEST_ARGS)

lint: $(VENV_STAMP) ## ruff and mypy only
	$(PY) -m ruff check src tests scripts
	$(PY) -m mypy

bundles: $(VENV_STAMP) ## list the bundles with their pins
	@$(CLI) bundles

diff: $(VENV_STAMP) ## what differs between two bundles: make diff A=v6e-2.9 B=v6e-2.11
	@$(CLI) diff '$(A)' '$(B)'

sources: $(VENV_STAMP) ## fetch the bundle's components at their pins: make sources BUNDLE=... [MIRROR=] [DRY_RUN=1]
	@$(CLI) sources $(BUNDLE_FLAGS) $(DRY_RUN_FLAG)

patch: $(VENV_STAMP) ## run up to the patch stage: make patch BUNDLE=... [MIRROR=] [DRY_RUN=1]
	@$(CLI) patch $(BUNDLE_FLAGS) $(DRY_RUN_FLAG)

patches-check: $(VENV_STAMP) ## apply the series to a scratch copy: make patches-check BUNDLE=... [TORCH_XLA_SRC=<checkout>] [MIRROR=]
	@$(CLI) patches-check $(BUNDLE_FLAGS) $(call flag,TORCH_XLA_SRC,--source)

builder-image: $(VENV_STAMP) ## build the builder image from ./Dockerfile: make builder-image [ENGINE=docker|podman|buildah] [BUILDER_IMAGE=] [DRY_RUN=1]
	@$(CLI) builder-image $(DRY_RUN_FLAG) $(call flag,ENGINE,--engine) \
	  $(call flag,BUILDER_IMAGE,--image)

wheels: $(VENV_STAMP) ## the main job: make wheels BUNDLE=v6e-2.11 [DRY_RUN=1] [MIRROR=] [ENGINE=] [BUILD_MODE=host] [JOBS=] [BUILDER_IMAGE=] [HOST_PYTHON=]
	@$(CLI) wheels $(BUNDLE_FLAGS) $(DRY_RUN_FLAG) $(BUILD_FLAGS)

lock: $(VENV_STAMP) ## write the bundle's entry in wheels.lock: make lock BUNDLE=... [MIRROR=]
	@$(CLI) lock $(BUNDLE_FLAGS)

lock-check: $(VENV_STAMP) ## fail when a manifest or patch no longer matches wheels.lock
	@$(CLI) lock-check

clean: ## remove build work (out/); dist/, wheels.lock and the per-machine cache are kept
	rm -rf out

# Publish stage (README "Publish and install"). Credentials come from TWINE_USERNAME /
# TWINE_PASSWORD or keyring, never from these variables.
.PHONY: publish requirements verify-install doctor

publish: $(VENV_STAMP) ## upload the locked wheels: make publish BUNDLE=... [INDEX_URL=<simple/ URL>] [UPLOAD_URL=] (no INDEX_URL: static index in dist/<bundle>/simple)
	@$(CLI) publish $(call flag,BUNDLE,--bundle) $(INDEX_FLAGS) $(call flag,UPLOAD_URL,--upload-url)

requirements: $(VENV_STAMP) ## hash-pinned requirements for hosts: make requirements BUNDLE=... [REFRESH=1]
	@$(CLI) requirements $(call flag,BUNDLE,--bundle) $(if $(call truthy,$(REFRESH)),--refresh,)

verify-install: $(VENV_STAMP) ## fresh venv installs by hash, checks lock/provenance: make verify-install BUNDLE=... [INDEX_URL=...] [NO_DEPS=1 DEPS_FROM=<python>] [PYTHON=]
	@$(CLI) verify-install $(call flag,BUNDLE,--bundle) $(INDEX_FLAGS) $(if $(call truthy,$(NO_DEPS)),--no-deps,) \
	  $(call flag,DEPS_FROM,--deps-from) $(call flag,PYTHON,--python)

doctor: $(VENV_STAMP) ## check a training host before import: make doctor BUNDLE=... [PYTHON=<training python>] [ROLE=writer|reader]
	@$(CLI) doctor $(call flag,BUNDLE,--bundle) $(call flag,PYTHON,--python) $(call flag,ROLE,--role)

# Gate (src/xla_wheels/gate/README.md): judge a torch_xla environment in fresh processes. Without PYTHON,
# a cached stock torch_xla 2.9.0 env is built once per machine and shows the cache defect.
# Exit 0 pass, 1 a check failed, 2 the environment cannot be judged.
.PHONY: gate bench-restart

gate: $(VENV_STAMP) ## ship gate, warm restart + HBM query: make gate [PYTHON=...] [GATE_DEVICE=CPU|TPU] [WORKLOAD=small|large] [CHECKS=restart,hbm] [GATE_ARGS=--record-baseline]
	@$(CLI) gate $(GATE_FLAGS) $(call flag,CHECKS,--checks) $(GATE_ARGS)

bench-restart: $(VENV_STAMP) ## restart benchmark, cold/warm medians: make bench-restart [PYTHON=...] [GATE_DEVICE=...] [WORKLOAD=] [ROUNDS=5]
	@$(CLI) bench-restart $(GATE_FLAGS) $(call flag,ROUNDS,--rounds)
