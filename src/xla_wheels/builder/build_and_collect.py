"""Orchestration of the build and collect stages, called by ``pipeline.run_until``/``plan``.

``prepare`` (before sources): stage keys from what is known without the network, then
preflight. ``after_sources``: the keys again with the verified full SHAs. ``build``: each
recipe whose stage is not cached, through the engine. ``collect``: staging, ship check,
atomic move, wheels.lock. Every piece is composed from one :class:`BuildConfig` and one
:class:`BuildSpec`, which the DRY_RUN plan renders with the same functions.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import xla_host
import xla_wheels
from xla_host import log
from xla_host.errors import PipelineError
from xla_host.provenance import BuildSettings, ComponentProvenance, PatchDigest, Provenance
from xla_wheels import disk_faults, sbom, wheel_stamp
from xla_wheels.abi import ship as abi_ship
from xla_wheels.abi.pairs import AbiMismatch
from xla_wheels.builder import rebuilt_wheels, recipes, remote_cache
from xla_wheels.builder.collect import (
    ShipCheckFailed,
    commit_with_lock,
    record_collected,
    staging,
    up_to_date,
)
from xla_wheels.builder.config import BuildConfig
from xla_wheels.builder.container import Engine, Mount, build_image_argv, make_engine
from xla_wheels.builder.preflight import (
    PreflightError,
    again_command,
    checks,
    planned_preflight,
    run_checks,
)
from xla_wheels.builder.spec import (
    BuildSpec,
    built_wheel,
    record_stage,
    stage_key,
    stage_wheel,
    unfinished,
)
from xla_wheels.bundle import Bundle
from xla_wheels.gitutil import git
from xla_wheels.layout import BundleLayout
from xla_wheels.options import PipelineOptions
from xla_wheels.patches import AppliedPatch, describe_series, series_digest
from xla_wheels.plan import PlannedCommand, PlannedStage
from xla_wheels.progress import Timings
from xla_wheels.sources import CheckedOutSource, SourceCache, known_commits
from xla_wheels.upstream_tree import TORCH_XLA_IN_TORCH

RECIPES = ("torch", "torch_xla")
ENTRY_MODULE = "xla_wheels.builder.run_recipe"


class BuildFailed(PipelineError):
    """A recipe failed; the message names its log file."""


@dataclass
class BuildRun:
    options: PipelineOptions
    bundle: Bundle
    config: BuildConfig
    commits: dict[str, str | None]
    spec: BuildSpec
    keys: dict[str, str] | None
    timings: Timings = field(default_factory=Timings)

    @property
    def layout(self) -> BundleLayout:
        return BundleLayout.of(self.options, self.bundle.name)

    def stage_dir(self, name: str) -> Path:
        return Path(self.spec.torch_stage if name == "torch" else self.spec.torch_xla_stage)

    def cached(self, name: str) -> bool:
        return self.keys is not None and stage_wheel(self.stage_dir(name)) is not None

    @property
    def all_cached(self) -> bool:
        return all(self.cached(name) for name in RECIPES)

    def wheels(self) -> list[Path]:
        found = [stage_wheel(self.stage_dir(name)) for name in RECIPES]
        if any(w is None for w in found):
            raise BuildFailed("a stage has no wheel after the build (see the logs)")
        return [w for w in found if w is not None]


def openxla_revision(pin: str, bundle: Bundle, series_sha256: str) -> str:
    """The OpenXLA revision compiled into torch_xla and hashed into its cache key.

    torch_xla's own build names OpenXLA by WORKSPACE's pin, which ``--override_repository``
    bypasses: two bundles differing only in OpenXLA (commit or local patches) would share
    cache keys. The patched commit object is not known until the patch stage has run, so
    the revision is the pin and, with local patches, their series digest.
    """
    if not bundle.component("openxla").patches:
        return pin
    return f"{pin}+series.{series_sha256[:16]}"


def compose(
    options: PipelineOptions,
    bundle: Bundle,
    config: BuildConfig,
    commits: Mapping[str, str | None],
) -> tuple[BuildSpec, dict[str, str] | None]:
    """The spec and the stage keys (None while a commit is not known in full)."""
    layout = BundleLayout.of(options, bundle.name)
    cache = options.cache_dir
    pins = {
        name: commits.get(name) or bundle.component(name).commit or "unpinned"
        for name in bundle.components
    }
    described = {name: describe_series(bundle.component(name)) for name in bundle.components}
    series = {name: series_digest(patches) for name, patches in described.items()}
    torch_version, torch_xla_version = _local_versions(bundle, pins, series)
    knobs = asdict(bundle.build)
    keys = _stage_keys(bundle, config, commits, series, torch_version, torch_xla_version)
    stages = cache / "stages"

    def stage_path(name: str) -> str:
        suffix = keys[name][:16] if keys else "KEY-AFTER-SOURCES"
        return str(stages / f"{name}-{suffix}")

    provenance = _provenance(bundle, config, pins, described, series)
    spec = BuildSpec(
        bundle=bundle.name,
        python=config.host_python if config.mode == "host" else config.container_python,
        torch_src=str(layout.worktree("torch")),
        torch_xla_worktree=str(layout.worktree("torch_xla")),
        torch_xla_tree=str(layout.worktree("torch") / TORCH_XLA_IN_TORCH),
        openxla_src=str(layout.worktree("openxla")),
        openxla_revision=openxla_revision(pins["openxla"], bundle, series["openxla"]),
        buildenv=str(layout.buildenv),
        logs=str(layout.logs),
        torch_version=torch_version,
        torch_xla_version=torch_xla_version,
        torch_stage=stage_path("torch"),
        torch_xla_stage=stage_path("torch_xla"),
        jobs=config.jobs,
        knobs=knobs,
        bazel_disk_cache=str(config.bazel_disk_cache or cache / "bazel-disk"),
        bazel_output_root=str(cache / "bazel-root"),
        ccache_dir=str(cache / "ccache"),
        pip_cache_dir=str(options.pip_cache),
        pip_args=list(config.pip_args),
        compiler_env=dict(config.compiler_env),
        extra_env=_reproducible_env(options, bundle, config, commits.get("torch_xla")),
        ship_env=str(layout.ship_env),
        ship_out=str(layout.ship_check),
        ship_check=config.ship_check,
        ship_pip_args=list(config.ship_pip_args),
        pipeline_src=[
            str(Path(package.__path__[0]).resolve().parent) for package in (xla_wheels, xla_host)
        ],
        remote_cache=config.remote_cache.settings.to_dict(),
        private_dir=str(layout.work / "private"),
        provenance=provenance.to_json(),
    )
    return spec, keys


def _local_versions(
    bundle: Bundle, pins: Mapping[str, str], series: Mapping[str, str]
) -> tuple[str, str]:
    """The local versions torch and torch_xla are built with (``+<commit>.p<digest>``)."""
    torch_c, xla_c = bundle.component("torch"), bundle.component("torch_xla")
    torch_digest = wheel_stamp.patch_digest([series["torch"]]) if torch_c.patches else None
    torch_version = wheel_stamp.local_version(torch_c.version or "", pins["torch"], torch_digest)
    # torch_xla always carries ".p<digest>": even with no torch_xla patch, its OpenXLA is
    # the bundle's (override), not the one upstream's WORKSPACE pins.
    xla_parts = [series["torch_xla"], f"openxla:{pins['openxla']}", series["openxla"]]
    if torch_c.patches:
        # torch_xla is compiled against the torch it is built with: a patched torch makes
        # another torch_xla, which must not share a file name with the one built against
        # another torch (builder.rebuilt_wheels stops on exactly that). Unpatched torch adds
        # nothing, so those labels stay as they were.
        xla_parts.append(f"torch:{series['torch']}")
    xla_digest = wheel_stamp.patch_digest(xla_parts)
    torch_xla_version = wheel_stamp.local_version(
        xla_c.version or "", pins["torch_xla"], xla_digest
    )
    return torch_version, torch_xla_version


def _stage_keys(
    bundle: Bundle,
    config: BuildConfig,
    commits: Mapping[str, str | None],
    series: Mapping[str, str],
    torch_version: str,
    torch_xla_version: str,
) -> dict[str, str] | None:
    """Each stage's key over its inputs (None while a commit is not known in full)."""
    knobs = asdict(bundle.build)
    toolchain = config.image if config.mode == "container" else f"host:{config.host_python}"
    # The remote caches are deliberately not stage inputs: Bazel's action cache and
    # ccache are content addressed (an action's digest covers its command, environment
    # and input files; ccache hashes the preprocessed source and the compiler command),
    # so a hit yields the bytes a local compile of the same inputs yields. Their URLs,
    # the role and the credentials say where results come from, not what they are; a key
    # over them would rebuild every wheel when a cache moves or a token rotates (and a
    # key over a credential would be a way to guess it). Trust in what the cache holds is
    # the one-writer policy's job (remote_cache.py).
    if not all(commits.get(name) for name in bundle.components):
        return None
    both = dict(compiler=dict(config.compiler_env), python=bundle.python, toolchain=toolchain)
    torch_key = stage_key(
        {
            "component": "torch",
            "commit": commits["torch"],
            "series": series["torch"],
            "version": torch_version,
            "cxx_abi": knobs["cxx_abi"],
            **both,
        }
    )
    xla_key = stage_key(
        {
            "component": "torch_xla",
            "torch": torch_key,
            "commit": commits["torch_xla"],
            "series": series["torch_xla"],
            "openxla": commits["openxla"],
            "openxla_series": series["openxla"],
            "version": torch_xla_version,
            "knobs": knobs,
            **both,
        }
    )
    return {"torch": torch_key, "torch_xla": xla_key}


