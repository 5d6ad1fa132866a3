# The builder image of the xla-wheels pipeline (`make builder-image`), modelled on
# pytorch/xla's own build environment (infra/ansible: Debian bookworm, clang 17, Bazel
# 7.4.1 through bazelisk) with everything pinned and verified:
#
#   base     digest-pinned Python 3.13 on Debian bookworm, git/patch, non-root `builder`
#   builder  + clang 17 (apt.llvm.org, key checked by fingerprint), ccache, bazelisk
#            (sha256-verified) with Bazel 7.4.1 fetched in, the pipeline's own deps
#   smoke    a clean Python that installs built wheels and imports them
#
# Nothing is copied in: sources, caches and outputs are runtime volumes that the engine
# layer (src/xla_wheels/builder/container.py) mounts at their host paths. Caches (Bazel
# disk cache and output root, pip, ccache) are never layers. Needs BuildKit (Docker >= 23
# default), podman >= 4 or buildah >= 1.24 for RUN --mount.

# Python 3.13 from the Docker official image, pinned by digest (the digest of
# python:3.13.0-slim-bookworm's index, as recorded by Renovate in public repositories;
# re-check with `docker buildx imagetools inspect python:3.13.0-slim-bookworm` when bumping).
# Tests build the `base` and `smoke` stages FROM a local debootstrap image instead.
ARG BASE_IMAGE=docker.io/library/python:3.13.0-slim-bookworm@sha256:751d8bece269ba9e672b3f2226050e7e6fb3f3da3408b5dcb5d415a054fcb061

FROM ${BASE_IMAGE} AS base
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG BUILDER_UID=1000
# Debian package versions are not pinned one by one (DL3008): a bookworm point release
# removes the old versions from the archive and pinned builds break. Reproducibility comes
# from the digest-pinned base and from bookworm being a stable release.
# hadolint ignore=DL3008
RUN --mount=type=cache,target=/var/cache/apt,sharing=locked \
    --mount=type=cache,target=/var/lib/apt/lists,sharing=locked \
    rm -f /etc/apt/apt.conf.d/docker-clean \
    && apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates git patch \
    && groupadd --gid "${BUILDER_UID}" builder \
    && useradd --uid "${BUILDER_UID}" --gid "${BUILDER_UID}" --create-home --shell /bin/bash builder
ENV PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /home/builder

FROM base AS builder
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG BUILDER_UID=1000
# Mirrors: point these at an internal mirror on hosts without internet access.
ARG LLVM_APT_BASE=https://apt.llvm.org
ARG LLVM_VERSION=17
# Fingerprint of the apt.llvm.org signing key (llvm-snapshot.gpg.key, "Sylvestre Ledru -
# Debian LLVM packages"), as published on apt.llvm.org; the downloaded key must match.
ARG LLVM_KEY_FINGERPRINT=6084F3CF814B57C1CF12EFD515CF4D18AF4F7421
ARG BAZELISK_BASE_URL=https://github.com/bazelbuild/bazelisk/releases/download
ARG BAZELISK_VERSION=v1.25.0
# sha256 of the v1.25.0 release assets bazelisk-linux-amd64 / -arm64 (as listed in
# cashapp/hermit-packages' bazelisk.hcl, which verifies them on every install).
ARG BAZELISK_SHA256_AMD64=fd8fdff418a1758887520fa42da7e6ae39aefc788cf5e7f7bb8db6934d279fc4
ARG BAZELISK_SHA256_ARM64=4c8d966e40ac2c4efcc7f1a5a5cceef2c0a2f16b957e791fa7a867cce31e8fcb
# Bazel itself is fetched by bazelisk at image build time (torch_xla's .bazelversion is
# 7.4.1). Set BAZEL_SHA256 to the sha256 of bazel-7.4.1-linux-<arch> to have bazelisk verify
# it (BAZELISK_VERIFY_SHA256); it is empty because it could not be checked when this was
# written, and bazelisk then relies on HTTPS to the release host (BAZELISK_BASE_URL mirror
# for Bazel: BAZEL_MIRROR).
ARG BAZEL_VERSION=7.4.1
ARG BAZEL_SHA256=
ARG BAZEL_MIRROR=
# hadolint ignore=DL3008
RUN --mount=type=cache,target=/var/cache/apt,sharing=locked \
    --mount=type=cache,target=/var/lib/apt/lists,sharing=locked \
    apt-get update \
    && apt-get install -y --no-install-recommends curl gnupg \
    && curl -fsSL "${LLVM_APT_BASE}/llvm-snapshot.gpg.key" -o /tmp/llvm.key \
    && fingerprint="$(gpg --show-keys --with-colons /tmp/llvm.key | awk -F: '/^fpr/ {print $10; exit}')" \
    && if [ "${fingerprint}" != "${LLVM_KEY_FINGERPRINT}" ]; then \
         echo "apt.llvm.org key fingerprint ${fingerprint} != ${LLVM_KEY_FINGERPRINT}" >&2; exit 1; fi \
    && gpg --dearmor < /tmp/llvm.key > /usr/share/keyrings/llvm.gpg \
    && rm /tmp/llvm.key \
    && echo "deb [signed-by=/usr/share/keyrings/llvm.gpg] ${LLVM_APT_BASE}/bookworm/ llvm-toolchain-bookworm-${LLVM_VERSION} main" \
       > /etc/apt/sources.list.d/llvm.list \
    && apt-get update \
    && apt-get install -y --no-install-recommends \
       "clang-${LLVM_VERSION}" "lld-${LLVM_VERSION}" "libc++-${LLVM_VERSION}-dev" \
       build-essential ccache unzip zip \
    && ln -sf "/usr/bin/clang-${LLVM_VERSION}" /usr/local/bin/clang \
    && ln -sf "/usr/bin/clang++-${LLVM_VERSION}" /usr/local/bin/clang++ \
    && ln -sf "/usr/bin/ld.lld-${LLVM_VERSION}" /usr/local/bin/ld.lld

