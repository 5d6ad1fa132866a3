"""``make runtime-image``: an image to train from, built from a lane's current bundle.

The plan is data (:class:`RuntimeImagePlan`): the Containerfile text, the files of the
build context (hash-pinned ``requirements.txt``, the baked facts ``image.json``, the host
package's wheel) and the engine's command. It is printed, and the same object is
executed. The image holds:

- the bundle's wheels, downloaded and installed with ``pip --require-hashes`` from the
  lane's index (a remote lane: its simple/ URL, reached from the build with the host's
  network when it is on loopback; a static lane: its files, copied into the context), and
  the runtime pins wheels.lock resolved (libtpu, jax: from pip's configured index, also
  by hash); the wheel files stay in the image (``/opt/xla-wheels/wheels``) so the
  entrypoint can compare the installed files with them at every start;
- the host package (``xla-wheels-host``, standard library only) in the same venv;
- the launch profile's environment as ``ENV`` (``{build}`` filled from wheels.lock; the
  read-only switch of the cache is the role's, set at start);
- OCI labels: ``org.opencontainers.image.*`` and ``dev.xla-wheels.*`` (bundle, lane,
  wheel hashes, profile digest, receipt digest, host package);
- the entrypoint ``python -m xla_host.entrypoint``: the check against the baked facts and
  the audit stamp before the training command (:mod:`xla_host.entrypoint`).

The base image is a Debian/Python image with ``python3 -m venv`` of the bundle's Python,
read from its wheels' tags (``cp311``: Python 3.11), else its manifest (default: the
builder's digest-pinned base for 3.13, ``python:<X.Y>-slim-bookworm`` for another;
``--base-image`` for a mirror, a local image or a digest pin).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from xla_host import launch_profile, log, runner
from xla_host.errors import UsageError
from xla_host.filemode import file_sha256
from xla_host.wheel_filename import parse_wheel_name
from xla_wheels.builder.container import EngineError
from xla_wheels.bundle import Bundle
from xla_wheels.publish import requirements
from xla_wheels.release.lanes import Lane, LaneState
from xla_wheels.wheels_lock import BundleEntry, RuntimeWheelRecord

#: The builder's own base (the Dockerfile's BASE_IMAGE default).
DEFAULT_BASE_IMAGE = (
    "docker.io/library/python:3.13.0-slim-bookworm@sha256:"
    "751d8bece269ba9e672b3f2226050e7e6fb3f3da3408b5dcb5d415a054fcb061"
)
#: The Python of :data:`DEFAULT_BASE_IMAGE`.
DEFAULT_BASE_PYTHON = "3.13"
#: Where the runtime pins' public wheels (libtpu, jax) come from, by hash.
PUBLIC_INDEX = "https://pypi.org/simple/"
PREFIX = "/opt/xla-wheels"
VENV = f"{PREFIX}/venv"
WHEELS = f"{PREFIX}/wheels"
FACTS = f"{PREFIX}/image.json"
STAMP = "/var/log/xla-wheels/stamp.json"
LABELS = "dev.xla-wheels"
FACTS_VERSION = "1"
PIP = f"{VENV}/bin/python -m pip --disable-pip-version-check --no-cache-dir"


@dataclass(frozen=True)
class HostWheel:
    """The host package as a wheel: given (``--host-package x.whl``, e.g. the lane's) or
    built from a source directory when the plan runs (sha256 then known)."""

    source: Path
    name: str
    sha256: str | None

    @property
    def built_from_source(self) -> bool:
        return self.source.is_dir()


@dataclass(frozen=True)
class RuntimeImagePlan:
    engine: str
    tag: str
    base_image: str
    bundle: str
    lane: str
    profile: str
    containerfile: str
    context_files: Mapping[str, str]
    """Text files of the build context: name -> content."""
    copies: Mapping[str, Path] = field(default_factory=dict)
    """Files copied into the build context: name in the context -> source."""
    host_wheel: HostWheel | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    network_host: bool = False
    """The lane's index is on loopback: the build's pip reaches it only in the host's
    network (``--network host``)."""

    def build_argv(self, context: Path) -> list[str]:
        return build_argv(self.engine, self.tag, context, self.network_host)

    def render(self) -> str:
        lines = [
            f"runtime image {self.tag}: bundle {self.bundle} from lane {self.lane}, "
            f"profile {self.profile} ({self.engine})"
        ]
        if self.host_wheel and self.host_wheel.built_from_source:
            lines.append(
                f"  host package: pip wheel --no-deps {self.host_wheel.source} (into the context)"
            )
        for name, source in sorted(self.copies.items()):
            lines.append(f"  context: {name} <- {source}")
        for name in ["Containerfile", *sorted(self.context_files)]:
            lines.append(f"  context: {name} (below)")
        lines.append("  " + log.format_command(self.build_argv(Path("<context>"))))
        texts = {"Containerfile": self.containerfile, **self.context_files}
        for name, text in texts.items():
            lines.append(f"--- {name}")
            lines.append(text.rstrip("\n"))
        return "\n".join(lines) + "\n"


def image_python(bundle: Bundle, entry: BundleEntry) -> str:
    """The Python the image needs: the one the bundle's wheels are tagged for (``cp311``
    -> ``3.11``), else (pure-Python wheels) the manifest's. Wheels for two Pythons are
    refused: no one interpreter installs both."""
    tags = {
        tag
        for wheel in entry.wheels or ()
        for tag in parse_wheel_name(wheel.name).python.split(".")
        if tag.startswith("cp") and tag[2:].isdigit() and len(tag) > 3
    }
    pythons = sorted({f"{tag[2]}.{tag[3:]}" for tag in tags})
    if len(pythons) > 1:
        raise UsageError(
            f"bundle {bundle.name}'s locked wheels are for Pythons {', '.join(pythons)}: no "
            "one image installs them all",
            fix=f"record the wheels of one Python (the manifest says {bundle.python}): "
            f"`make wheels BUNDLE={bundle.name}`",
        )
    return pythons[0] if pythons else bundle.python


def default_base_image(python: str) -> str:
    """The base for ``python``: the builder's digest-pinned one for its Python, else the
    official ``python:<X.Y>-slim-bookworm`` (by tag: pin it with ``--base-image``)."""
    if python == DEFAULT_BASE_PYTHON:
        return DEFAULT_BASE_IMAGE
    return f"docker.io/library/python:{python}-slim-bookworm"


def build_argv(engine: str, tag: str, context: Path, network_host: bool) -> list[str]:
    # --format docker keeps the Containerfile's SHELL-free form portable; as the builder's
    # image (container.build_image_argv). --network host: see RuntimeImagePlan.network_host.
    network = ["--network", "host"] if network_host else []
    containerfile = ["--file", str(context / "Containerfile")]
    if engine == "docker":
        return ["docker", "build", *network, *containerfile, "--tag", tag, str(context)]
    tool = (
        ["podman", "build", "--isolation=chroot"]
        if engine == "podman"
        else ["buildah", "bud", "--isolation", "chroot"]
    )
    return [*tool, "--format", "docker", *network, *containerfile, "--tag", tag, str(context)]


def _is_loopback(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    return host in ("127.0.0.1", "localhost", "::1")


def current_wheels(
    lane: Lane, state: LaneState | None, bundle: str, entry: BundleEntry
) -> list[tuple[str, str]]:
    """The (name, sha256) the image installs: the lane's record of its current bundle,
    which must be ``bundle`` and hold exactly the files wheels.lock locks for it."""
    if state is None or state.bundle != bundle:
        serves = state.bundle if state else "nothing"
        raise UsageError(
            f"lane {lane.name} serves {serves}, not bundle {bundle}",
            fix=f"build the image of what the lane serves (BUNDLE={serves}), or promote "
            f"{bundle} into {lane.name} first (make promote BUNDLE={bundle} LANE={lane.name})",
        )
    locked = sorted((w.name, w.sha256) for w in entry.wheels or ())
    recorded = sorted(state.wheels)
    if locked != recorded:
        raise UsageError(
            f"lanes.lock says lane {lane.name} received {recorded} for {bundle}, wheels.lock "
            f"locks {locked}",
            fix="the lock and the lane disagree: run `make status` to see which moved, "
            f"and publish or promote {bundle} again",
        )
    return recorded


def profile_environment(
    profile: launch_profile.LaunchProfile, bundle: str, build: str | None
) -> dict[str, str]:
    """The profile's environment as baked: the role's read-only switch is left to start."""
    env = profile.environment(bundle, "writer", build)
    env.pop(launch_profile.CACHE_READ_ONLY, None)
    return env


def labels(
    bundle: str, lane: str, profile: launch_profile.LaunchProfile,
    wheels: Sequence[tuple[str, str]], receipt_digest: str | None, host_wheel: HostWheel,
    base_image: str,
) -> dict[str, str]:  # fmt: skip
    versions = {parse_wheel_name(n).normalized: parse_wheel_name(n).version for n, _ in wheels}
    host = f"{host_wheel.name} sha256:{host_wheel.sha256 or '(built when the plan runs)'}"
    return {
        "org.opencontainers.image.title": f"xla-wheels runtime: bundle {bundle}, lane {lane}",
        "org.opencontainers.image.description": "patched torch_xla wheels installed by hash "
        "from the lane, with the host check as entrypoint",
        "org.opencontainers.image.version": versions.get("torch-xla", ""),
        "org.opencontainers.image.base.name": base_image,
        f"{LABELS}.bundle": bundle,
        f"{LABELS}.lane": lane,
        f"{LABELS}.wheels": json.dumps(dict(sorted(wheels)), sort_keys=True),
        f"{LABELS}.profile": profile.name,
        f"{LABELS}.profile-sha256": profile.sha256,
        f"{LABELS}.receipt-digest": receipt_digest or "",
        f"{LABELS}.host-package": host,
    }


def _quoted(value: str) -> str:
    return json.dumps(value)  # a Dockerfile string in double quotes, escapes as JSON's


def compose(
    *, engine: str, tag: str, base_image: str, bundle: Bundle, lane: Lane,
    state: LaneState | None, entry: BundleEntry, profile: launch_profile.LaunchProfile,
    build: str | None, host_wheel: HostWheel, public_index: str | None = None,
) -> RuntimeImagePlan:  # fmt: skip
    """The whole image as data (pure: reads nothing, writes nothing)."""
    wheels = current_wheels(lane, state, bundle.name, entry)
    runtime = list(entry.runtime_wheels or ())
    if bundle.runtime and not runtime:
        raise UsageError(
            f"bundle {bundle.name} has runtime pins but wheels.lock records no resolved "
            "runtime wheels",
            fix=f"run `make requirements BUNDLE={bundle.name}` once (it resolves and locks them)",
        )
    # The lock's rows: the same files as the lane's record (current_wheels checked that).
    text = requirements.requirements_text(bundle, list(entry.wheels or ()), runtime)
    copies, source = _wheel_source(lane, wheels, runtime, public_index)
    state_digest = state.receipt_digest if state else None
    environment = profile_environment(profile, bundle.name, build)
    facts = {
        "facts-version": FACTS_VERSION,
        "bundle": bundle.name,
        "lane": lane.name,
        "wheels": [{"name": n, "sha256": s} for n, s in wheels],
        "runtime-wheels": [{"name": r.name, "sha256": r.sha256} for r in runtime],
        "wheel-dir": WHEELS,
        "profile": profile.name,
        "profile-sha256": profile.sha256,
        "environment": environment,
        "receipt-digest": state_digest,
        "host-package": {"name": host_wheel.name, "sha256": host_wheel.sha256},
    }
    image_labels = labels(
        bundle.name, lane.name, profile, wheels, state_digest, host_wheel, base_image
    )
    lines = [
        f"# Runtime image of bundle {bundle.name} from lane {lane.name}, launch profile "
        f"{profile.name}: written by `make runtime-image` (do not edit; make it again).",
        f"FROM {base_image}",
        *(f"LABEL {k}={_quoted(v)}" for k, v in sorted(image_labels.items())),
        *_install_lines(source, host_wheel, environment, copied=bool(copies)),
    ]
    return RuntimeImagePlan(
        engine=engine,
        tag=tag,
        base_image=base_image,
        bundle=bundle.name,
        lane=lane.name,
        profile=profile.name,
        containerfile="\n".join(lines) + "\n",
        context_files={
            "requirements.txt": text,
            "image.json": json.dumps(facts, indent=2, sort_keys=True) + "\n",
        },
        copies=copies,
        host_wheel=host_wheel,
        labels=image_labels,
        network_host=uses_loopback(lane),
    )


def _wheel_source(
    lane: Lane,
    wheels: Sequence[tuple[str, str]],
    runtime: Sequence[RuntimeWheelRecord],
    public_index: str | None,
) -> tuple[dict[str, Path], str]:
    """Where pip downloads the wheels from: the files copied into the context (a lane
    whose files are on this machine), and pip's source options."""
    copies: dict[str, Path] = {}
    # The backend answers where its files are: on this machine (copied into the build),
    # else behind the index its server serves (pip reads it in the build).
    if (directory := lane.backend.directory) is not None:
        for name, _ in wheels:
            copies[f"lane/{name}"] = directory / name
        source = f"--no-index --find-links {PREFIX}/lane"
        if runtime:
            source = f"--find-links {PREFIX}/lane" + (
                f" --index-url {public_index}" if public_index else ""
            )
    else:
        source = f"--index-url {lane.simple_url}"
        if runtime and public_index:
            source += f" --extra-index-url {public_index}"
    return copies, source


