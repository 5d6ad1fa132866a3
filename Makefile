# The user-facing interface of the pipeline. Every target is a thin call into the one CLI
# (`python -m xla_wheels`); `make help` lists the targets by purpose, `make help TARGET=gate`
# the variables one reads with their defaults, and an example (generated from this file's
# `## ` summaries, the table below and the CLI's own --help: src/xla_wheels/make_help.py, through `make generate`).
#
# Variables are passed through, never defaulted here: the defaults live in the settings
# table's rows (host/src/xla_host/settings.py and src/xla_wheels/settings_rows.py), which src/xla_wheels/cli/settings.py reads
# (and `python -m xla_wheels <command> --help` shows them). The
# block below is the one place where make's short variables become the CLI's flags; an
# unset variable adds no flag, so the CLI's XLA_WHEELS_* environment and defaults apply.

SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON_FOR_VENV ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The CLI learns it runs under make: the target and the variables given on the command
# line (src/xla_wheels/cli/from_make.py; it reads the variable table from the settings table).
# Every target that runs Python goes through it (the make-variable check): the CLI, the
# demo, and MAKE_CHECK before the development tools.
MAKE_CONTEXT = XLA_WHEELS_MAKE_GOAL=$@ XLA_WHEELS_MAKE_COMMAND_LINE='$(GIVEN_ON_COMMAND_LINE)'
CLI = $(MAKE_CONTEXT) $(PY) -m xla_wheels
DEMO = $(MAKE_CONTEXT) $(PY) -m xla_wheels.demo
MAKE_CHECK = $(MAKE_CONTEXT) $(PY) -m xla_wheels.cli.make_check
VENV_STAMP := $(VENV)/.installed-$(shell cat requirements-dev.txt pyproject.toml host/pyproject.toml 2>/dev/null | sha256sum | cut -c1-16)

# --- make variable -> CLI flag (the one mapping) ------------------------------------
# MAKE_VARIABLES (every variable a target reads, as NAME=--flag) is written
# from the settings table, src/xla_wheels/settings_table.py: a setting is one row there.
include src/xla_wheels/make-variables.mk
flag_of = $(patsubst $(1)=%,%,$(filter $(1)=%,$(MAKE_VARIABLES)))
# A value reaches the shell single-quoted, whatever it holds.
quote = '$(subst ','\'',$(1))'
# Values are passed as the user wrote them: the CLI owns the rules (a switch's spellings,
# a number's range) and refuses what it does not understand; make interprets nothing.
flag = $(if $($(1)),$(call flag_of,$(1))=$(call quote,$($(1))),)
arg = $(if $($(1)),$(call quote,$($(1))),)
switch = $(flag)
# A variable the command reads from its environment, as that tool's own standard.
env = $(if $($(1)),$(1)=$(call quote,$($(1))),)
GIVEN_ON_COMMAND_LINE = $(strip $(foreach v,$(.VARIABLES),$(if $(filter command line,$(origin $(v))),$(v))))
# SOURCE_DATE_EPOCH is the reproducible-builds standard variable: read from the
# environment as every tool reads it.
BUILD_ENV = $(call env,SOURCE_DATE_EPOCH)
# FLAGS_<COMMAND> (every variable the command takes, as it is passed) is written from the
# CLI's parsers by `make generate`: a recipe never lists a command's variables.
include src/xla_wheels/make-commands.mk
DRY_RUN_FLAG = $(call switch,DRY_RUN)

.PHONY: help venv test test-fast lint format generate docs demo bundles diff sources patch patches-check series-compile wheels lock lock-check record clean
.PHONY: builder-image container-tools cache-tools bazel-cache-tools compiler-tools patch-export patch-rebase