RUN case "$(dpkg --print-architecture)" in \
      amd64) arch=amd64; sum="${BAZELISK_SHA256_AMD64}" ;; \
      arm64) arch=arm64; sum="${BAZELISK_SHA256_ARM64}" ;; \
      *) echo "no bazelisk checksum for $(dpkg --print-architecture)" >&2; exit 1 ;; \
    esac \
    && if ! printf '%s' "${sum}" | grep -Eqx '[0-9a-f]{64}'; then \
         echo "BAZELISK_SHA256_* is not a sha256: fill it, the build refuses to go unverified" >&2; \
         exit 1; fi \
    && curl -fsSL "${BAZELISK_BASE_URL}/${BAZELISK_VERSION}/bazelisk-linux-${arch}" -o /usr/local/bin/bazelisk \
    && echo "${sum}  /usr/local/bin/bazelisk" | sha256sum --check --strict - \
    && chmod 0755 /usr/local/bin/bazelisk \
    && ln -sf /usr/local/bin/bazelisk /usr/local/bin/bazel

# What torch_xla's setup.py imports (requests) and the wheel builds need, pinned. The
# ship check's `python -m xla_wheels gate` runs its checks and leaves its receipt on the
# standard library alone. The build env adds torch's own requirements at build time
# (pip cache volume).
COPY --chmod=0644 build/builder-requirements.txt /opt/xla-wheels/requirements.txt
RUN --mount=type=cache,target=/root/.cache/pip \
    python3 -m pip install --requirement /opt/xla-wheels/requirements.txt

USER ${BUILDER_UID}:${BUILDER_UID}
ENV BAZELISK_HOME=/home/builder/.bazelisk USE_BAZEL_VERSION=${BAZEL_VERSION} \
    CC=clang CXX=clang++
RUN if [ -n "${BAZEL_MIRROR}" ]; then export BAZELISK_BASE_URL="${BAZEL_MIRROR}"; fi \
    && if [ -n "${BAZEL_SHA256}" ]; then export BAZELISK_VERIFY_SHA256="${BAZEL_SHA256}"; fi \
    && bazel --version

FROM ${BASE_IMAGE} AS smoke
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Wheels to check, relative to the build context (e.g. dist/v6e-2.9), and extra pip
# arguments (an index mirror; tests pass "--no-index --find-links /wheels"). Build this
# stage with --no-cache: buildah's layer cache does not hash bind-mounted files.
ARG WHEELS_DIR=dist
ARG SMOKE_PIP_ARGS=
RUN --mount=type=bind,source=${WHEELS_DIR},target=/wheels \
    python3 -m venv /opt/smoke \
    && /opt/smoke/bin/python -m pip install --no-cache-dir ${SMOKE_PIP_ARGS} /wheels/*.whl \
    && /opt/smoke/bin/python -c "import importlib.resources as r, json, torch, torch_xla; p = json.loads(r.files('torch_xla').joinpath('_xla_wheels_provenance.json').read_text()); print('smoke:', torch.__version__, torch_xla.__version__, p['components']['torch_xla']['commit'])"
