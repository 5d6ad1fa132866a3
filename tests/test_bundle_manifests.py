"""Bundle manifests: the real ones load, and every kind of bad manifest gets one clear error."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.gitrepos import REPO_ROOT
from xla_wheels.bundle import available_bundles, diff, load_bundle
from xla_wheels.errors import ManifestError, UsageError

VALID = """\
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
patches = ["torch_xla/0001-fix.patch"]

[components.openxla]
remote = "https://github.com/openxla/xla.git"
unpinned = "nobody knows yet"

[runtime.libtpu]
minimum = "0.0.24"
preferred = "0.0.36"
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "build" / "bundles").mkdir(parents=True)
    (tmp_path / "patches" / "torch_xla").mkdir(parents=True)
    (tmp_path / "patches" / "torch_xla" / "0001-fix.patch").write_text("diff --git a/x b/x\n")
    (tmp_path / "build" / "bundles" / "demo.toml").write_text(VALID)
    return tmp_path


def write(project: Path, text: str) -> None:
    (project / "build" / "bundles" / "demo.toml").write_text(text)


def error_for(project: Path, text: str) -> str:
    write(project, text)
    with pytest.raises(ManifestError) as caught:
        load_bundle(project, "demo")
    return str(caught.value)


def test_the_shipped_bundles_load_with_the_receipts_pins() -> None:
    assert available_bundles(REPO_ROOT) == ["v6e-2.11", "v6e-2.9"]
    v29 = load_bundle(REPO_ROOT, "v6e-2.9")
    assert v29.component("torch").commit == "21fec65781bebe867faf209f89bb687ffd236ca4"
    assert v29.component("torch_xla").commit == "c04e61c3424142c0eebcc9e59984b9d8fced18c0"
    assert v29.component("openxla").commit == "a76a9a858"
    assert v29.python == "3.13"
    assert v29.runtime["libtpu"].specifier == ">=0.0.24"
    assert v29.runtime["libtpu"].install_version == "0.0.36"
    assert [p.relpath for p in v29.component("torch_xla").patches] == [
        "torch_xla/0001-load-serialized-executables.patch",
        "torch_xla/0002-runtime-memory-info-binding.patch",
        "torch_xla/0003-cache-key-covers-compile-options.patch",
        "torch_xla/0004-persistent-cache-atomic-write.patch",
    ]
    v211 = load_bundle(REPO_ROOT, "v6e-2.11")
    assert v211.component("torch_xla").patches == v29.component("torch_xla").patches
    assert v211.component("openxla").commit is None
    assert v211.unresolved_pins() and "openxla" in v211.unresolved_pins()[0]
    assert v211.runtime["libtpu"].specifier == "==0.0.37"


def test_a_valid_manifest_loads_with_short_and_unpinned_commits(project: Path) -> None:
    bundle = load_bundle(project, "demo")
    assert not bundle.component("torch_xla").is_full_sha
    assert bundle.component("torch").is_full_sha
    assert bundle.component("torch").submodules  # torch needs its submodules by default
    assert len(bundle.manifest_sha256) == 64


def test_unknown_bundle_name_lists_the_valid_names(project: Path) -> None:
    with pytest.raises(UsageError) as caught:
        load_bundle(project, "v6e-9.9")
    assert "unknown bundle 'v6e-9.9'" in str(caught.value)
    assert "demo" in str(caught.value)


def test_unknown_key_is_named_with_its_table(project: Path) -> None:
    message = error_for(
        project, VALID.replace('version = "2.9.0"\n', 'version = "2.9.0"\npatchs = []\n')
    )
    assert "demo.toml" in message
    assert "'components.torch_xla.patchs': unknown key" in message
    assert "patches" in message  # the fix lists the valid keys


def test_missing_key_is_named(project: Path) -> None:
    message = error_for(project, VALID.replace('python = "3.13"\n', ""))
    assert "'bundle.python': missing" in message


def test_missing_component_is_named(project: Path) -> None:
    text = (
        VALID.split("[components.openxla]")[0] + VALID.split('unpinned = "nobody knows yet"\n')[1]
    )
    message = error_for(project, text)
    assert "'components.openxla': missing component" in message


def test_commit_that_is_not_hex_is_refused(project: Path) -> None:
    message = error_for(project, VALID.replace('commit = "c04e61c"', 'commit = "c04e61z"'))
    assert "'components.torch_xla.commit': 'c04e61z' is not a git commit SHA" in message


def test_commit_too_short_to_be_safe_is_refused(project: Path) -> None:
    message = error_for(project, VALID.replace('commit = "c04e61c"', 'commit = "c04e"'))
    assert "is not a git commit SHA" in message


def test_missing_patch_file_is_named(project: Path) -> None:
    message = error_for(project, VALID.replace("0001-fix.patch", "0002-gone.patch"))
    assert "patches/torch_xla/0002-gone.patch does not exist" in message


def test_same_patch_twice_is_refused(project: Path) -> None:
    message = error_for(
        project,
        VALID.replace(
            '["torch_xla/0001-fix.patch"]',
            '["torch_xla/0001-fix.patch", "torch_xla/0001-fix.patch"]',
        ),
    )
    assert "listed twice" in message


def test_same_patch_in_two_components_is_refused(project: Path) -> None:
    text = VALID.replace(
        'version = "2.9.0a0"\n', 'version = "2.9.0a0"\npatches = ["torch_xla/0001-fix.patch"]\n'
    )
    assert "listed twice" in error_for(project, text)


def test_name_must_match_the_file(project: Path) -> None:
    message = error_for(project, VALID.replace('name = "demo"', 'name = "other"'))
    assert "is 'other' but the file is demo.toml" in message


def test_commit_and_unpinned_together_are_refused(project: Path) -> None:
    text = VALID.replace('unpinned = "nobody knows yet"', 'unpinned = "x"\ncommit = "abcdef0"')
    assert "given together with 'commit'" in error_for(project, text)


def test_neither_commit_nor_unpinned_is_refused(project: Path) -> None:
    message = error_for(project, VALID.replace('unpinned = "nobody knows yet"\n', ""))
    assert "'components.openxla.commit': missing" in message


def test_wrong_type_is_named(project: Path) -> None:
    message = error_for(project, VALID.replace('python = "3.13"', "python = 3.13"))
    assert "'bundle.python': expected str" in message


def test_invalid_toml_names_the_file(project: Path) -> None:
    message = error_for(project, VALID + "this is not toml\n")
    assert "demo.toml: not valid TOML" in message


def test_diff_names_every_pin_that_differs() -> None:
    rows = {
        field: (a, b)
        for field, a, b in diff(
            load_bundle(REPO_ROOT, "v6e-2.9"), load_bundle(REPO_ROOT, "v6e-2.11")
        )
    }
    assert rows["torch.commit"] == ("21fec65781bebe867faf209f89bb687ffd236ca4", "7afdbae")
    assert rows["openxla.commit"] == ("a76a9a858", "unpinned")
    assert rows["runtime.libtpu"] == (">=0.0.24 (preferred 0.0.36)", "==0.0.37")
    assert "torch_xla.commit" not in rows
