"""Every table format the pipeline reads reports a bad key the same way, through its real loader.

One table of bad inputs across bundle manifests, ``wheels.lock``, ``build/lanes.toml``,
``build/builders.toml`` and the provenance file: an unknown key gets a "did you mean"
suggestion, a wrong type names the expected one, a missing required key says so; each
message names the file and the dotted key, and the format's own error class (and so its
exit code) carries a fix.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.gitrepos import REPO_ROOT
from xla_host.errors import LockError, ManifestError, PipelineError
from xla_host.provenance import (
    BuildSettings,
    ComponentProvenance,
    PatchDigest,
    Provenance,
    ProvenanceFormatError,
)
from xla_wheels.builder.remote_cache import RemoteCacheConfigError, load_remote_cache
from xla_wheels.bundle import load_bundle
from xla_wheels.release.lanes import LaneError, LaneFileError, load_config, read_state
from xla_wheels.wheels_lock import read_lock

MANIFEST = """\
[bundle]
name = "demo"
python = "3.13"

[components.torch]
remote = "https://github.com/pytorch/pytorch.git"
commit = "21fec65781bebe867faf209f89bb687ffd236ca4"
version = "2.9.0a0"

[components.torch_xla]
remote = "https://github.com/pytorch/xla.git"
commit = "c04e61c"
version = "2.9.0"

[components.openxla]
remote = "https://github.com/openxla/xla.git"
unpinned = "nobody knows yet"
"""

LANES = """\
publish-lane = "validation"

[lanes.validation]
description = "every published bundle"
path = "dist/lanes/validation"

[lanes.validation.policy]
checks = ["restart"]
"""

BUILDERS = """\
[builder]
role = "reader"

[bazel]
remote_cache = "grpcs://cache.example.com:443"

[ccache]
remote_storage = "redis://cache.example.com:6379"
"""

PROVENANCE = Provenance(
    built_by="xla-wheels",
    build=BuildSettings("host", "host", None, {"cxx_abi": 1}),
    components={
        "torch_xla": ComponentProvenance(
            "c04e61c3424142c0eebcc9e59984b9d8fced18c0", "2.9.0", (PatchDigest("p", "0" * 64),), "d"
        )
    },
).to_bytes()


def load_manifest(root: Path, text: str) -> object:
    (root / "build" / "bundles").mkdir(parents=True)
    (root / "build" / "bundles" / "demo.toml").write_text(text)
    return load_bundle(root, "demo")


def load_lock(root: Path, text: str) -> object:
    (root / "wheels.lock").write_text(text)
    return read_lock(root / "wheels.lock")


def load_lanes(root: Path, text: str) -> object:
    (root / "build").mkdir()
    (root / "build" / "lanes.toml").write_text(text)
    return load_config(root)


LANES_LOCK = """\
lanes-lock-version = "1"

