# The user-facing interface of the pipeline. Every target is a thin call into the one CLI
# (`python -m xla_wheels`); `make help` lists them. Variables: BUNDLE, DRY_RUN, MIRROR.

SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON_FOR_VENV ?= python3
VENV := .venv
PY := $(VENV)/bin/python
CLI := $(PY) -m xla_wheels
VENV_STAMP := $(VENV)/.installed-$(shell cat requirements-dev.txt pyproject.toml 2>/dev/null | sha256sum | cut -c1-16)

BUNDLE ?=
DRY_RUN ?=
MIRROR ?=
export DRY_RUN
MIRROR_ARG := $(if $(MIRROR),--mirror $(MIRROR),)
# Build stage: ENGINE=docker|podman|buildah, BUILD_MODE=container|host, JOBS=<n>,
# BUILDER_IMAGE=<ref>, HOST_PYTHON=<python3.13>; read by the CLI from the environment.
ENGINE ?= docker
BUILD_MODE ?= container
JOBS ?=
BUILDER_IMAGE ?= localhost/xla-wheels-builder:latest
export ENGINE BUILD_MODE JOBS BUILDER_IMAGE

.PHONY: help venv test lint bundles diff sources patch patches-check wheels lock lock-check clean
.PHONY: builder-image container-tools cache-tools

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | \
	  awk 'BEGIN {FS = ":.*## "} {printf "  make %-16s %s\n", $$1, $$2}'

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

venv: $(VENV_STAMP) ## create .venv with the pinned development dependencies

# The build-stage container tests need podman, buildah and debootstrap: installed from
# Debian when missing and we are root; otherwise those tests skip and say why.
container-tools:
	@if command -v podman >/dev/null && command -v buildah >/dev/null && command -v debootstrap >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman buildah debootstrap >/dev/null; \
	else echo "note: podman/buildah/debootstrap missing and not root: the container build tests will skip"; fi

# The shared compile-cache test (tests/test_remote_cache_ccache.py) needs a real ccache,
# redis-server and a C compiler: installed from Debian when missing and we are root.
cache-tools:
	@if command -v ccache >/dev/null && command -v redis-server >/dev/null && command -v cc >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ccache redis-server gcc >/dev/null; \
	else echo "note: ccache/redis-server/cc missing and not root: the shared compile-cache test will skip"; fi

test: $(VENV_STAMP) container-tools cache-tools ## install everything needed, then run ruff, mypy and the whole test suite
	$(PY) -m ruff check src tests scripts
	$(PY) -m mypy
	$(PY) -m pytest $(PYTEST_ARGS)

lint: $(VENV_STAMP) ## ruff and mypy only
	$(PY) -m ruff check src tests scripts
	$(PY) -m mypy

bundles: $(VENV_STAMP) ## list the bundles with their pins
	@$(CLI) bundles

diff: $(VENV_STAMP) ## what differs between two bundles: make diff A=v6e-2.9 B=v6e-2.11 (A alone: A against the bundle it extends)
	@$(CLI) diff $(A) $(B)

sources: $(VENV_STAMP) ## fetch the bundle's components at their pins: make sources BUNDLE=...
	@$(CLI) sources --bundle "$(BUNDLE)" $(MIRROR_ARG)

patch: $(VENV_STAMP) ## run up to the patch stage: make patch BUNDLE=...
	@$(CLI) patch --bundle "$(BUNDLE)" $(MIRROR_ARG)

patches-check: $(VENV_STAMP) ## apply the series to a scratch copy: make patches-check BUNDLE=... TORCH_XLA_SRC=<checkout>
	@$(CLI) patches-check --bundle "$(BUNDLE)" $(if $(TORCH_XLA_SRC),--source "$(TORCH_XLA_SRC)",) $(MIRROR_ARG)