def _install_lines(
    source: str, host_wheel: HostWheel, environment: Mapping[str, str], *, copied: bool
) -> list[str]:
    """The Containerfile after its labels: copy the context, install by hash, the
    environment and the entrypoint."""
    env = {"PATH": f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "XLA_WHEELS_STAMP": STAMP, **environment}  # fmt: skip
    lines = [f"COPY requirements.txt image.json host-wheel/ {PREFIX}/"]
    if copied:
        lines.append(f"COPY lane/ {PREFIX}/lane/")
    lines += [
        "# Download by hash from the lane, keep the files (the entrypoint compares the "
        "installed files with them), install them by hash, then the host package.",
        f"RUN python3 -m venv {VENV} \\\n"
        f"    && {PIP} download --no-deps --require-hashes {source} --dest {WHEELS} "
        f"--requirement {PREFIX}/requirements.txt \\\n"
        f"    && {PIP} install --no-index --no-deps --require-hashes --find-links {WHEELS} "
        f"--requirement {PREFIX}/requirements.txt \\\n"
        + (
            # The host wheel by hash too (pip's --require-hashes takes no bare file path).
            f"    && echo '{host_wheel.sha256}  {PREFIX}/{host_wheel.name}' | sha256sum -c - \\\n"
            if host_wheel.sha256
            else ""
        )
        + f"    && {PIP} install --no-index --no-deps {PREFIX}/{host_wheel.name} \\\n"
        f"    && mkdir -p {Path(STAMP).parent} && chmod 1777 {Path(STAMP).parent}"
        + (f" \\\n    && rm -rf {PREFIX}/lane" if copied else ""),
        *(f"ENV {k}={_quoted(v)}" for k, v in env.items()),
        "ENTRYPOINT "
        + json.dumps([f"{VENV}/bin/python", "-m", "xla_host.entrypoint", "--facts", FACTS, "--"]),
        'CMD ["python", "-c", "import torch_xla; print(torch_xla.__version__)"]',
    ]
    return lines


