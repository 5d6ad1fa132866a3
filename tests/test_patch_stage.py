"""Patch stage: series applied in order with real git, all or nothing, headers enforced."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.gitrepos import (
    RUNTIME_CC,
    Upstream,
    diff_for,
    git,
    git_raw,
    make_project,
    patch_text,
)
from xla_host.errors import PatchError
from xla_wheels.bundle import load_bundle
from xla_wheels.patches import apply_series, check_series, parse_patch, series_digest
from xla_wheels.sources import SourceCache, fetch_sources


def good_patches(upstream: Upstream) -> dict[str, str]:
    base = upstream.commits[-1]
    first = RUNTIME_CC.replace("// two-step path", "// load path")
    second = first.replace("Stats(device).value()", "StatsOrError(device)")
    return {
        "0001-load.patch": patch_text(
            "torch_xla", base, diff_for(upstream, base, {"src/runtime.cc": first})
        ),
        "0002-stats.patch": patch_text(
            "torch_xla", base, _diff_on_top(upstream, base, first, second)
        ),
    }


def _diff_on_top(upstream: Upstream, base: str, first: str, second: str) -> str:
    scratch = upstream.path.parent / "stacked"
    git(upstream.path.parent, "clone", "-q", upstream.url, str(scratch))
    git(scratch, "checkout", "-q", base)
    (scratch / "src/runtime.cc").write_text(first)
    git(scratch, "commit", "-qam", "first")
    (scratch / "src/runtime.cc").write_text(second)
    return git_raw(scratch, "diff")


def prepared(tmp_path: Path, upstreams: dict[str, Upstream], patches: dict[str, str]):
    project = make_project(tmp_path, upstreams, patches={"torch_xla": patches})
    bundle = load_bundle(project, "test-1")
    sources = fetch_sources(bundle, SourceCache(tmp_path / "cache", None), tmp_path / "src")
    return bundle, sources["torch_xla"]


def test_the_series_applies_in_order_and_is_recorded(tmp_path, upstreams) -> None:
    bundle, source = prepared(tmp_path, upstreams, good_patches(upstreams["torch_xla"]))
    series = apply_series(source.worktree, bundle.component("torch_xla"), source.commit)
    text = (source.worktree / "src/runtime.cc").read_text()
    assert "// load path" in text and "StatsOrError(device)" in text
    assert [p.relpath for p in series.patches] == [
        "torch_xla/0001-load.patch",
        "torch_xla/0002-stats.patch",
    ]
    assert series.digest == series_digest(series.patches)
    assert len(series.digest) == 64


def test_the_series_digest_depends_on_order_and_content(tmp_path, upstreams) -> None:
    bundle, source = prepared(tmp_path, upstreams, good_patches(upstreams["torch_xla"]))
    series = apply_series(source.worktree, bundle.component("torch_xla"), source.commit)
    assert series_digest(tuple(reversed(series.patches))) != series.digest


def test_a_conflict_names_patch_file_and_hunk_and_restores_the_worktree(
    tmp_path, upstreams
) -> None:
    patches = good_patches(upstreams["torch_xla"])
    # 0003 was made against an older text: its hunk cannot apply after 0001 and 0002.
    base = upstreams["torch_xla"].commits[-1]
    stale = patch_text(
        "torch_xla",
        base,
        diff_for(
            upstreams["torch_xla"],
            base,
            {"src/runtime.cc": RUNTIME_CC.replace("Stats(device).value()", "Other(device)")},
        ),
    )
    patches["0003-stale.patch"] = stale
    bundle, source = prepared(tmp_path, upstreams, patches)
    before = (source.worktree / "src/runtime.cc").read_text()
    with pytest.raises(PatchError) as caught:
        apply_series(source.worktree, bundle.component("torch_xla"), source.commit)
    message = caught.value.message
    assert "patches/torch_xla/0003-stale.patch does not apply" in message
    assert "file src/runtime.cc" in message
    assert "first failing hunk @@ -6," in message
    assert "2 earlier patch(es) of the series undone" in message
    assert (source.worktree / "src/runtime.cc").read_text() == before
    assert git(source.worktree, "status", "--porcelain") == ""
    assert git(source.worktree, "rev-parse", "HEAD") == source.commit


def test_a_patch_for_a_missing_file_names_the_file(tmp_path, upstreams) -> None:
    base = upstreams["torch_xla"].commits[-1]
    diff = diff_for(upstreams["torch_xla"], base, {"src/runtime.cc": RUNTIME_CC + "// end\n"})
    diff = diff.replace("src/runtime.cc", "src/gone.cc")
    bundle, source = prepared(
        tmp_path, upstreams, {"0001-gone.patch": patch_text("torch_xla", base, diff)}
    )
    with pytest.raises(PatchError) as caught:
        apply_series(source.worktree, bundle.component("torch_xla"), source.commit)
    assert "target file src/gone.cc does not exist" in caught.value.message


def test_a_patch_without_the_header_is_refused_before_anything_applies(tmp_path, upstreams) -> None:
    patches = good_patches(upstreams["torch_xla"])
    patches["0002-stats.patch"] = (
        patches["0002-stats.patch"].split("\n\n", 1)[1].split("\n\n", 1)[1]
    )
    bundle, source = prepared(tmp_path, upstreams, patches)
    with pytest.raises(PatchError) as caught:
        apply_series(source.worktree, bundle.component("torch_xla"), source.commit)
    assert "0002-stats.patch: header is missing Subject" in caught.value.message
    assert git(source.worktree, "status", "--porcelain") == ""


def test_header_checks(tmp_path) -> None:
    diff = "diff --git a/x.cc b/x.cc\n--- a/x.cc\n+++ b/x.cc\n@@ -1 +1 @@\n-a\n+b\n"
    header = (
        "Subject: s\nComponent: torch_xla\nBase: " + "a" * 40 + "\nFixes: f\nWhy: w\n"
        "Upstream: not upstreamed\nFiles: x.cc\n\nbody\n\n"
    )
    path = tmp_path / "p.patch"

    def error(text: str) -> str:
        path.write_text(text)
        with pytest.raises(PatchError) as caught:
            parse_patch(path, component="torch_xla")
        return caught.value.message

    path.write_text(header + diff)
    parsed = parse_patch(path, component="torch_xla")
    assert parsed.declared_files == ("x.cc",)
    assert "Files lists y.cc but the diff touches x.cc" in error(
        header.replace("Files: x.cc", "Files: y.cc") + diff
    )
    assert "is not a full 40-hex commit SHA" in error(header.replace("a" * 40, "abc1234") + diff)
    assert "bundle lists it under torch_xla" in error(
        header.replace("Component: torch_xla", "Component: torch") + diff
    )
    assert "unknown header key 'Reason'" in error(header.replace("Why: w", "Reason: w") + diff)
    assert "starts like a diff" in error(header.replace("body", "--- a/x.cc is the file") + diff)
    assert "no 'diff --git' section" in error(header)


def test_check_mode_reports_each_patch_and_leaves_the_source_untouched(tmp_path, upstreams) -> None:
    patches = good_patches(upstreams["torch_xla"])
    project = make_project(tmp_path, upstreams, patches={"torch_xla": patches})
    component = load_bundle(project, "test-1").component("torch_xla")
    upstream = upstreams["torch_xla"]
    head_before = git(upstream.path, "rev-parse", "HEAD")
    results = check_series(upstream.path, upstream.commits[-1], component)
    assert [r.applied for r in results] == [True, True]
    assert "applies" in results[1].detail
    assert git(upstream.path, "status", "--porcelain") == ""
    assert git(upstream.path, "rev-parse", "HEAD") == head_before


def test_check_mode_stops_at_the_first_failing_patch(tmp_path, upstreams) -> None:
    upstream = upstreams["torch_xla"]
    base = upstream.commits[-1]
    good = good_patches(upstream)
    other = patch_text(
        "torch_xla",
        base,
        diff_for(
            upstream,
            base,
            {"src/runtime.cc": RUNTIME_CC.replace("Stats(device).value()", "Other(device)")},
        ),
    )
    series = {
        "0001-other.patch": other,
        "0002-stats.patch": good["0002-stats.patch"],
        "0003-load.patch": good["0001-load.patch"],
    }
    project = make_project(tmp_path, upstreams, patches={"torch_xla": series})
    component = load_bundle(project, "test-1").component("torch_xla")
    results = check_series(upstream.path, base, component)
    assert [r.applied for r in results] == [True, False]  # 0003 is never tried
    assert "0002-stats.patch does not apply: file src/runtime.cc" in results[1].detail


def test_the_shipped_patches_pass_the_stage_header_checks() -> None:
    from tests.gitrepos import REPO_ROOT

    bundle = load_bundle(REPO_ROOT, "v6e-2.9")
    for ref in bundle.component("torch_xla").patches:
        header = parse_patch(ref.path, component="torch_xla")
        assert header.base == bundle.component("torch_xla").commit
        assert header.fields["Verified"] and header.fields["Not-verified"]