[lanes.validation]
bundle = "v6e-2.9"
wheels = [{ name = "torch_xla-2.9.0-cp313-cp313-linux_x86_64.whl", sha256 = "00" }]
"""


def load_lanes_lock(root: Path, text: str) -> object:
    (root / "lanes.lock").write_text(text)
    return read_state(root)


def load_builders(root: Path, text: str) -> object:
    (root / "build").mkdir()
    (root / "build" / "builders.toml").write_text(text)
    return load_remote_cache(root, {})


def load_provenance(root: Path, text: str) -> object:
    return Provenance.from_bytes(text.encode())


@dataclass(frozen=True)
class Format:
    load: Callable[[Path, str], object]
    good: str
    error: type[Exception]
    file: str
    """How the message names the file ("" when the reader gets bytes, not a file)."""


FORMATS = {
    "manifest": Format(load_manifest, MANIFEST, ManifestError, "demo.toml"),
    "wheels.lock": Format(
        load_lock, (REPO_ROOT / "wheels.lock").read_text(), LockError, "wheels.lock"
    ),
    "lanes": Format(load_lanes, LANES, LaneError, "lanes.toml"),
    "lanes.lock": Format(load_lanes_lock, LANES_LOCK, LaneError, "lanes.lock"),
    "builders": Format(load_builders, BUILDERS, RemoteCacheConfigError, "builders.toml"),
    "provenance": Format(load_provenance, PROVENANCE.decode(), ProvenanceFormatError, ""),
}

CASES = [
    # (format, text replaced, replacement, in the message, in the fix)
    (
        "manifest",
        'commit = "c04e61c"',
        'comit = "c04e61c"',
        "key 'components.torch_xla.comit': unknown key; did you mean 'commit'?",
        "rename it to 'commit'",
    ),
    (
        "manifest",
        'python = "3.13"',
        "python = 3.13",
        "key 'bundle.python': expected str, got float",
        "write it as type str",
    ),
    (  # bool is an int in Python, never in a TOML knob
        "manifest",
        'unpinned = "nobody knows yet"\n',
        'unpinned = "nobody knows yet"\n[build]\ncxx_abi = true\n',
        "key 'build.cxx_abi': expected int, got bool True",
        "write it as type int",
    ),
    (
        "manifest",
        'remote = "https://github.com/pytorch/xla.git"\n',
        "",
        "key 'components.torch_xla.remote': missing",
        "add 'remote = ...' to [components.torch_xla]",
    ),
    (
        "wheels.lock",
        'manifest-sha256 = "',
        'manifest-sha265 = "',
        "key 'bundles.v6e-2.11.manifest-sha265': unknown key; did you mean 'manifest-sha256'?",
        "git checkout -- wheels.lock",
    ),
    (
        "wheels.lock",
        "commit-resolved = false",
        'commit-resolved = "no"',
        "key 'bundles.v6e-2.11.components.torch.commit-resolved': expected bool, got str",
        "git checkout -- wheels.lock",
    ),
    (
        "wheels.lock",
        'python = "3.13"\n',
        "",
        "key 'bundles.v6e-2.11.python': missing",
        "git checkout -- wheels.lock",
    ),
    (
        "lanes",
        "checks = [",
        "chekcs = [",
        "key 'lanes.validation.policy.chekcs': unknown key; did you mean 'checks'?",
        "docs/lanes.md",
    ),
    (
        "lanes",
        'checks = ["restart"]',
        'checks = "restart"',
        "key 'lanes.validation.policy.checks': expected list, got str",
        "edit",
    ),
    (
        "lanes.lock",
        'bundle = "v6e-2.9"',
        'bundel = "v6e-2.9"',
        "key 'lanes.validation.bundel': unknown key; did you mean 'bundle'?",
        "git checkout -- lanes.lock",
    ),
    (
        "lanes.lock",
        'sha256 = "00"',
        "sha = 0",
        "key 'lanes.validation.wheels[0].sha': unknown key; did you mean 'sha256'?",
        "git checkout -- lanes.lock",
    ),
    (
        "builders",
        "remote_cache =",
        "remote_cahce =",
        "key 'bazel.remote_cahce': unknown key; did you mean 'remote_cache'?",
        "rename it to 'remote_cache'",
    ),
    (
        "builders",
        'remote_storage = "redis://cache.example.com:6379"',
        "remote_storage = 6379",
        "key 'ccache.remote_storage': expected str, got int",
        "write it as type str",
    ),
    (
        "provenance",
        '"commit":',
        '"comit":',
        "key 'components.torch_xla.comit': unknown key; did you mean 'commit'?",
        None,
    ),
    (
        "provenance",
        '"built_by": "xla-wheels"',
        '"built_by": 1',
        "key 'built_by': expected str, got int",
        None,
    ),
    (
        "provenance",
        '"series_sha256": "d"',
        '"remote": "https://github.com/pytorch/xla.git"',  # retired: read and ignored
        "key 'components.torch_xla.series_sha256': missing",
        None,
    ),
]


#: What each format's good file says, as its loader must return it: a loader that returned
#: an empty or default object for a good file would pass a test that only loads it.
def _lane_directory(config: Any, name: str) -> Path:
    directory = config.lanes[name].backend.directory
    assert directory is not None, f"lane {name} is not a directory"
    return Path(directory)


GOOD_READS: dict[str, Callable[[Any], object]] = {
    "manifest": lambda bundle: (
        bundle.name, bundle.python, bundle.components["torch_xla"].commit,
        bundle.components["openxla"].commit, bundle.components["openxla"].unpinned_reason,
    ),
    "wheels.lock": lambda lock: (
        lock.bundles["v6e-2.11"].manifest, lock.bundles["v6e-2.11"].python,
        lock.bundles["v6e-2.11"].components["torch_xla"].resolved,
    ),
    "lanes": lambda config: (
        config.publish_lane,
        _lane_directory(config, "validation").relative_to(config.path.parents[1]),
        config.lanes["validation"].policy.checks,
    ),
    "lanes.lock": lambda state: (state["validation"].bundle, state["validation"].wheels),
    "builders": lambda cache: (
        cache.settings.role, cache.settings.bazel.cache, cache.settings.ccache.storage,
    ),
    "provenance": lambda provenance: (
        provenance.built_by, provenance.build.knobs,
        provenance.components["torch_xla"].series_sha256,
    ),
}  # fmt: skip

GOOD_SAYS: dict[str, object] = {
    "manifest": ("demo", "3.13", "c04e61c", None, "nobody knows yet"),
    "wheels.lock": ("build/bundles/v6e-2.11.toml", "3.13", True),
    "lanes": ("validation", Path("dist/lanes/validation"), ("restart",)),
    "lanes.lock": ("v6e-2.9", (("torch_xla-2.9.0-cp313-cp313-linux_x86_64.whl", "00"),)),
    "builders": ("reader", "grpcs://cache.example.com:443", "redis://cache.example.com:6379"),
    "provenance": ("xla-wheels", {"cxx_abi": 1}, "d"),
}


@pytest.mark.parametrize("name", FORMATS)
def test_the_good_file_of_each_format_loads_what_it_says(tmp_path: Path, name: str) -> None:
    form = FORMATS[name]
    loaded = form.load(tmp_path, form.good)
    assert GOOD_READS[name](loaded) == GOOD_SAYS[name]


@pytest.mark.parametrize(("name", "old", "new", "message", "fix"), CASES)
def test_a_bad_key_is_named_with_its_file_and_a_fix(
    tmp_path: Path, name: str, old: str, new: str, message: str, fix: str | None
) -> None:
    form = FORMATS[name]
    assert form.good.count(old) >= 1, "the case must change the good file"
    with pytest.raises(form.error) as caught:
        form.load(tmp_path, form.good.replace(old, new, 1))
    text = str(caught.value)
    assert message in text
    assert form.file in text.splitlines()[0]
    if isinstance(caught.value, PipelineError):
        assert fix is not None and caught.value.fix is not None and fix in caught.value.fix


@pytest.mark.parametrize(
    ("name", "old", "new"), [case[:3] for case in CASES if FORMATS[case[0]].file]
)
def test_the_exit_codes_are_the_formats_own(tmp_path: Path, name: str, old: str, new: str) -> None:
    # A malformed file in the checkout is bad input, exit 2, whichever format it is and
    # whichever of its classes the loader raises (a well-formed lock that is stale, or a
    # lane refusing a bundle, is a failed step: LockError, LaneError, exit 1). The
    # provenance file is read as bytes (ProvenanceFormatError): its readers decide.
    form = FORMATS[name]
    with pytest.raises(PipelineError) as caught:
        form.load(tmp_path, form.good.replace(old, new, 1))
    assert caught.value.exit_code == 2, type(caught.value).__name__


def test_json_null_is_an_absent_optional_field_and_not_a_present_required_one() -> None:
    data = json.loads(PROVENANCE)
    assert data["build"]["image"] is None
    assert Provenance.from_json(data).build.image is None
    data["built_by"] = None
    with pytest.raises(ProvenanceFormatError, match="key 'built_by': missing"):
        Provenance.from_json(data)


@pytest.mark.parametrize("name", [name for name, f in FORMATS.items() if f.file])
def test_a_file_saved_with_a_byte_order_mark_is_told_so(tmp_path: Path, name: str) -> None:
    # tomllib's own message was "Invalid statement (at line 1, column 1)".
    fmt = FORMATS[name]
    with pytest.raises(fmt.error) as caught:
        fmt.load(tmp_path, "\ufeff" + fmt.good)
    assert isinstance(caught.value, PipelineError)
    assert fmt.file in caught.value.message
    assert "starts with a byte-order mark" in caught.value.message
    assert caught.value.fix.startswith("save it as UTF-8 without BOM")


@pytest.mark.parametrize("lane", ["-rf", "a lane", ".hidden", "../up"])
def test_a_lane_name_that_is_no_valid_name_is_refused(tmp_path: Path, lane: str) -> None:
    # It was accepted, and offered in the "use one of" list of an unknown lane.
    with pytest.raises(LaneFileError) as caught:
        load_lanes(tmp_path, LANES + f'\n[lanes."{lane}"]\npath = "dist/lanes/x"\n')
    assert f"{lane!r} is not a valid lane name" in caught.value.message
    assert "lanes.toml" in caught.value.message
