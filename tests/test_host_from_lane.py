"""A training host that has never seen the repository: everything comes from the lane.

Real parts only: the host wheel built from ``host/`` as ``make host-wheel`` builds it (pip,
setuptools pinned in host/pyproject.toml), a static lane written by ``publish-lane`` (the
bundle's wheels, the host wheel, the bundle document and its index page) and its
requirements file (``lane-requirements``), a fresh venv standing for the host's torch
environment that installs the lane's requirements by hash, and the host's own command
line run there with ``-I`` (no checkout, no PYTHONPATH, no current directory on the path)
and a HOME of its own. The wheels are the publish tests' small stand-ins
(tests/publish_support.py), so no torch_xla child starts here.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.clirunner import run_cli
from tests.network_faults_support import silent_server
from tests.publish_support import (
    BUNDLE,
    XLA_VERSION,
    FakeWheels,
    cached_stock_wheel,
    host_venv,
    make_publish_project,
    start_pypiserver,
)
from tests.servers import start_directory_server, stop
from xla_host import bundle_document as doc
from xla_host import receipts
from xla_host.cache_contract import directory_name
from xla_host.errors import ExitCode
from xla_host.filemode import file_sha256

REPO_ROOT = Path(__file__).resolve().parents[1]
HOST_SRC = REPO_ROOT / "host" / "src"


@dataclass(frozen=True)
class Host:
    python: Path
    home: Path
    lane: Path
    publish_output: str

    def run(
        self, *args: str, script: bool = False, home: Path | None = None,
        runtime: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:  # fmt: skip
        """The host's command line, as a host runs it: nothing of the checkout anywhere, in
        the launch environment the runtime contract asks for (``runtime``: another)."""
        home = home or self.home
        command = (
            [str(self.python.parent / "xla-host"), *args]
            if script
            else [str(self.python), "-I", "-m", "xla_host", *args]
        )
        launch = contract_environment(home) if runtime is None else runtime
        env = {"PATH": "/usr/bin:/bin", "HOME": str(home), **launch}
        return subprocess.run(
            command, cwd=home, env=env, capture_output=True, text=True, timeout=300,
            check=False,
        )  # fmt: skip


#: The stand-in torch_xla's cache directory, as the cache contract names it (no libtpu).
CACHE_DIRECTORY = directory_name(BUNDLE, XLA_VERSION, None)


def contract_environment(home: Path) -> dict[str, str]:
    """The runtime contract's launch environment for the stand-in bundle (a TPU bundle:
    doctor reads no torch_xla, so PJRT_DEVICE=TPU is judged, never used, on this CPU host),
    its cache directory made under ``home``."""
    cache = home / "xla-cache" / CACHE_DIRECTORY
    cache.mkdir(parents=True, exist_ok=True)
    return {
        "PJRT_DEVICE": "TPU",
        "XLA_NO_SPECIAL_SCALARS": "1",
        "XLA_PERSISTENT_CACHE_PATH": str(cache),
    }


def _publish_lane(tmp_path: Path, wheels: FakeWheels, host_wheel: Path) -> tuple[Path, str]:
    project = make_publish_project(tmp_path, [wheels.torch, wheels.torch_xla])
    (project / "dist" / "host").mkdir(parents=True)
    shutil.copyfile(host_wheel, project / "dist" / "host" / host_wheel.name)
    (project / "build" / "lanes.toml").write_text(
        'publish-lane = "validation"\n\n[lanes.validation]\npath = "dist/lanes/validation"\n'
    )
    published = run_cli("publish-lane", "--bundle", BUNDLE, root=project, inherit_env=True)
    assert published.exit_code == 0, published.output
    made = run_cli("lane-requirements", root=project, inherit_env=True)
    assert made.exit_code == 0, made.output
    return project / "dist" / "lanes" / "validation", published.stdout


@pytest.fixture
def host(tmp_path: Path, fake_wheels: FakeWheels, host_wheel: Path) -> Host:
    lane, output = _publish_lane(tmp_path, fake_wheels, host_wheel)
    venv = tmp_path / "host-env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    # The runbook: the lane's requirements, every file by hash, from the lane's index.
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
         "--disable-pip-version-check", "--no-cache-dir", "--no-deps", "--require-hashes",
         "--index-url", (lane / "simple").as_uri() + "/", "-r", str(lane / "requirements.txt")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    home = tmp_path / "home"
    home.mkdir()
    return Host(python, home, lane, output)


@pytest.mark.slow
def test_a_host_installs_from_the_lane_by_hash_and_runs_doctor_without_a_checkout(
    host: Host, host_wheel: Path
) -> None:
    requirements = (host.lane / "requirements.txt").read_text()
    # The working tree's version (host/VERSION; make host-wheel writes the commit's).
    pin = f"xla-wheels-host==0.1.0.dev0 \\\n    --hash=sha256:{file_sha256(host_wheel)}"
    assert pin in requirements
    # Nothing of the builder is on the host, and the checkout is on no path of it.
    probe = subprocess.run(
        [str(host.python), "-I", "-c", "import xla_host, xla_wheels"],
        capture_output=True, text=True, cwd=host.home, env={"HOME": str(host.home)}, check=False,
    )  # fmt: skip
    assert probe.returncode != 0 and "No module named 'xla_wheels'" in probe.stderr
    digest = doc.sha256_of((host.lane / "bundles" / f"{BUNDLE}.json").read_bytes())
    assert f"sha256:{digest}" in host.publish_output
    # `make lanes` shows the digest hosts pass as --bundle-sha256.
    shown = run_cli("lanes", root=host.lane.parents[2], inherit_env=True)
    assert f"bundle document: {host.lane}/bundles/{BUNDLE}.json sha256:{digest}" in shown.stdout
    # The host wheel in the lane is no drift of the lane (lanes.lock records bundles).
    status = run_cli("status", root=host.lane.parents[2], inherit_env=True)
    assert "extra" not in status.stdout and host_wheel.name not in status.stdout, status.output

    doctor = host.run("doctor", "--lane", str(host.lane), "--bundle", BUNDLE)
    assert f"document sha256:{digest}" in doctor.stdout, doctor.stdout + doctor.stderr
    for line in (
        "ok   torch-xla",
        "ok   torch ",
        "ok   files torch-xla",
        "ok   files torch ",
        "ok   PJRT_DEVICE",
        "ok   XLA_NO_SPECIAL_SCALARS",
        "ok   cache path build",
    ):
        assert line in doctor.stdout, doctor.stdout
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    # The cache contract, from the document's bundle and the installed build alone.
    assert f"xla_cache_{BUNDLE}_txla2.9.0+gitc04e61c names this build" in doctor.stdout
    # The same lane behind a web server on loopback: the document and its index page over
    # HTTP, the wheel files the comparison needs fetched by hash into a cache of the host.
    server, lane_url = start_directory_server(host.lane, host.home.parent / "http.log")
    try:
        fresh = host.home.parent / "fresh-home"
        fresh.mkdir()
        over_http = host.run(
            "doctor", "--lane", f"{lane_url}simple/", "--bundle", BUNDLE,
            home=fresh,
        )  # fmt: skip
    finally:
        stop(server)
    assert over_http.returncode == 0, over_http.stdout + over_http.stderr
    assert "ok   files torch-xla" in over_http.stdout
    fetched = sorted(p.name for p in (fresh / ".cache" / "xla-wheels" / "lane-wheels").iterdir())
    assert fetched == sorted(p.name for p in host.lane.glob("torch*.whl"))
    # The host's command is `xla-host`; a builder command is refused, naming the builder's
    # command line, instead of a traceback. The host wheel installs no `xla-wheels`.
    script = host.run("gate", "--help", script=True)
    assert script.returncode == 0 and "--bundle-sha256" in script.stdout, script.stderr
    refused = host.run("wheels", "--bundle", BUNDLE, script=True)
    assert refused.returncode == ExitCode.BAD_INPUT
    assert "a builder command runs as `xla-wheels wheels`" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
    assert not (host.python.parent / "xla-wheels").exists()


def _unwritable_directory(tmp_path: Path) -> Path:
    """A directory this user cannot create a file in: read-only by its mode, or for root
    (whom no mode stops) a directory of sysfs."""
    if os.geteuid() == 0:
        return Path("/sys/kernel")
    directory = tmp_path / "read-only-cache"
    directory.mkdir()
    directory.chmod(0o555)
    return directory


@pytest.mark.slow
def test_the_host_doctor_judges_the_runtime_contract_and_writes_the_audit_stamp(
    host: Host, tmp_path: Path
) -> None:
    args = ("doctor", "--lane", str(host.lane), "--bundle", BUNDLE)
    # Nothing set: the checks the builder's doctor makes, made here from the document.
    bare = host.run(*args, runtime={})
    assert bare.returncode == ExitCode.FAILED, bare.stdout + bare.stderr
    for line in (
        "FAIL PJRT_DEVICE",
        "FAIL XLA_NO_SPECIAL_SCALARS",
        "FAIL XLA_PERSISTENT_CACHE_PATH",
    ):
        assert line in bare.stdout, bare.stdout
    assert "fix: export PJRT_DEVICE=TPU" in bare.stdout
    assert "PJRT_DEVICE" in bare.stderr and "XLA_PERSISTENT_CACHE_PATH" in bare.stderr
    # The wrong platform for the bundle, and a cache path this host cannot write.
    unwritable = _unwritable_directory(tmp_path)
    wrong = host.run(*args, runtime={
        **contract_environment(host.home), "PJRT_DEVICE": "GPU",
        "XLA_PERSISTENT_CACHE_PATH": str(unwritable),
    })  # fmt: skip
    assert wrong.returncode == ExitCode.FAILED, wrong.stdout + wrong.stderr
    assert "FAIL PJRT_DEVICE" in wrong.stdout and "GPU, the bundle runs on TPU" in wrong.stdout
    assert f"{unwritable} not writable" in wrong.stdout, wrong.stdout
    # The audit stamp, on a host with no checkout: the format xla_host.stamp owns.
    stamp_file = tmp_path / "stamps" / "doctor.json"
    stamped = host.run(*args, "--json", "--stamp", str(stamp_file))
    assert stamped.returncode == 0, stamped.stdout + stamped.stderr
    from xla_host.stamp import read_stamp

    written = read_stamp(stamp_file)
    assert json.loads(stamped.stdout) == written.as_json()  # stdout: the one document
    assert "ok   PJRT_DEVICE" in stamped.stderr  # the findings: on stderr
    assert written.bundle == BUNDLE and written.lane == "validation"
    # No flag, no variable: the one role rule says writer (xla_host.cache_role).
    assert written.verdict == "ok" and written.role == "writer"
    assert {w.name for w in written.wheels} == {p.name for p in host.lane.glob("torch*.whl")}
    assert all(w.matched for w in written.wheels)
    assert written.cache_path and written.cache_path.endswith(CACHE_DIRECTORY)
    failed_stamp = host.run(*args, "--stamp", str(stamp_file), runtime={})
    assert failed_stamp.returncode == ExitCode.FAILED
    assert read_stamp(stamp_file).verdict == "failed"


@pytest.mark.slow
def test_stock_2_7_with_nothing_set_fails_doctor_the_same_on_a_host_and_in_the_project(
    stock_xla_python_27: Path, host_wheel: Path, tmp_path: Path
) -> None:
    # A fresh host venv: stock torch 2.7.0 + torch_xla 2.7.0 (the machine's cached stock
    # environment, on its path through a .pth file) and the host wheel, nothing else.
    stock_site = next((stock_xla_python_27.parent.parent / "lib").glob("python3*/site-packages"))
    venv = tmp_path / "fresh-host"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "stock-torch-xla.pth").write_text(f"{stock_site}\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
         "--disable-pip-version-check", "--no-deps", "--no-index", str(host_wheel)],
        check=True, timeout=300,
    )  # fmt: skip
    # A lane directory holding the stock torch_xla wheel and the document naming it.
    wheel = cached_stock_wheel("2.7.0", "3.11")
    lane = tmp_path / "lane"
    (lane / doc.DIRNAME).mkdir(parents=True)
    shutil.copyfile(wheel, lane / wheel.name)
    document = doc.BundleDocument(
        "stock-2.7", "validation", "3.11",
        (doc.LockedFile(wheel.name, doc.sha256_of(wheel.read_bytes()), wheel.stat().st_size),),
    )  # fmt: skip
    raw = doc.dumps(document)
    doc.lane_path(lane, "stock-2.7").write_bytes(raw)
    index = doc.index_page({"stock-2.7": doc.sha256_of(raw)})
    (lane / doc.DIRNAME / doc.INDEX_PAGE).write_text(index)
    home = tmp_path / "home"
    home.mkdir()
    nothing_set = {"PATH": "/usr/bin:/bin", "HOME": str(home)}
    args = ("doctor", "--lane", str(lane), "--bundle", "stock-2.7", "--python", str(python))
    on_host = subprocess.run(
        [str(venv / "bin" / "xla-host"), *args], cwd=home, env=nothing_set,
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert on_host.returncode == ExitCode.FAILED, on_host.stdout + on_host.stderr
    for line in (
        "FAIL PJRT_DEVICE",
        "FAIL XLA_PERSISTENT_CACHE_PATH",
        "ok   torch-xla",
        "ok   files torch-xla",
    ):
        assert line in on_host.stdout, on_host.stdout
    assert "PJRT_DEVICE" in on_host.stderr and "XLA_PERSISTENT_CACHE_PATH" in on_host.stderr
    # The same command in the project's venv (the builder installed too): the host's
    # doctor, the same findings, no parser of another meaning.
    in_project = subprocess.run(
        [str(Path(sys.executable).parent / "xla-host"), *args], cwd=home, env=nothing_set,
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert in_project.returncode == ExitCode.FAILED, in_project.stdout + in_project.stderr
    assert in_project.stdout == on_host.stdout


@pytest.mark.slow
def test_a_tampered_document_or_an_edited_install_is_refused(host: Host) -> None:
    document = host.lane / "bundles" / f"{BUNDLE}.json"
    original = document.read_bytes()
    data = json.loads(original)
    data["wheels"][0]["sha256"] = "0" * 64  # a host judged against other wheels
    document.write_bytes(doc.dumps(doc.loads(json.dumps(data).encode(), "edited")))
    tampered = host.run("doctor", "--lane", str(host.lane), "--bundle", BUNDLE)
    assert tampered.returncode == ExitCode.BAD_INPUT, tampered.stdout + tampered.stderr
    assert "not the document that was published" in tampered.stderr
    # With the digest from elsewhere (lanes.lock, the publish output) the index is not
    # trusted alone: a rewritten index page does not make the edited document pass.
    listed = {BUNDLE: doc.sha256_of(document.read_bytes())}
    (host.lane / "bundles" / "index.html").write_text(doc.index_page(listed))
    given = host.run(
        "doctor", "--lane", str(host.lane), "--bundle", BUNDLE,
        "--bundle-sha256", doc.sha256_of(original),
    )  # fmt: skip
    assert given.returncode == ExitCode.BAD_INPUT and "--bundle-sha256 says" in given.stderr
    document.write_bytes(original)
    (host.lane / "bundles" / "index.html").write_text(
        doc.index_page({BUNDLE: doc.sha256_of(original)})
    )
    # An installed file edited after the install: the content comparison names it.
    site = next((host.python.parent.parent / "lib").glob("python3*/site-packages"))
    (site / "torch_xla" / "__init__.py").write_text("# edited\n")
    edited = host.run("doctor", "--lane", str(host.lane), "--bundle", BUNDLE)
    assert edited.returncode == ExitCode.FAILED, edited.stdout + edited.stderr
    assert "FAIL files torch-xla" in edited.stdout
    assert "installed torch_xla/__init__.py differs from the wheel's" in edited.stdout


def test_a_malformed_or_unknown_document_is_named_by_its_field(tmp_path: Path) -> None:
    good = doc.BundleDocument(
        bundle="b1",
        lane="validation",
        python="3.11",
        wheels=(doc.LockedFile("torch_xla-2.9.0-cp311-cp311-linux_x86_64.whl", "a" * 64, 10),),
    )
    raw = doc.dumps(good)
    assert doc.loads(raw, "doc.json") == good and doc.dumps(doc.loads(raw, "x")) == raw
    cases = {
        "format": ({"format": "2"}, "key 'format': '2' is not a format"),
        "wheels": ({"wheels": []}, "key 'wheels': no wheels"),
        "sha256": (
            {"wheels": [{"name": good.wheels[0].name, "sha256": "xyz", "size": 1}]},
            "key 'wheels[0].sha256'",
        ),
        "unknown key": ({"extra": 1}, "key 'extra': unknown key"),
        "missing": ({"python": None}, "key 'python': missing"),
    }
    for name, (change, message) in cases.items():
        data = {**json.loads(raw), **change}
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(data))
        result = subprocess.run(
            [sys.executable, "-m", "xla_host", "doctor", "--bundle-document", str(path),
             "--bundle-sha256", doc.sha256_of(path.read_bytes())],
            capture_output=True, text=True, timeout=120, check=False,
            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(HOST_SRC)},
        )  # fmt: skip
        assert result.returncode == ExitCode.BAD_INPUT, (name, result.stderr)
        assert message in result.stderr and str(path) in result.stderr, (name, result.stderr)
        assert "Traceback" not in result.stderr
    # A document given as a file is vouched for by its digest only: without one, refused.
    unvouched = subprocess.run(
        [sys.executable, "-m", "xla_host", "doctor", "--bundle-document", str(path)],
        capture_output=True, text=True, timeout=120, check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(HOST_SRC)},
    )  # fmt: skip
    assert unvouched.returncode == ExitCode.BAD_INPUT
    assert "needs its sha256" in unvouched.stderr


def test_a_lane_index_without_the_document_or_its_digest_is_refused(tmp_path: Path) -> None:
    lane = tmp_path / "lane"
    (lane / "bundles").mkdir(parents=True)
    (lane / "bundles" / "b1.json").write_bytes(
        doc.dumps(
            doc.BundleDocument(
                "b1", "validation", "3.11",
                (doc.LockedFile("torch-2.9.0-cp311-cp311-linux_x86_64.whl", "b" * 64, 1),),
            )
        )
    )  # fmt: skip
    with pytest.raises(doc.DocumentError, match="lists no sha256 for b1.json"):
        doc.fetch(str(lane), "b1")
    document, digest = doc.fetch(
        str(lane), "b1", sha256=doc.sha256_of((lane / "bundles" / "b1.json").read_bytes())
    )
    assert document.bundle == "b1" and len(digest) == 64
    with pytest.raises(doc.DocumentError, match="does not exist"):
        doc.fetch(str(lane), "b2", sha256="c" * 64)


@pytest.mark.slow
# The host's gate leaving a receipt made under the document (its digest, the document's
# wheels matched byte for byte) is asserted on the end-to-end run of
# tests/test_team_loop.py: two hosts gating from the lane, one torch_xla run for both.


def test_promotion_takes_a_host_receipt_only_under_a_document_the_checkout_publishes() -> None:
    from xla_host.installed import WheelMatch
    from xla_wheels.release.lanes import Policy
    from xla_wheels.release.policy import judge_receipt

    name, sha = "torch_xla-2.7.0-cp311-cp311-linux_x86_64.whl", "d" * 64
    receipt = receipts.Receipt(
        kind="gate", bundle="b1", created="2026-01-01T00:00:00Z", host="tpu-0", device="CPU",
        chip=None, workload="small", versions={}, wheels_match_lock=True,
        wheels=(WheelMatch(name, sha, "torch-xla", "2.7.0", True, 3),), problems=(),
        checks=(receipts.CheckEvidence("restart", True, (), {}),),
        bundle_document="sha256:" + "1" * 64,
    )  # fmt: skip
    stored = receipts.StoredReceipt(Path("r.json"), receipt, "sha256:x", True)

    def rules(documents: frozenset[str] | None) -> list[str]:
        verdict = judge_receipt(
            stored, "b1", {(name, sha)}, Policy(checks=("restart",)), None, None, documents
        )
        return [f.rule for f in verdict.failures]

    assert rules(frozenset({"sha256:" + "1" * 64, "sha256:" + "2" * 64})) == []
    assert rules(frozenset({"sha256:" + "2" * 64})) == ["document"]
    # A receipt made in a checkout (no document) is judged as before.
    checkout_made = receipts.StoredReceipt(
        Path("r.json"), dataclasses.replace(receipt, bundle_document=None), "sha256:x", True
    )
    verdict = judge_receipt(
        checkout_made, "b1", {(name, sha)}, Policy(checks=("restart",)), None, None,
        frozenset({"sha256:" + "2" * 64}),
    )  # fmt: skip
    assert verdict.passed


@pytest.mark.slow  # waits out its two-second timeout on purpose
def test_a_lane_that_does_not_answer_ends_the_command_within_its_timeout(tmp_path: Path) -> None:
    # The one network client's policy, from the settings rows: XLA_WHEELS_NET_TIMEOUT and
    # XLA_WHEELS_NET_RETRIES are honoured on a host as in the builder.
    with silent_server() as server:
        result = subprocess.run(
            [sys.executable, "-m", "xla_host", "doctor", "--lane", f"{server.base}/lane/",
             "--bundle", "b1"],
            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(HOST_SRC),
                 "XLA_WHEELS_NET_TIMEOUT": "2", "XLA_WHEELS_NET_RETRIES": "0"},
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        connections = server.connections()
    assert result.returncode == ExitCode.TIMED_OUT, result.stderr
    assert (
        f"GET {server.base}/lane/bundles/index.html: 127.0.0.1:{server.base.rsplit(':', 1)[1]} "
        "did not answer within 2s (1 attempt)" in result.stderr
    ), result.stderr
    # The bound is the timeout, once: the wait it names, one attempt, one connection.
    assert "Traceback" not in result.stderr and connections == 1, connections


def test_the_hosts_network_flags_are_the_settings_rows(tmp_path: Path) -> None:
    from xla_host.settings import by_flag

    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(HOST_SRC)}

    def doctor(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        # A document file that does not exist: a run past the flags ends there, at once.
        return subprocess.run(
            [sys.executable, "-m", "xla_host", "doctor", "--bundle-document",
             str(tmp_path / "none.json"), "--bundle-sha256", "0" * 64, *args],
            env={**env, **extra}, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip

    # The builder's range (up to a day), not one of the host's own.
    high = by_flag("--net-timeout").high
    assert high is not None and high >= 7200
    past_the_flags = doctor("--net-timeout", "7200", "--net-retries", "0")
    assert past_the_flags.returncode == ExitCode.BAD_INPUT
    assert "none.json does not exist" in past_the_flags.stderr, past_the_flags.stderr
    too_long = doctor("--net-timeout", f"{high + 1:g}")
    assert too_long.returncode == ExitCode.BAD_INPUT and "--net-timeout" in too_long.stderr
    bad_variable = doctor(XLA_WHEELS_NET_TIMEOUT="soon")
    assert bad_variable.returncode == ExitCode.BAD_INPUT
    assert "XLA_WHEELS_NET_TIMEOUT='soon'" in bad_variable.stderr, bad_variable.stderr
    assert "fix: set XLA_WHEELS_NET_TIMEOUT to e.g. 60" in bad_variable.stderr
    shown = subprocess.run(
        [sys.executable, "-m", "xla_host", "gate", "--help"], env=env, capture_output=True,
        text=True, timeout=120, check=False,
    ).stdout  # fmt: skip
    assert "$XLA_WHEELS_NET_TIMEOUT" in shown and "--net-retries" in shown


@pytest.mark.slow
def test_the_host_writes_the_launch_environment_the_builder_writes(
    tmp_path: Path,
    fake_wheels: FakeWheels,
) -> None:
    from xla_wheels.release import host_document
    from xla_wheels.release.lanes import load_config
    from xla_wheels.wheels_lock import read_lock

    project = make_publish_project(tmp_path, [fake_wheels.torch, fake_wheels.torch_xla])
    manifest = project / "build" / "bundles" / f"{BUNDLE}.toml"
    manifest.write_text(
        manifest.read_text() + '\n[profiles.train.device]\nPJRT_DEVICE = "TPU"\n'
        '[profiles.train.cache]\nXLA_PERSISTENT_CACHE_PATH = "/mnt/xla-cache/{build}"\n'
        '[profiles.train.compiler]\nXLA_FLAGS = "--xla_cpu_use_thunk_runtime=false"\n'
    )
    (project / "build" / "lanes.toml").write_text(
        'publish-lane = "validation"\n\n[lanes.validation]\npath = "dist/lanes/validation"\n'
    )
    (project / "scripts").mkdir()  # the builder copies its helper beside the files
    helper = Path("scripts") / "xla_launch_profile.py"
    shutil.copyfile(REPO_ROOT / helper, project / helper)
    lane = load_config(project).lane("validation")
    document = host_document.compose(project, read_lock(project / "wheels.lock"), BUNDLE, lane)
    path = tmp_path / "document.json"
    path.write_bytes(doc.dumps(document))
    for role in ("writer", "reader"):
        builder = run_cli(
            "launch-env", "--bundle", BUNDLE, "--profile", "train", "--role", role,
            "--out", str(tmp_path / "builder" / role), root=project,
        )  # fmt: skip
        assert builder.exit_code == 0, builder.output
        host = subprocess.run(
            [sys.executable, "-m", "xla_host", "launch-env", "--bundle-document", str(path),
             "--bundle-sha256", doc.sha256_of(path.read_bytes()), "--profile", "train",
             "--role", role, "--out", str(tmp_path / "host" / role)],
            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(HOST_SRC)},
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert host.returncode == 0, host.stderr
        for name in ("env.sh", "env.json"):
            built = (tmp_path / "builder" / role / name).read_text()
            assert (tmp_path / "host" / role / name).read_text() == built, name
        assert f"xla_cache_{BUNDLE}_txla2.9.0+gitc04e61c" in built
        # The pre-import helper too, on both: the host package's one copy, which the
        # checkout's scripts/ links to.
        helper_copy = (HOST_SRC / "xla_host" / "xla_launch_profile.py").read_bytes()
        for side in ("builder", "host"):
            written = tmp_path / side / role / "xla_launch_profile.py"
            assert written.read_bytes() == helper_copy, side
        assert "xla_launch_profile.apply(" in host.stdout, host.stdout


@pytest.mark.slow
def test_a_lane_on_a_package_index_serves_the_host_wheel_and_the_document_by_hash(
    tmp_path: Path,
    fake_wheels: FakeWheels,
    host_wheel: Path,
) -> None:
    process, index = start_pypiserver(tmp_path / "index", "update")  # reads need no account
    try:
        project = make_publish_project(tmp_path, [fake_wheels.torch, fake_wheels.torch_xla])
        (project / "dist" / "host").mkdir(parents=True)
        shutil.copyfile(host_wheel, project / "dist" / "host" / host_wheel.name)
        (project / "build" / "lanes.toml").write_text(
            f'publish-lane = "validation"\n\n[lanes.validation]\nindex-url = "{index.url}"\n'
        )
        published = run_cli(
            "publish-lane", "--bundle", BUNDLE, root=project, inherit_env=True,
            env=index.credentials,
        )  # fmt: skip
        assert published.exit_code == 0, published.output
        assert (index.packages / host_wheel.name).is_file()  # uploaded as the wheels are
        document = project / "dist" / "lanes" / "validation" / "bundles" / f"{BUNDLE}.json"
        digest = doc.sha256_of(document.read_bytes())
        assert f"sha256:{digest}" in published.stdout
        # The document pins the host wheel the lane serves, by hash.
        pinned_host = doc.loads(document.read_bytes(), str(document)).host_wheel
        size = host_wheel.stat().st_size
        assert pinned_host == doc.LockedFile(host_wheel.name, file_sha256(host_wheel), size)
        # The document went into the index as the document wheel of the bundle.
        (packed,) = index.packages.glob("xla_wheels_document_*.whl")
        assert packed.name.endswith(f"-1+sha256.{digest[:16]}-py3-none-any.whl")
        python = host_venv(tmp_path, [fake_wheels.torch, fake_wheels.torch_xla])
        env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home"), "PYTHONPATH": str(HOST_SRC),
               **contract_environment(tmp_path / "home")}  # fmt: skip

        def doctor(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "xla_host", "doctor", "--python", str(python),
                 "--lane", index.url, *args],
                env=env, capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip

        # No file handed to the host: the document and the wheels come from the index, by
        # the index's hashes; with the operator's digest, by that too.
        asked = doctor("--bundle", BUNDLE)
        assert asked.returncode == 0, asked.stdout + asked.stderr
        assert "ok   files torch-xla" in asked.stdout
        pinned = doctor("--bundle", BUNDLE, "--bundle-sha256", digest)
        assert pinned.returncode == 0, pinned.stdout + pinned.stderr
        unknown = doctor("--bundle", BUNDLE, "--bundle-sha256", "0" * 64)
        assert unknown.returncode == ExitCode.BAD_INPUT, unknown.stdout + unknown.stderr
        assert f"no document wheel of bundle {BUNDLE} with sha256 {'0' * 64}" in unknown.stderr
        # Another document swapped in under the published name is refused (by the index's
        # hash of the file, or by the digest in its name).
        other = dataclasses.replace(doc.loads(document.read_bytes(), "d"), lane="elsewhere")
        packed.write_bytes(doc.document_wheel(doc.dumps(other), 1)[1])
        swapped = doctor("--bundle", BUNDLE)
        assert swapped.returncode == ExitCode.BAD_INPUT, swapped.stdout + swapped.stderr
        assert "that was published" in swapped.stderr
    finally:
        stop(process)


def test_xla_host_is_the_hosts_command_and_xla_wheels_the_builders_where_both_are_installed() -> (
    None
):
    # The project's venv has both distributions: each script keeps its one meaning, so the
    # runbook's host command works here as on a host (`--bundle-sha256` is the host's).
    scripts = Path(sys.executable).parent
    if not (scripts / "xla-host").exists():
        pytest.skip("the project is not installed into this interpreter's environment")
    host = subprocess.run(
        [str(scripts / "xla-host"), "doctor", "--help"], capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert host.returncode == 0, host.stderr
    assert "usage: xla-host doctor" in host.stdout and "--bundle-sha256" in host.stdout
    module = subprocess.run(
        [sys.executable, "-m", "xla_host", "doctor", "--help"], capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert module.stdout == host.stdout
    builder = subprocess.run(
        [str(scripts / "xla-wheels"), "lock-check", "--help"], capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert builder.returncode == 0, builder.stderr
    assert "usage: xla-wheels lock-check" in builder.stdout
    refused = subprocess.run(
        [str(scripts / "xla-host"), "lock-check"], capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert refused.returncode == ExitCode.BAD_INPUT
    assert "fix: run `xla-wheels lock-check ...` in the project's checkout" in refused.stderr
    typo = subprocess.run(
        [str(scripts / "xla-host"), "doctr"], capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert typo.returncode == ExitCode.BAD_INPUT and "did you mean `xla-host doctor`?" in (
        typo.stderr
    )


def test_a_document_wheel_is_the_same_bytes_for_the_same_document_and_names_its_digest() -> None:
    wheel = doc.LockedFile("torch_xla-2.9.0+gabc-cp311-cp311-linux_x86_64.whl", "a" * 64, 1)
    raw = doc.dumps(doc.BundleDocument("v6e-2.9", "preferred", "3.11", (wheel,)))
    name, data = doc.document_wheel(raw, 3)
    label = doc.sha256_of(raw)[:16]
    assert name == f"xla_wheels_document_v6e_2_9-3+sha256.{label}-py3-none-any.whl"
    # Reproducible (a lane never refuses it for other bytes): fixed times, no compression
    # (zlib's output may differ between builds of it).
    assert doc.document_wheel(raw, 3) == (name, data)
    members = zipfile.ZipFile(io.BytesIO(data)).infolist()
    assert {(m.date_time, m.compress_type) for m in members} == {
        ((1980, 1, 1, 0, 0, 0), zipfile.ZIP_STORED)
    }
    assert doc.document_of_wheel(data, name, "here") == raw
    other = doc.dumps(doc.BundleDocument("v6e-2.9", "validation", "3.11", (wheel,)))
    with pytest.raises(doc.DocumentError) as swapped:
        doc.document_of_wheel(doc.document_wheel(other, 3)[1], name, "here")
    assert "not the document that was published" in swapped.value.message
