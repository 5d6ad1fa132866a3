# Generated from src/xla_wheels/settings_table.py: do not edit; after changing a row,
# make generate
# (tests/test_settings_table.py fails while this file is not current).
#
# Every variable a target reads, as NAME=--flag (NAME= when it is not a flag of its
# own). The CLI reads the same rows (cli/from_make.py): it refuses a variable on
# make's command line that is not here, and names the variable, not the flag, when
# it refuses a value.
MAKE_VARIABLES := MIRROR=--mirror NET_TIMEOUT=--net-timeout NET_RETRIES=--net-retries BUNDLE=--bundle DRY_RUN=--dry-run A= \
  B= BUILD_MODE=--mode ENGINE=--engine BUILDER_IMAGE=--image JOBS=--jobs HOST_PYTHON=--host-python \
  KEEP_RECORDED=--keep-recorded BUILD_TAG=--build-tag WHEELS=--wheels BUILD_ARGS=--build-arg SOURCE_DATE_EPOCH= BAZEL_REMOTE_TIMEOUT=--bazel-remote-timeout \
  TORCH_XLA_SRC=--source XLA_HEADERS=--xla-headers COMPONENT=--component FORCE=--force ONTO=--onto CONTINUE=--continue \
  ROLE=--role PYTHON=--python CACHE_PATH=--cache-path PROFILE=--profile ENV_FILE=--env-file OUT=--out \
  INDEX_URL=--index-url UPLOAD_URL=--upload-url NO_DEPS=--no-deps DEPS_FROM=--deps-from REFRESH=--refresh JSON=--json \
  STAMP=--stamp LANE=--lane TO=--to REASON=--reason HISTORY=--history IMAGE_TAG=--tag \
  RUNTIME_BASE=--base-image HOST_PACKAGE=--host-package WHEEL=--wheel STAMPS=--stamps SIGNING_KEY=--signing-key PUBLIC_KEY=--public-key \
  BUILDER_ID=--builder-id GATE_DEVICE=--device WORKLOAD=--workload CHECKS=--checks KEY_PROBES=--key-probes UPSTREAM_TESTS=--upstream-tests \
  PACKS=--packs ROUNDS=--rounds GATE_ARGS= TORCH_WHEEL=--torch-wheel TORCH_XLA_WHEEL=--torch-xla-wheel XLAC=--extension \
  TORCH_LIB_DIR=--torch-lib-dir STOCK=--stock DEMO_DIR=--dir PYTEST_ARGS= PYTHON_FOR_VENV= TARGET=
