# Generated from the CLI's parsers by src/xla_wheels/make_help.py: do not edit;
# make generate (tests/test_help.py fails while it is not current).
#
# FLAGS_<COMMAND>: every make variable the command takes, as its target passes them, so
# that no recipe leaves one out (make would ignore it, and the run go on without it).
FLAGS_BUNDLES = $(call flag,MIRROR) $(call flag,NET_TIMEOUT) $(call flag,NET_RETRIES) \
  $(call flag,DRY_RUN)
FLAGS_DIFF = $(call flag,MIRROR) $(call flag,NET_TIMEOUT) $(call flag,NET_RETRIES) \
  $(call flag,DRY_RUN) $(call arg,A) $(call arg,B)
FLAGS_SOURCES = $(call flag,MIRROR) $(call flag,NET_TIMEOUT) $(call flag,NET_RETRIES) \
  $(call flag,DRY_RUN) $(call flag,BUNDLE)
FLAGS_PATCH = $(call flag,MIRROR) $(call flag,NET_TIMEOUT) $(call flag,NET_RETRIES) \
  $(call flag,DRY_RUN) $(call flag,BUNDLE)
FLAGS_WHEELS = $(call flag,MIRROR) $(call flag,NET_TIMEOUT) $(call flag,NET_RETRIES) \
  $(call flag,DRY_RUN) $(call flag,BUNDLE) $(call flag,JOBS) $(call flag,BUILD_MODE) \
  $(call flag,ENGINE) $(call flag,BUILDER_IMAGE) $(call flag,HOST_PYTHON) \
  $(call flag,KEEP_RECORDED) $(call flag,BUILD_TAG) $(call flag,BAZEL_REMOTE_TIMEOUT)
FLAGS_BUILDER_IMAGE = $(call flag,MIRROR) $(call flag,NET_TIMEOUT) $(call flag,NET_RETRIES) \
  $(call flag,DRY_RUN) $(call flag,JOBS) $(call flag,BUILD_MODE) $(call flag,ENGINE) \
  $(call flag,BUILDER_IMAGE) $(call flag,HOST_PYTHON) $(call flag,KEEP_RECORDED) \
  $(call flag,BUILD_TAG) $(foreach a,$(BUILD_ARGS),--build-arg $(call quote,$(a))) \
  $(call flag,BAZEL_REMOTE_TIMEOUT)
FLAGS_PATCHES_CHECK = $(call flag,MIRROR) $(call flag,NET_TIMEOUT) $(call flag,NET_RETRIES) \
  $(call flag,DRY_RUN) $(call flag,BUNDLE) $(call flag,COMPONENT) $(call flag,TORCH_XLA_SRC)
FLAGS_SERIES_COMPILE = $(call flag,MIRROR) $(call flag,NET_TIMEOUT) $(call flag,NET_RETRIES) \
  $(call flag,DRY_RUN) $(call flag,BUNDLE) $(call flag,TORCH_XLA_SRC) $(call flag,XLA_HEADERS)
FLAGS_PATCH_EXPORT = $(call flag,MIRROR) $(call flag,NET_TIMEOUT) $(call flag,NET_RETRIES) \
  $(call flag,DRY_RUN) $(call flag,BUNDLE) $(call flag,COMPONENT) $(call flag,FORCE)
FLAGS_PATCH_REBASE = $(call flag,MIRROR) $(call flag,NET_TIMEOUT) $(call flag,NET_RETRIES) \
  $(call flag,DRY_RUN) $(call flag,BUNDLE) $(call flag,COMPONENT) $(call flag,ONTO) \
  $(call flag,CONTINUE)
FLAGS_LOCK = $(call flag,MIRROR) $(call flag,NET_TIMEOUT) $(call flag,NET_RETRIES) \
  $(call flag,DRY_RUN) $(call flag,BUNDLE)
FLAGS_LOCK_CHECK = $(call flag,MIRROR) $(call flag,NET_TIMEOUT) $(call flag,NET_RETRIES) \
  $(call flag,DRY_RUN)
FLAGS_RECORD = $(call flag,MIRROR) $(call flag,NET_TIMEOUT) $(call flag,NET_RETRIES) \
  $(call flag,DRY_RUN) $(call flag,BUNDLE) $(call flag,WHEELS)
FLAGS_LAUNCH_ENV = $(call flag,MIRROR) $(call flag,NET_TIMEOUT) $(call flag,NET_RETRIES) \
  $(call flag,DRY_RUN) $(call flag,BUNDLE) $(call flag,PYTHON) $(call flag,PROFILE) \
  $(call flag,ROLE) $(call flag,OUT)
FLAGS_GATE = $(call flag,BUNDLE) $(call flag,PYTHON) $(call flag,GATE_DEVICE) \
  $(call flag,WORKLOAD) $(call flag,CHECKS) $(call flag,KEY_PROBES) $(call flag,OUT) \
  $(call flag,UPSTREAM_TESTS) $(call flag,PROFILE) $(call flag,ROLE)
FLAGS_CACHE =
FLAGS_BENCH_RESTART = $(call flag,PYTHON) $(call flag,GATE_DEVICE) $(call flag,WORKLOAD) \
  $(call flag,BUNDLE) $(call flag,ROUNDS) $(call flag,OUT)
FLAGS_PUBLISH = $(call flag,MIRROR) $(call flag,NET_TIMEOUT) $(call flag,NET_RETRIES) \
  $(call flag,DRY_RUN) $(call flag,BUNDLE) $(call flag,INDEX_URL) $(call flag,UPLOAD_URL)