# Printed from files generated from this Makefile and the CLI, so that it needs no .venv
# (tests/test_help.py checks they are current; `make generate` writes them).
# TARGET=<target>: its paragraph of make-help-targets.txt (awk's paragraph mode).
help: ## the targets by purpose; TARGET=<target>: its variables, defaults, example
	@if [ -z "$(TARGET)" ]; then cat src/xla_wheels/make-help.txt; \
	else awk -v want="make $(TARGET)" 'BEGIN { RS = "" } \
	  index($$0, want " ") == 1 || $$0 == want { print; found = 1 } END { exit !found }' \
	  src/xla_wheels/make-help-targets.txt || \
	  { echo "error: make help TARGET=$(TARGET): no such target" >&2; \
	    echo "  fix: make help (lists the targets), then make help TARGET=<one of them>" >&2; \
	    exit 2; }; fi

$(VENV_STAMP): requirements-dev.txt pyproject.toml host/pyproject.toml
	@command -v git >/dev/null || { echo "error: git is required (apt-get install git)"; exit 2; }
	@$(PYTHON_FOR_VENV) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
	  { echo "error: Python >= 3.11 is required for the pipeline (set PYTHON_FOR_VENV=)"; exit 2; }
	@# venv needs Debian's python3-venv where Python comes from Debian; install it if missing.
	@$(PYTHON_FOR_VENV) -m venv --help >/dev/null 2>&1 || \
	  { apt-get update -qq && apt-get install -y -qq python3-venv; }
	@# Under flock: two make runs in one checkout must not rebuild .venv at the same time
	@# (one would delete the interpreter the other is installing with). Bytecode is
	@# compiled at install (pip's default), once: where PYTHONDONTWRITEBYTECODE is set no
	@# import ever writes it, and every twine, devpi or pytest start would compile its
	@# modules again (15 CPU-s of make test-fast; the install takes 5 s longer).
	@flock $(VENV).lock bash -euc '\
	  if [ -e $@ ]; then touch $@; exit 0; fi; \
	  echo "creating $(VENV) from requirements-dev.txt"; \
	  rm -rf $(VENV); \
	  $(PYTHON_FOR_VENV) -m venv $(VENV); \
	  $(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt; \
	  $(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e ./host -e .; \
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
# redis-server and a C compiler: installed from Debian when missing and we are root. The
# series' compiled checks use ccache too when it is there (a per-machine compile cache).
cache-tools: ## install ccache, redis-server and gcc from Debian when missing (root only)
	@if command -v ccache >/dev/null && command -v redis-server >/dev/null && command -v cc >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ccache redis-server gcc >/dev/null; \
	else echo "note: ccache/redis-server/cc missing and not root: the shared compile-cache test will skip, the series' compiled checks compile without a cache"; fi

# The Bazel half of the shared compile cache (tests/test_remote_cache_bazel.py) needs a real
# Bazel (Debian's bazel-bootstrap: Bazel 4.2.3), nginx (the HTTP cache) and a C compiler:
# installed from Debian when missing and we are root. BuildGrid, the gRPC cache, is pinned
# in tests/buildgrid-requirements.txt and installed by the test into the per-machine cache.
bazel-cache-tools:
	@if command -v bazel >/dev/null && PATH="$$PATH:/usr/sbin" command -v nginx >/dev/null && command -v cc >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bazel-bootstrap nginx gcc >/dev/null; \
	else echo "note: bazel/nginx/cc missing and not root: the Bazel remote-cache tests will skip"; fi

# The compiled checks of the patch series (README "Compiled checks of the series") need g++;
# absl and googletest come from pinned Debian packages the tests unpack into the
# per-machine cache, clang-format from requirements-dev.txt: nothing else system-wide.
compiler-tools:
	@if command -v g++ >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ >/dev/null; \
	else echo "note: g++ missing and not root: the compiled checks of the series will fail (install g++)"; fi