def _provenance(
    bundle: Bundle,
    config: BuildConfig,
    pins: Mapping[str, str],
    described: Mapping[str, tuple[AppliedPatch, ...]],
    series: Mapping[str, str],
) -> Provenance:
    """The provenance the wheels carry: the build's inputs."""
    knobs = asdict(bundle.build)
    # Inputs only, never the bundle: every bundle with these inputs gets these bytes
    # (they share the stage), so a bundle name, manifest digest or remote here would be
    # wrong for all but the first (see stamp's module docstring).
    return Provenance(
        built_by=f"xla-wheels {xla_wheels.__version__}",
        build=BuildSettings(
            mode=config.mode,
            engine=config.engine if config.mode == "container" else "host",
            image=config.image if config.mode == "container" else None,
            knobs=knobs,
        ),
        components={
            name: ComponentProvenance(
                commit=pins[name],
                version=bundle.component(name).version,
                patches=tuple(
                    PatchDigest(f"patches/{p.relpath}", p.sha256) for p in described[name]
                ),
                series_sha256=series[name],
            )
            for name in bundle.components
        },
    )


def _reproducible_env(
    options: PipelineOptions, bundle: Bundle, config: BuildConfig, commit: str | None
) -> dict[str, str]:
    """The configured extra environment plus SOURCE_DATE_EPOCH for every recipe: as
    given, else the torch_xla commit's committer date.

    A date of the inputs, not of the build: a rebuild of the same commit gets the same
    wheel dates. Unset while the commit is not in the source cache yet (before sources).
    """
    env = dict(config.extra_env)
    epoch = config.source_date_epoch
    repo = SourceCache(options.source_cache, options.mirror).repo_for(bundle.component("torch_xla"))
    if epoch is None and commit and repo.is_dir():
        shown = git(
            ["show", "-s", "--format=%ct"],
            operands=[commit],
            end="--end-of-options",
            git_dir=repo,
            check=False,
        )
        if shown.returncode == 0 and shown.stdout.strip().isdigit():
            epoch = int(shown.stdout)
    if epoch is not None:
        env.setdefault("SOURCE_DATE_EPOCH", str(epoch))
    return env


