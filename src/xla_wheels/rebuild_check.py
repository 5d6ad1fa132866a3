"""``make rebuild-check BUNDLE=…``: build the bundle's wheels again, from nothing, and
compare them byte for byte with the ones ``wheels.lock`` records.

The rebuild runs the same stages as ``make wheels`` (sources, patches, the recipes, the
SBOM) but into fresh directories under ``out/<bundle>/rebuild-check/``: fresh worktrees,
a fresh stage directory and fresh local compile caches (Bazel's disk cache, its output
root, ccache), so nothing is replayed from the build being checked. The fetched git
objects (the source cache) are shared: they are content addressed by commit. A remote
compile cache, when one is configured, is still used: unset it for a rebuild that
compiles every action (docs/supply-chain.md "Rebuild check").

Nothing of the recorded build changes: no stage cache entry, no ``dist/``, no
``wheels.lock`` wheel record. The compared pairs are the recorded file (found by its
locked sha256 in ``dist/`` or the stage cache) and the rebuilt one; on a difference,
diffoscope's report (text and JSON) is kept in ``out/<bundle>/logs/rebuild-check/``,
and the first differing member of each wheel is named: the first entry, in the
recorded wheel's order, that is missing from one side or differs in bytes, date or mode.
"""

from __future__ import annotations

import shutil
import sys
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path

from xla_host import log, runner
from xla_host.errors import CheckFailed, PipelineError
from xla_host.filemode import file_sha256
from xla_host.wheel_filename import parse_wheel_name
from xla_wheels.builder import build_and_collect as build_stage
from xla_wheels.builder import rebuilt_wheels as recorded_mod
from xla_wheels.builder.config import BuildConfig
from xla_wheels.bundle import Bundle
from xla_wheels.checks_before_fetch import check_before_fetch
from xla_wheels.layout import BundleLayout
from xla_wheels.options import PipelineOptions
from xla_wheels.publish.wheels import locked_records
from xla_wheels.wheels_lock import WheelRecord, read_lock

REBUILD_DIR = "rebuild-check"
DIFFOSCOPE_TIMEOUT_S = 3600.0


class RebuildDiffers(CheckFailed):
    """A rebuilt wheel is not byte-identical to the recorded one (exit 1)."""


@dataclass(frozen=True)
class Comparison:
    recorded: str
    recorded_sha256: str
    rebuilt: str
    rebuilt_sha256: str
    first_difference: str | None
    """None when identical; else the first differing member (or the file name)."""
    report: Path | None
    """diffoscope's text report, when the bytes differ and the recorded file was found."""

    @property
    def identical(self) -> bool:
        return self.recorded == self.rebuilt and self.recorded_sha256 == self.rebuilt_sha256


def first_differing_member(recorded: Path, rebuilt: Path) -> str | None:
    """The first entry (in ``recorded``'s order, then ``rebuilt``'s extra ones) whose
    bytes, date or mode differ, or that one side lacks; None for the same entries."""
    with zipfile.ZipFile(recorded) as old, zipfile.ZipFile(rebuilt) as new:
        new_infos = {info.filename: info for info in new.infolist()}
        for info in old.infolist():
            other = new_infos.pop(info.filename, None)
            if other is None:
                return f"{info.filename} (only in the recorded wheel)"
            if (info.date_time, info.external_attr) != (other.date_time, other.external_attr):
                return f"{info.filename} (date or mode)"
            if info.CRC != other.CRC or old.read(info) != new.read(other):
                return f"{info.filename} (content)"
        if new_infos:
            return f"{next(iter(new_infos))} (only in the rebuilt wheel)"
    return None


def run_diffoscope(recorded: Path, rebuilt: Path, report_dir: Path) -> Path:
    """diffoscope's report of the two files, as text and JSON in ``report_dir``.

    Its exit code is 1 when the files differ (expected here), 2 on its own error.
    """
    report_dir.mkdir(parents=True, exist_ok=True)
    text = report_dir / f"{rebuilt.name}.diffoscope.txt"
    argv = [
        str(Path(sys.executable).with_name("diffoscope")),
        "--text", str(text),
        "--json", str(report_dir / f"{rebuilt.name}.diffoscope.json"),
        str(recorded), str(rebuilt),
    ]  # fmt: skip
    done = runner.run(argv, echo="log", timeout=DIFFOSCOPE_TIMEOUT_S, check=False)
    if done.returncode not in (0, 1):
        raise PipelineError(
            f"diffoscope failed (exit {done.returncode}): {done.stderr.strip()[-500:]}",
            fix="install the tools it names (`make supply-tools` as root installs the ones "
            "zip files need: unzip, binutils)",
        )
    return text