COMPONENT ?= torch_xla
.PHONY: patch-export patch-rebase
patch-export: $(VENV_STAMP) ## write the worktree's patch commits back as patch files: make patch-export BUNDLE=... [COMPONENT=torch_xla] [FORCE=1]
	@$(CLI) patch-export --bundle "$(BUNDLE)" --component "$(COMPONENT)" $(if $(FORCE),--force,)

patch-rebase: $(VENV_STAMP) ## carry the series onto another commit: make patch-rebase BUNDLE=... ONTO=<commit> | CONTINUE=1 (CLI exit 3: stopped at a conflict)
	@$(CLI) patch-rebase --bundle "$(BUNDLE)" --component "$(COMPONENT)" $(if $(ONTO),--onto "$(ONTO)",) $(if $(CONTINUE),--continue,) $(MIRROR_ARG)

builder-image: $(VENV_STAMP) ## build the builder image from ./Dockerfile: make builder-image [ENGINE=docker|podman|buildah] [DRY_RUN=1]
	@$(CLI) builder-image

wheels: $(VENV_STAMP) ## the main job: make wheels BUNDLE=v6e-2.11 [DRY_RUN=1] [ENGINE=] [BUILD_MODE=host] [JOBS=] [KEEP_RECORDED=1] [BUILD_TAG=n] [SOURCE_DATE_EPOCH=]
	@$(CLI) wheels --bundle "$(BUNDLE)" $(MIRROR_ARG)

lock: $(VENV_STAMP) ## write the bundle's entry in wheels.lock: make lock BUNDLE=...
	@$(CLI) lock --bundle "$(BUNDLE)"

lock-check: $(VENV_STAMP) ## fail when a manifest or patch no longer matches wheels.lock
	@$(CLI) lock-check

clean: ## remove build work (out/); dist/, wheels.lock and the per-machine cache are kept
	rm -rf out

# Publish stage (README "Publish and install"). Credentials come from TWINE_USERNAME /
# TWINE_PASSWORD or keyring, never from these variables.
INDEX_URL ?=
.PHONY: publish requirements verify-install doctor
INDEX_ARG = $(if $(INDEX_URL),--index-url "$(INDEX_URL)",)

publish: $(VENV_STAMP) ## publish the locked wheels: make publish BUNDLE=... [LANE=validation] (or INDEX_URL=<simple/ URL>: that index, no lane)
	@$(if $(INDEX_URL),$(CLI) publish --bundle "$(BUNDLE)" $(INDEX_ARG) $(if $(UPLOAD_URL),--upload-url "$(UPLOAD_URL)",),\
	  $(CLI) publish-lane --bundle "$(BUNDLE)" $(if $(LANE),--lane "$(LANE)",))

requirements: $(VENV_STAMP) ## per lane: requirements.txt + pylock.toml in dist/lanes/<lane>/ [LANE=]; or BUNDLE=... [REFRESH=1]: dist/<bundle>/requirements.txt
	@$(if $(BUNDLE),$(CLI) requirements --bundle "$(BUNDLE)" $(if $(REFRESH),--refresh,),\
	  $(CLI) lane-requirements $(if $(LANE),--lane "$(LANE)",))

verify-install: $(VENV_STAMP) ## fresh venv installs by hash, checks lock/provenance: make verify-install BUNDLE=... [INDEX_URL=...] [NO_DEPS=1 DEPS_FROM=<python>]
	@$(CLI) verify-install --bundle "$(BUNDLE)" $(INDEX_ARG) $(if $(NO_DEPS),--no-deps,) \
	  $(if $(DEPS_FROM),--deps-from "$(DEPS_FROM)",) $(if $(PYTHON),--python "$(PYTHON)",)

doctor: $(VENV_STAMP) ## check a training host before import: make doctor BUNDLE=... [PYTHON=<training python>] [ROLE=writer|reader] [LANE=preferred] [CACHE_PATH=...]
	@$(CLI) doctor --bundle "$(BUNDLE)" $(if $(PYTHON),--python "$(PYTHON)",) $(if $(ROLE),--role "$(ROLE)",) \
	  $(if $(LANE),--lane "$(LANE)",) $(if $(CACHE_PATH),--cache-path "$(CACHE_PATH)",)