def host_wheel_argv(python: str, source: Path, out: Path) -> list[str]:
    return [python, "-m", "pip", "wheel", "--no-deps", "--quiet", str(source), "--wheel-dir",
            str(out)]  # fmt: skip


def build_host_wheel(python: str, source: Path, out: Path) -> HostWheel:
    """The host package's wheel from its source directory, into ``out``. Built from a
    scratch copy: setuptools writes build/ and *.egg-info into the tree it builds."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="xla-wheels-host-") as scratch:
        tree = Path(scratch) / "host"
        ignore = shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
        shutil.copytree(source, tree, ignore=ignore)
        runner.run(host_wheel_argv(python, tree, out), output="inherit", error=lambda r: (
            EngineError(
                f"could not build the host package's wheel from {source} (exit {r.returncode})",
                fix="pass --host-package <xla_wheels_host-*.whl> (make: HOST_PACKAGE=), e.g. "
                "the lane's, or fix the cause pip names above",
            )
        ))  # fmt: skip
    (built,) = sorted(out.glob("xla_wheels_host-*.whl"))
    return HostWheel(source, built.name, file_sha256(built))


def given_host_wheel(source: Path) -> HostWheel:
    if source.is_dir():
        return HostWheel(source, "xla_wheels_host-<version>-py3-none-any.whl", None)
    if not (source.is_file() and source.name.endswith(".whl")):
        raise UsageError(
            f"{source} is neither a wheel file nor the host package's source directory",
            fix="pass --host-package <xla_wheels_host-*.whl> or <checkout>/host",
        )
    return HostWheel(source, source.name, file_sha256(source))


def write_context(plan: RuntimeImagePlan, context: Path) -> None:
    """The build context: the composed texts, the copied files, the host wheel."""
    for name, text in plan.context_files.items():
        (context / name).write_text(text)
    (context / "Containerfile").write_text(plan.containerfile)
    for name, source in plan.copies.items():
        (context / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, context / name)
    host = context / "host-wheel"
    host.mkdir(exist_ok=True)
    if plan.host_wheel is not None and not plan.host_wheel.built_from_source:
        shutil.copyfile(plan.host_wheel.source, host / plan.host_wheel.name)


def execute(plan: RuntimeImagePlan, context: Path) -> None:
    write_context(plan, context)
    argv = plan.build_argv(context)
    try:
        runner.run(argv, output="inherit", error=lambda r: EngineError(
            f"{plan.engine} could not build the runtime image {plan.tag} (exit {r.returncode}); "
            "its output is above",
            fix="fix the cause it names (a pip hash mismatch: the lane serves other files "
            "than lanes.lock records, see `make status`), then run it again",
        ))  # fmt: skip
    except FileNotFoundError:
        raise UsageError(
            f"{argv[0]} is not on PATH",
            fix="install it, or pick another engine: --engine docker|podman|buildah (make: "
            "ENGINE=)",
        ) from None


def uses_loopback(lane: Lane) -> bool:
    return _is_loopback(lane.simple_url)  # a directory's file:// URL never is