# The suite runs on every core (pytest-xdist); --dist loadgroup keeps the readers of a gate
# run made once per pytest run, and the tests sharing a module's fixture, on one worker
# (tests/conftest.py): spread over two, the second waits for the first to make it.
PARALLEL_FLAGS := -n auto --dist loadgroup
# The edit loop's tier: no gate run, no stock torch_xla, no container engine (README "Development").
FAST_TIER_FLAGS := -m 'not slow and not stock_xla'
# The suite starts the command lines over a thousand times: their bytecode is written
# first (git-ignored __pycache__), also where PYTHONDONTWRITEBYTECODE keeps imports from
# writing it; without it each start compiled every module it imports again.
COMPILE_SOURCES = $(PY) -m compileall -q src host/src scripts

test: $(VENV_STAMP) container-tools cache-tools bazel-cache-tools compiler-tools supply-tools ## install everything needed, then run ruff, mypy and the whole test suite
	@$(MAKE_CHECK)
	$(PY) -m ruff check src host/src tests scripts tools
	$(PY) -m ruff format --check src host/src tests scripts tools
	$(COMPILE_SOURCES)
	@# mypy runs inside the suite (tests/test_types.py), beside the other tests.
	$(PY) -m pytest $(PARALLEL_FLAGS) $(PYTEST_ARGS)

test-fast: $(VENV_STAMP) compiler-tools ## the edit loop: ruff, the tests needing no gate, stock torch_xla or engine
	@$(MAKE_CHECK)
	$(PY) -m ruff check src host/src tests scripts tools
	$(PY) -m ruff format --check src host/src tests scripts tools
	$(COMPILE_SOURCES)
	$(PY) -m pytest $(PARALLEL_FLAGS) $(FAST_TIER_FLAGS) $(PYTEST_ARGS)

lint: $(VENV_STAMP) ## ruff (check and format) and mypy only
	@$(MAKE_CHECK)
	$(PY) -m ruff check src host/src tests scripts tools
	$(PY) -m ruff format --check src host/src tests scripts tools
	$(PY) -m mypy

# Every file written from the code (tools/generate.py lists the generators); the tests fail
# while one is stale, naming this target.
generate: $(VENV_STAMP) ## write every generated file (docs tables, make help, make-*.mk) from the code
	@$(MAKE_CHECK)
	$(PY) tools/generate.py

# ruff's formatter is the one style (make lint, make test and make test-fast check it).
format: $(VENV_STAMP) ## format the sources with ruff (what make lint checks)
	@$(MAKE_CHECK)
	$(PY) -m ruff format src host/src tests scripts tools

# The documentation site (mkdocs.yml: README.md's pages under docs/), strict: a broken link
# or a page left out of the nav fails (tests/test_docs.py builds it the same way).
docs: $(VENV_STAMP) ## build the documentation site from docs/ into site/ (open site/index.html)
	@$(MAKE_CHECK)
	$(PY) -m mkdocs build --strict --site-dir site

# No builder host yet? Every stage of the pipeline on a demonstration upstream it writes
# (NOT torch), then the TPU host's runbook against its lane: offline, about half a
# CPU-minute, everything under DEMO_DIR (src/xla_wheels/demo.py).
demo: $(VENV_STAMP) ## every stage, manifest to doctor, on a demonstration upstream, offline
	@$(DEMO) $(call flag,DEMO_DIR) $(DRY_RUN_FLAG)

bundles: $(VENV_STAMP) ## list the bundles with their pins
	@$(CLI) bundles $(FLAGS_BUNDLES)

diff: $(VENV_STAMP) ## what differs between two bundles (A alone: A against the bundle it extends)
	@$(CLI) diff $(FLAGS_DIFF)

sources: $(VENV_STAMP) ## fetch the bundle's components at their pins
	@$(CLI) sources $(FLAGS_SOURCES)

patch: $(VENV_STAMP) ## run up to the patch stage (sources, then the patch series)
	@$(CLI) patch $(FLAGS_PATCH)

patches-check: $(VENV_STAMP) ## apply the bundle's series to a scratch copy of a checkout, report each patch
	@$(CLI) patches-check $(FLAGS_PATCHES_CHECK)