def _offline_run(options: PipelineOptions, bundle: Bundle, config: BuildConfig) -> BuildRun:
    """The run with the stage keys known offline (None for a commit not in the cache)."""
    commits = known_commits(bundle, SourceCache(options.source_cache, options.mirror))
    spec, keys = compose(options, bundle, config, commits)
    return BuildRun(options, bundle, config, commits, spec, keys)


def prepare(options: PipelineOptions, bundle: Bundle, config: BuildConfig) -> BuildRun:
    """Stage keys from what is known offline, then preflight (raises with every blocker)."""
    run = _offline_run(options, bundle, config)
    with run.timings.stage("preflight"):
        # With every stage cached, the sources are not needed: no remote is asked.
        blockers = run_checks(checks(options, bundle, config, need_sources=not run.all_cached))
        if blockers:
            raise PreflightError(bundle.name, blockers, again_command(options, bundle, config))
        log.info("preflight: no blockers")
    return run


def after_sources(run: BuildRun, sources: Mapping[str, CheckedOutSource]) -> BuildRun:
    commits: dict[str, str | None] = {name: s.commit for name, s in sources.items()}
    spec, keys = compose(run.options, run.bundle, run.config, commits)
    return replace(run, commits=commits, spec=spec, keys=keys)


def mounts(run: BuildRun, extra: tuple[Path, ...] = ()) -> list[Mount]:
    spec = run.spec
    writable = [
        run.layout.work,
        Path(spec.torch_stage).parent,
        Path(spec.bazel_disk_cache),
        Path(spec.bazel_output_root),
        Path(spec.ccache_dir),
        Path(spec.pip_cache_dir),
    ]
    result = [Mount(Path(path), read_only=True) for path in dict.fromkeys(spec.pipeline_src)]
    source_cache = run.options.source_cache
    result.append(Mount(source_cache, read_only=True))
    result += [Mount(path) for path in dict.fromkeys(writable)]
    result += [Mount(path, read_only=True) for path in extra]
    return result