# Lanes (README "Releasing to the fleet"): build/lanes.toml, lanes.lock, receipts/<bundle>/.
.PHONY: promote compare lanes
promote: $(VENV_STAMP) ## copy a bundle's locked files into a lane if its policy holds: make promote BUNDLE=... [LANE=preferred] [CACHE_PATH=...] [DRY_RUN=1]
	@$(CLI) promote --bundle "$(BUNDLE)" $(if $(LANE),--lane "$(LANE)",) $(if $(CACHE_PATH),--cache-path "$(CACHE_PATH)",)

compare: $(VENV_STAMP) ## two bundles' receipts side by side: make compare A=... B=...
	@$(CLI) compare "$(A)" "$(B)"

lanes: $(VENV_STAMP) ## each lane's index, current bundle and policy
	@$(CLI) lanes

# ABI check (README "ABI check"): the symbols torch_xla's _XLAC imports that the paired torch
# does not export. Exit 0 nothing missing, 1 missing symbols named, 2 the pair cannot be read.
.PHONY: abi-check
abi-check: $(VENV_STAMP) ## undefined symbols of a pair: make abi-check PYTHON=<env python> | TORCH_WHEEL=... TORCH_XLA_WHEEL=... | BUNDLE=... | STOCK=2.8.0:2.9.0
	@$(CLI) abi-check $(if $(PYTHON),--python "$(PYTHON)",) $(if $(TORCH_WHEEL),--torch-wheel "$(TORCH_WHEEL)",) \
	  $(if $(TORCH_XLA_WHEEL),--torch-xla-wheel "$(TORCH_XLA_WHEEL)",) $(if $(BUNDLE),--bundle "$(BUNDLE)",) \
	  $(if $(XLAC),--extension "$(XLAC)",) $(if $(TORCH_LIB_DIR),--torch-lib-dir "$(TORCH_LIB_DIR)",) \
	  $(if $(STOCK),--stock "$(STOCK)",)

# Gate (src/xla_wheels/gate/README.md): judge a torch_xla environment in fresh processes. Without PYTHON,
# a cached stock torch_xla 2.9.0 env is built once per machine and shows the cache defect.
# Exit 0 pass, 1 a check failed, 2 the environment cannot be judged.
GATE_DEVICE ?=
WORKLOAD ?=
CHECKS ?=
UPSTREAM_TESTS ?=
GATE_ARGS ?=
.PHONY: gate bench-restart
GATE_FLAGS = $(if $(PYTHON),--python "$(PYTHON)",) $(if $(GATE_DEVICE),--device "$(GATE_DEVICE)",) \
  $(if $(WORKLOAD),--workload "$(WORKLOAD)",) $(if $(BUNDLE),--bundle "$(BUNDLE)",)

gate: $(VENV_STAMP) ## ship gate + receipt (restart, spmd-restart, cache-key, same-numbers, hbm): make gate [BUNDLE=...] [PYTHON=...] [GATE_DEVICE=CPU|TPU] [WORKLOAD=small|medium|large] [CHECKS=...] [UPSTREAM_TESTS=<pytorch/xla checkout>] [GATE_ARGS=--record-baseline]
	@$(CLI) gate $(GATE_FLAGS) $(if $(CHECKS),--checks "$(CHECKS)",) $(if $(UPSTREAM_TESTS),--upstream-tests "$(UPSTREAM_TESTS)",) $(GATE_ARGS)

bench-restart: $(VENV_STAMP) ## restart benchmark, cold/warm medians and executable-load time: make bench-restart [PYTHON=...] [GATE_DEVICE=...] [WORKLOAD=medium] [ROUNDS=5]
	@$(CLI) bench-restart $(GATE_FLAGS) $(if $(ROUNDS),--rounds "$(ROUNDS)",)