FLAGS_REQUIREMENTS = $(call flag,MIRROR) $(call flag,NET_TIMEOUT) $(call flag,NET_RETRIES) \
  $(call flag,DRY_RUN) $(call flag,BUNDLE) $(call flag,REFRESH)
FLAGS_VERIFY_INSTALL = $(call flag,MIRROR) $(call flag,NET_TIMEOUT) $(call flag,NET_RETRIES) \
  $(call flag,DRY_RUN) $(call flag,BUNDLE) $(call flag,INDEX_URL) $(call flag,PYTHON) \
  $(call flag,NO_DEPS) $(call flag,DEPS_FROM) $(call flag,PUBLIC_KEY)
FLAGS_DOCTOR = $(call flag,MIRROR) $(call flag,NET_TIMEOUT) $(call flag,NET_RETRIES) \
  $(call flag,DRY_RUN) $(call flag,BUNDLE) $(call flag,LANE) $(call flag,PUBLIC_KEY) \
  $(call flag,PYTHON) $(call flag,ROLE) $(call flag,CACHE_PATH) $(call flag,PROFILE) \
  $(call flag,ENV_FILE) $(call flag,JSON) $(call flag,STAMP)
FLAGS_ABI_CHECK = $(call flag,MIRROR) $(call flag,NET_TIMEOUT) $(call flag,NET_RETRIES) \
  $(call flag,DRY_RUN) $(call flag,BUNDLE) $(call flag,PYTHON) $(call flag,TORCH_WHEEL) \
  $(call flag,TORCH_XLA_WHEEL) $(call flag,XLAC) $(call flag,TORCH_LIB_DIR) $(call flag,STOCK)
FLAGS_PUBLISH_LANE = $(call flag,MIRROR) $(call flag,NET_TIMEOUT) $(call flag,NET_RETRIES) \
  $(call flag,DRY_RUN) $(call flag,BUNDLE) $(call flag,LANE)
FLAGS_PROMOTE = $(call flag,MIRROR) $(call flag,NET_TIMEOUT) $(call flag,NET_RETRIES) \
  $(call flag,DRY_RUN) $(call flag,BUNDLE) $(call flag,LANE)
FLAGS_COMPARE = $(call flag,MIRROR) $(call flag,NET_TIMEOUT) $(call flag,NET_RETRIES) \
  $(call flag,DRY_RUN) $(call arg,A) $(call arg,B)
FLAGS_LANE_REQUIREMENTS = $(call flag,MIRROR) $(call flag,NET_TIMEOUT) $(call flag,NET_RETRIES) \
  $(call flag,DRY_RUN) $(call flag,LANE)
FLAGS_LANES = $(call flag,MIRROR) $(call flag,NET_TIMEOUT) $(call flag,NET_RETRIES) \
  $(call flag,DRY_RUN) $(call flag,HISTORY) $(call flag,LANE)
FLAGS_STATUS = $(call flag,MIRROR) $(call flag,NET_TIMEOUT) $(call flag,NET_RETRIES) \
  $(call flag,DRY_RUN) $(call flag,JSON)
FLAGS_CACHE_PACK = $(call flag,MIRROR) $(call flag,NET_TIMEOUT) $(call flag,NET_RETRIES) \
  $(call flag,DRY_RUN) $(call flag,BUNDLE) $(call flag,LANE) $(call flag,WORKLOAD) \
  $(call flag,PACKS) $(call flag,PUBLIC_KEY)
FLAGS_ROLLBACK = $(call flag,MIRROR) $(call flag,NET_TIMEOUT) $(call flag,NET_RETRIES) \
  $(call flag,DRY_RUN) $(call flag,LANE) $(call flag,TO) $(call flag,REASON)
FLAGS_RUNTIME_IMAGE = $(call flag,MIRROR) $(call flag,NET_TIMEOUT) $(call flag,NET_RETRIES) \
  $(call flag,DRY_RUN) $(call flag,BUNDLE) $(call flag,LANE) $(call flag,PROFILE) \
  $(call flag,ENGINE) $(call flag,IMAGE_TAG) $(call flag,RUNTIME_BASE) $(call flag,HOST_PACKAGE)
FLAGS_JOBS = $(call flag,MIRROR) $(call flag,NET_TIMEOUT) $(call flag,NET_RETRIES) \
  $(call flag,DRY_RUN) $(call flag,WHEEL) $(call flag,STAMPS) $(call flag,JSON)
FLAGS_ATTEST = $(call flag,MIRROR) $(call flag,NET_TIMEOUT) $(call flag,NET_RETRIES) \
  $(call flag,DRY_RUN) $(call flag,BUNDLE) $(call flag,SIGNING_KEY) $(call flag,BUILDER_ID)
FLAGS_REBUILD_CHECK = $(call flag,MIRROR) $(call flag,NET_TIMEOUT) $(call flag,NET_RETRIES) \
  $(call flag,DRY_RUN) $(call flag,BUNDLE) $(call flag,JOBS) $(call flag,BUILD_MODE) \
  $(call flag,ENGINE) $(call flag,BUILDER_IMAGE) $(call flag,HOST_PYTHON) \
  $(call flag,KEEP_RECORDED) $(call flag,BUILD_TAG) $(call flag,BAZEL_REMOTE_TIMEOUT)