def secrets_path(run: BuildRun) -> Path:
    return Path(run.spec.private_dir) / "secrets.json"


@contextmanager
def secrets_for_build(run: BuildRun) -> Iterator[None]:
    """The credentials in a 0600 file for the builder while it runs, then removed (with
    the Bazel auth rc the recipe writes next to it), whether the build passed or not."""
    secrets = run.config.remote_cache.secret_values()
    if not secrets:
        yield
        return
    path = secrets_path(run)
    remote_cache.write_private_file(path, json.dumps(secrets))
    try:
        yield
    finally:
        for name in (path.name, Path(recipes.bazel_auth_rc_path(run.spec)).name):
            (path.parent / name).unlink(missing_ok=True)


def engine_for(run: BuildRun, extra: tuple[Path, ...] = ()) -> Engine:
    env = {"PYTHONPATH": os.pathsep.join(run.spec.pipeline_src), "PYTHONDONTWRITEBYTECODE": "1"}
    if run.config.remote_cache.secrets and not extra:
        # A path, not a credential: the builder reads the values from the file.
        env[remote_cache.ENV_SECRETS_FILE] = str(secrets_path(run))
    return make_engine(
        run.config.mode, run.config.engine, run.config.image, mounts(run, extra), env
    )


def entry_argv(run: BuildRun, name: str, staging: str | None = None) -> list[str]:
    spec = str(run.layout.spec_path)
    argv = [run.spec.python, "-m", ENTRY_MODULE, "--spec", spec, "--recipe", name]
    return argv + (["--staging", staging] if staging else [])


def _write_spec(run: BuildRun) -> None:
    """The spec file, and every directory the engine mounts or the recipes write."""
    for mount in mounts(run):
        if not mount.read_only:
            mount.path.mkdir(parents=True, exist_ok=True)
    run.options.source_cache.mkdir(parents=True, exist_ok=True)
    run.spec.write(run.layout.spec_path)