# The series' translation units compiled base and patched against real XLA headers (a
# tensorflow-cpu wheel's), torch's and Debian's LLVM, fetched once per machine
# (docs/patches.md, "Compiled against real XLA headers").
series-compile: $(VENV_STAMP) compiler-tools ## compile the units the series touches, base and patched, on real XLA headers
	@$(CLI) series-compile $(FLAGS_SERIES_COMPILE)

patch-export: $(VENV_STAMP) ## write the patched worktree's commits back as the bundle's patch files
	@$(CLI) patch-export $(FLAGS_PATCH_EXPORT)

patch-rebase: $(VENV_STAMP) ## carry the series onto ONTO=<commit>; CONTINUE=1 after a conflict (exit 3)
	@$(CLI) patch-rebase $(FLAGS_PATCH_REBASE)

builder-image: $(VENV_STAMP) ## build the builder image from ./Dockerfile
	@$(CLI) builder-image $(FLAGS_BUILDER_IMAGE)

wheels: $(VENV_STAMP) ## the main job: sources, patches, build, collect, lock
	@$(BUILD_ENV) $(CLI) wheels $(FLAGS_WHEELS)

lock: $(VENV_STAMP) ## write the bundle's entry in wheels.lock
	@$(CLI) lock $(FLAGS_LOCK)

lock-check: $(VENV_STAMP) ## fail when a manifest or patch no longer matches wheels.lock
	@$(CLI) lock-check $(FLAGS_LOCK_CHECK)

record: $(VENV_STAMP) ## record wheels built elsewhere (WHEELS=<dir>), checked as built ones are
	@$(CLI) record $(FLAGS_RECORD)

.PHONY: launch-env
launch-env: $(VENV_STAMP) ## a bundle's launch profile for a launcher (env.sh, env.json, helper)
	@$(CLI) launch-env $(FLAGS_LAUNCH_ENV)

# Checked as every target is (DRY_RUN=1 or a typo must not delete out/); without .venv no
# stage has run, so there is nothing of ours in out/ to protect and nothing to check with.
clean: ## remove build work (out/); dist/, wheels.lock and the machine's cache stay
	@[ ! -x $(PY) ] || $(MAKE_CHECK)
	rm -rf out

# The host package (host/: gate, doctor, receipts; standard library only) as a wheel of its
# own, from the committed sources (git archive HEAD), dated by the commit: the same commit
# gives the same bytes. `make publish`/`make promote` put it into the lane beside the bundle.
.PHONY: host-wheel
host-wheel: $(VENV_STAMP) ## the host package's wheel for TPU hosts into dist/host/, versioned by content
	@$(MAKE_CHECK)
	@$(MAKE_CONTEXT) $(PY) -m xla_wheels.release.host_wheel

# Publish stage (README "Publish and install"). Credentials come from TWINE_USERNAME /
# TWINE_PASSWORD or keyring, never from these variables.
.PHONY: publish requirements verify-install doctor

publish: $(VENV_STAMP) ## publish the locked wheels into a lane, or with INDEX_URL to that index
	@$(if $(INDEX_URL),$(CLI) publish $(FLAGS_PUBLISH),\
	  $(CLI) publish-lane $(FLAGS_PUBLISH_LANE))

requirements: $(VENV_STAMP) ## requirements.txt of BUNDLE; without it, each lane's (+ pylock.toml)
	@$(if $(BUNDLE),$(CLI) requirements $(FLAGS_REQUIREMENTS),\
	  $(CLI) lane-requirements $(FLAGS_LANE_REQUIREMENTS))

verify-install: $(VENV_STAMP) ## install the bundle by hash into a fresh venv, check it, import torch_xla
	@$(CLI) verify-install $(FLAGS_VERIFY_INSTALL)

doctor: $(VENV_STAMP) ## check a training host against a bundle before import
	@$(CLI) doctor $(FLAGS_DOCTOR)