def rebuild_check(
    options: PipelineOptions, bundle: Bundle, config: BuildConfig
) -> list[Comparison]:
    """Rebuild, compare, report; raises :class:`RebuildDiffers` after writing the reports.
    The caller holds the bundle's run lock (the CLI edge)."""
    check_before_fetch(options, bundle)
    records = locked_records(read_lock(options.lock_path), bundle.name)
    layout = BundleLayout.of(options, bundle.name)
    work = layout.work / REBUILD_DIR
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    fresh_options = replace(options, out_dir=work / "out")
    from xla_wheels import pipeline  # the stages, as `make wheels` runs them

    run = build_stage.prepare(fresh_options, bundle, config)
    try:
        with run.timings.stage("sources"):
            sources = pipeline.run_sources(fresh_options, bundle)
        with run.timings.stage("patches"):
            patched = pipeline.run_patches(bundle, sources)
        run = build_stage.after_sources(run, patched.sources)
        spec = replace(
            run.spec,
            torch_stage=str(work / "stages" / "torch"),
            torch_xla_stage=str(work / "stages" / "torch_xla"),
            bazel_disk_cache=str(work / "bazel-disk-cache"),
            bazel_output_root=str(work / "bazel-root"),
            ccache_dir=str(work / "ccache"),
        )
        run = replace(run, spec=spec)
        build_stage.build(run)
        rebuilt = run.wheels()
    finally:
        run.timings.report()
    rebuild_logs = BundleLayout.of(fresh_options, bundle.name).logs
    log.info(f"rebuild-check: the rebuild's logs are in {rebuild_logs}")
    return _compare(options, layout, records, rebuilt)


def _compare(
    options: PipelineOptions,
    layout: BundleLayout,
    records: list[WheelRecord],
    rebuilt: list[Path],
) -> list[Comparison]:
    report_dir = layout.logs / REBUILD_DIR
    if report_dir.exists():
        shutil.rmtree(report_dir)
    by_project = {parse_wheel_name(w.name).project: w for w in rebuilt}
    comparisons = []
    for record in records:
        project = parse_wheel_name(record.name).project
        wheel = by_project.get(project)
        if wheel is None:
            raise PipelineError(f"the rebuild made no {project} wheel (see its logs)")
        sha256 = file_sha256(wheel)
        first, report = None, None
        if record.name != wheel.name or record.sha256 != sha256:
            found = recorded_mod.find_recorded_file(
                recorded_mod.Recorded(layout.bundle, record.name, record.sha256),
                layout.dist_root,
                options.cache_dir,
            )
            if found is None:
                first = "the recorded file is in neither dist/ nor the stage cache: not compared"
            else:
                first = first_differing_member(found, wheel) or "the zip structure (same members)"
                with log.section(f"rebuild-check: diffoscope {record.name}"):
                    report = run_diffoscope(found, wheel, report_dir)
            if record.name != wheel.name:
                first = f"the file name ({wheel.name}); then {first}"
        comparisons.append(
            Comparison(record.name, record.sha256, wheel.name, sha256, first, report)
        )
    return comparisons


def ensure_identical(bundle: str, comparisons: list[Comparison]) -> None:
    differing = [c for c in comparisons if not c.identical]
    if not differing:
        return
    lines = [
        f"{c.recorded}: first difference {c.first_difference}"
        + (f"; report {c.report}" if c.report else "")
        for c in differing
    ]
    raise RebuildDiffers(
        f"the rebuild of {bundle} is not byte-identical to the recorded wheels:\n  "
        + "\n  ".join(lines),
        fix="read the diffoscope report: a date, a path or a random value in the named member "
        "is what the build must stop writing (SOURCE_DATE_EPOCH, relative paths, fixed seeds)",
    )