def build(run: BuildRun) -> None:
    """Run each recipe whose stage is not cached, in one engine session."""
    todo = [name for name in RECIPES if not run.cached(name)]
    for name in RECIPES:
        if name not in todo:
            log.info(f"build: {name} stage cached: {stage_wheel(run.stage_dir(name))}")
            run.timings.add(f"build: {name}", 0.0, "cached")
        elif run.keys is not None and (why := unfinished(run.stage_dir(name))):
            log.warning(
                f"build: {name} stage {run.stage_dir(name)} is not reused: {why}; "
                "it is built again"
            )
    if not todo:
        return
    _write_spec(run)
    log.info(f"build spec: {run.layout.spec_path}")
    with secrets_for_build(run), engine_for(run) as engine:
        for name in todo:
            with run.timings.stage(f"build: {name}"):
                code = engine.call(entry_argv(run, name))
                _raise_if_disk_fault(run, code, f"the {name} build")
                wheel = built_wheel(run.stage_dir(name))
                if code != 0 or wheel is None:
                    raise BuildFailed(
                        f"the {name} build failed (exit {code}); nothing was collected",
                        fix=f"read {run.spec.logs}/{name}.log",
                    )
                # On the host: the SBOM library is not in the builder image (xla_wheels.sbom).
                # The stage is finished (reusable, ``stage_wheel``) only once the record
                # names the wheel with its SBOM: a run stopped before leaves it unfinished.
                sbom.add_sbom(
                    wheel,
                    Provenance.from_json(run.spec.provenance),
                    wheel_stamp.epoch_from(run.spec.extra_env),
                )
                record_stage(wheel)
                log.info(f"build: {sbom.arcname(wheel)} added to {wheel.name}")


def collect(run: BuildRun) -> Path:
    """Ship check on staged wheels, then the atomic move into dist/<bundle> and the lock."""
    layout, name = run.layout, run.bundle.name
    # A stage wheel never replaces a recorded one silently (see ``builder.rebuilt_wheels``).
    rebuilt_wheels.settle(
        run.wheels(),
        bundle=name,
        lock_path=layout.lock_path,
        dist_root=layout.dist_root,
        cache_dir=run.options.cache_dir,
        keep_recorded=run.config.keep_recorded,
        build_tag=run.config.build_tag,
    )
    wheels = run.wheels()
    if up_to_date(layout, wheels):
        log.info(f"collect: {layout.dist} already holds these wheels")
        run.timings.add("collect", 0.0, "up to date")
        record_collected(layout)
        return layout.dist
    with ExitStack() as cleanup:
        with run.timings.stage("collect: ship check"):
            staged = cleanup.enter_context(staging(layout, wheels))
            _abi_check(staged, name)
            _write_spec(run)
            with engine_for(run, extra=(staged,)) as engine:
                code = engine.call(entry_argv(run, "ship", str(staged)))
            # A full disk is not a verdict on the wheels.
            _raise_if_disk_fault(run, code, "the ship check", staged)
            if code != 0:
                raise ShipCheckFailed(
                    f"the ship check failed on the new {name} wheels (exit {code}); they "
                    f"were kept out of dist/{name}",
                    fix=f"read {run.spec.logs}/ship.log",
                )
        # The lock is written here, inside its row of the table, together with dist/:
        # the row says "ran" only once both are in place.
        with run.timings.stage("collect: wheels.lock"):
            target = commit_with_lock(layout, staged)
    return target


def _raise_if_disk_fault(run: BuildRun, code: int, step: str, *extra: Path) -> None:
    """The recipe exits :data:`~xla_wheels.disk_faults.DISK_FAULT_EXIT` when its tools
    reported a full disk or a read-only filesystem (it printed their message): a
    :class:`~xla_host.errors.DiskError` naming the directory it writes that is the
    cause, not a failure of the build or of the wheels."""
    if code != disk_faults.DISK_FAULT_EXIT:
        return
    written = [mount.path for mount in mounts(run) if not mount.read_only]
    raise disk_faults.step_disk_error(step, [*written, *extra])


def _abi_check(staging: Path, name: str) -> None:
    """The ABI check of the staged pair, on the host, before the check in the builder."""
    try:
        abi_ship.check_staged(sorted(staging.glob("*.whl")), f"the staged wheels of {name}")
    except AbiMismatch as error:
        raise ShipCheckFailed(
            f"the ship check's ABI check failed on the new {name} wheels; they were kept out "
            f"of dist/{name}: {error.message}",
            fix=error.fix,
        ) from None