# Lanes (README "Releasing to the fleet"): build/lanes.toml, lanes.lock, receipts/<bundle>/.
.PHONY: promote rollback compare lanes status cache-pack
promote: $(VENV_STAMP) ## copy a bundle's locked files into a lane if its policy holds
	@$(CLI) promote $(FLAGS_PROMOTE)

compare: $(VENV_STAMP) ## two bundles' receipts side by side
	@$(CLI) compare $(FLAGS_COMPARE)

rollback: $(VENV_STAMP) ## return a lane to a bundle it served before (REASON= required)
	@$(CLI) rollback $(FLAGS_ROLLBACK)

lanes: $(VENV_STAMP) ## each lane's index, current bundle and policy; HISTORY=1 its history
	@$(CLI) lanes $(FLAGS_LANES)

status: $(VENV_STAMP) ## every bundle and lane at a glance (receipts, refusals, drift); JSON=1
	@$(CLI) status $(FLAGS_STATUS)

cache-pack: $(VENV_STAMP) ## publish the gate's signed cache pack of WORKLOAD into LANE, by hash
	@$(CLI) cache-pack $(FLAGS_CACHE_PACK)

# The fleet's image and its jobs' audit stamps (docs/operating.md).
.PHONY: runtime-image jobs
runtime-image: $(VENV_STAMP) ## an image to train from: the lane's bundle, the host package, PROFILE
	@$(CLI) runtime-image $(FLAGS_RUNTIME_IMAGE)

jobs: $(VENV_STAMP) ## which jobs ran a wheel (WHEEL= name or sha256), from a stamps directory
	@$(CLI) jobs $(FLAGS_JOBS)

# Supply-chain evidence (README "Signed attestations", "Rebuild check").
.PHONY: attest supply-tools rebuild-check
attest: $(VENV_STAMP) ## sign each locked wheel's SLSA provenance with the team's key
	@$(CLI) attest $(FLAGS_ATTEST)

# diffoscope (requirements-dev.txt) compares zip files with zipinfo (Debian's unzip) and
# the ELF libraries inside with binutils; python-magic and libarchive-c load libmagic1 and
# libarchive13. Installed from Debian when missing and we are root.
supply-tools:
	@if command -v zipinfo >/dev/null && command -v readelf >/dev/null && \
	  ldconfig -p | grep -q libmagic.so.1 && ldconfig -p | grep -q libarchive.so.13; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq unzip binutils libmagic1 libarchive13 >/dev/null; \
	else echo "note: unzip/binutils/libmagic1/libarchive13 missing and not root: diffoscope's reports will lack detail"; fi

rebuild-check: $(VENV_STAMP) supply-tools ## rebuild from nothing, compare byte for byte with wheels.lock (1: differs)
	@$(BUILD_ENV) $(CLI) rebuild-check $(FLAGS_REBUILD_CHECK)

# ABI check (README "ABI check"): the symbols torch_xla's _XLAC imports that the paired torch
# does not export. Exit 0 nothing missing, 1 missing symbols named, 2 the pair cannot be read.
.PHONY: abi-check
abi-check: $(VENV_STAMP) ## symbols torch_xla's _XLAC imports that the paired torch does not export
	@$(CLI) abi-check $(FLAGS_ABI_CHECK)

# Gate (host/src/xla_host/gate/README.md): judge a torch_xla environment in fresh processes. Without PYTHON,
# a cached stock torch_xla 2.9.0 env is built once per machine and shows the cache defect.
# Exit 0 pass, 1 a check failed, 2 the environment cannot be judged.
.PHONY: gate bench-restart

gate: $(VENV_STAMP) ## the ship gate: its checks in fresh processes, and a receipt
	@$(CLI) gate $(FLAGS_GATE) $(GATE_ARGS)

bench-restart: $(VENV_STAMP) ## restart benchmark: cold/warm medians and executable-load time
	@$(CLI) bench-restart $(FLAGS_BENCH_RESTART)