def plan_stages(
    options: PipelineOptions, bundle: Bundle, config: BuildConfig
) -> tuple[PlannedStage, list[PlannedStage]]:
    """Preflight as :func:`prepare` runs it (same check list, same ``need_sources``), and
    build and collect as the run will execute them."""
    run = _offline_run(options, bundle, config)
    preflight = planned_preflight(options, bundle, config, need_sources=not run.all_cached)
    commits, spec, keys = run.commits, run.spec, run.keys
    engine = engine_for(run)

    def line(argv: list[str] | None, note: str = "") -> list[str]:
        """The command as a plan line; none for no command (the host starts nothing)."""
        return ["$ " + PlannedCommand(tuple(argv), note=note).render()] if argv else []

    credentials = (
        f"credentials ({', '.join(key for key, _ in config.remote_cache.secrets)}): "
        f"written to {secrets_path(run)} (mode 0600) for the build, removed after; "
        f"shown here as {remote_cache.REDACTED}"
    )
    setup_facts = [
        f"openxla {commits['openxla'] or bundle.component('openxla').commit or 'UNPINNED'}"
        " replaces torch_xla's WORKSPACE pin via --override_repository (.bazelrc.user)",
        f"bazel disk cache {spec.bazel_disk_cache}",
        remote_cache.describe(config.remote_cache.settings)
        + f" (from {config.remote_cache.source})",
        *([credentials] if config.remote_cache.secrets else []),
        f"logs {spec.logs}/<recipe>.log; spec {run.layout.spec_path}",
    ]
    if config.mode == "container":
        image_argv = build_image_argv(config.engine, config.image, options.root)
        setup_facts += line(image_argv, "once: `make builder-image`")
    setup_facts += line(engine.start_argv())
    stages = [PlannedStage("build: builder", tuple(setup_facts))]
    versions = {"torch": spec.torch_version, "torch_xla": spec.torch_xla_version}
    key_fact = "stage key: computed once the sources stage resolves " + ", ".join(
        f"{c.name} {c.commit}" for c in bundle.components.values() if not commits.get(c.name)
    )
    for name in RECIPES:
        state = "cached: skipped" if run.cached(name) else "built"
        facts = [
            f"{name} {versions[name]} at full SHA {commits[name] or '(resolved by sources)'}",
            *([] if keys else [key_fact]),
            f"stage {run.stage_dir(name)} ({state})",
            *line(engine.call_argv(entry_argv(run, name)), f"recipe {name}, which runs:"),
            *(f"    {step.render()}" for step in recipes.recipe(spec, name)),
            f"then on the host: CycloneDX SBOM into {name}'s .dist-info/sboms/{sbom.SBOM_NAME}",
        ]
        stages.append(PlannedStage(f"build: {name}", tuple(facts)))
    staging = str(run.layout.dist_root / f"{run.layout.staging_prefix}XXXXXXXX")
    ship_engine = engine_for(run, extra=(Path(staging),))
    collect_facts = [
        *line(engine.stop_argv()),
        f"copy both wheels into {staging} (sha256 checked); a second container mounts it",
        "ABI check on the host (make abi-check): every symbol _XLAC of the staged torch_xla "
        "imports must be exported by the staged torch's libraries; missing -> fail",
        *line(ship_engine.start_argv()),
        *line(ship_engine.call_argv(entry_argv(run, "ship", staging)), "ship check, which runs:"),
        *(f"    {step.render()}" for step in recipes.ship_steps(spec, staging)),
        *line(ship_engine.stop_argv()),
        f"check passes -> rename to {run.layout.dist} (atomic); "
        "fails -> staging removed, dist/ untouched",
        "wheels.lock: name, size, sha256 of each wheel",
    ]
    stages.append(PlannedStage("collect", tuple(collect_facts)))
    return preflight, stages
