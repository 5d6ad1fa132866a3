"""`make demo`: the whole path on a demonstration upstream, as the README tells a newcomer,
and the TPU host's runbook (docs/on-a-tpu-host.md) against its lane.

Run through make itself (the command the README gives), once for the module's tests, with
HTTP(S) proxies pointing at a closed port, so any attempt to reach the network would fail
the run, and with HOME and TMPDIR in a directory that must stay empty: the demo writes
only under DEMO_DIR. The tests read what it left: the lane's files, the fresh venv of the
runbook's line (b), the stages' logs, lanes.lock, and run docs/operating.md's example of
``--root`` / ``XLA_WHEELS_ROOT`` on its project.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.gitrepos import REPO_ROOT
from xla_host.cache_pack import read_public_key
from xla_host.wheel_filename import parse_wheel_name
from xla_wheels.demo import MARKER, _summary, write_host_wheel
from xla_wheels.run_lock import LOCK_NAME, bundle_run_lock

DEAD_PROXY = "http://127.0.0.1:9"
DEMO_TIMEOUT_S = 600


def _make_demo(demo_dir: Path, outside: Path) -> subprocess.CompletedProcess[str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if key.lower() not in ("http_proxy", "https_proxy", "no_proxy", "all_proxy")
    }
    env.update(
        {
            "HOME": str(outside / "home"),
            "TMPDIR": str(outside / "tmp"),
            **{
                name: DEAD_PROXY
                for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")
            },
        }
    )
    return subprocess.run(
        ["make", "--no-print-directory", "demo", f"DEMO_DIR={demo_dir}"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=DEMO_TIMEOUT_S,
        check=False,
    )  # fmt: skip


@dataclass(frozen=True)
class DemoRun:
    """One ``make demo`` as the README gives it, shared by the tests that read what it did."""

    base: Path
    """Holds ``demo`` (DEMO_DIR) and ``outside`` (HOME and TMPDIR: must stay empty)."""
    result: subprocess.CompletedProcess[str]

    @property
    def directory(self) -> Path:
        return self.base / "demo"

    @property
    def project(self) -> Path:
        return self.directory / "project"

    @property
    def lane(self) -> Path:
        return self.project / "dist" / "lanes" / "validation"

    def log(self, name: str) -> str:
        (path,) = (self.directory / "logs").glob(f"*-{name}.log")
        return path.read_text()


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoRun:
    base = tmp_path_factory.mktemp("demo-run")
    outside = base / "outside"
    (outside / "home").mkdir(parents=True)
    (outside / "tmp").mkdir()
    run = DemoRun(base, _make_demo(base / "demo", outside))
    assert run.result.returncode == 0, run.result.stdout + run.result.stderr
    return run


def _stages(out: str) -> list[str]:
    """The demo's output, one piece per stage (its header line first)."""
    return ["== [" + piece for piece in out.split("\n== [")[1:]]


def _locked_sha(project: Path, bundle: str, project_name: str) -> str:
    lock = tomllib.loads((project / "wheels.lock").read_text())
    (sha,) = [w["sha256"] for w in lock["bundles"][bundle]["wheels"]
              if parse_wheel_name(w["name"]).project == project_name]  # fmt: skip
    return str(sha)


@pytest.mark.slow
def test_make_demo_runs_every_stage_offline_and_writes_only_under_demo_dir(
    demo: DemoRun, tmp_path: Path
) -> None:
    out = demo.result.stdout
    for stage in ("make wheels", "make host-wheel", "make publish", "make verify-install",
                  "make doctor", "runbook (b)", "xla-host doctor", "make rollback"):  # fmt: skip
        assert stage in out
    assert "NOT PyTorch" in out and "every stage passed" in out
    assert f"{demo.directory}/logs/" in out  # where to look
    # Each check once per stage (verify-install prints its checks twice; both doctors
    # check PJRT_DEVICE, each in its own stage).
    for stage in _stages(out):
        checks = [line for line in stage.splitlines() if line.strip().startswith(("ok ", "WARN "))]
        assert len(checks) == len(set(checks)), stage
    assert sum(line.strip().startswith("ok ") for line in out.splitlines()) > 10, out
    # The summary says where each step's output is.
    summary = out.split("every stage passed", 1)[1]
    for where in ("dist/host/", "dist/lanes/validation/", "report.json", "keys/", "host-venv/",
                  "logs/", "--root"):  # fmt: skip
        assert where in summary, summary

    project = demo.project
    lock = tomllib.loads((project / "wheels.lock").read_text())
    for bundle in ("demo", "demo-next"):
        wheels = {w["name"] for w in lock["bundles"][bundle]["wheels"]}
        assert {parse_wheel_name(w).project for w in wheels} == {"torch", "torch_xla"}
    report = json.loads((project / "out" / "demo" / "verify-install" / "report.json").read_text())
    assert report["passed"] is True, report
    # The demonstration package says what it is, in the installed code itself.
    venv = project / "out" / "demo" / "verify-install" / "venv"
    (init,) = venv.glob("lib/python*/site-packages/torch_xla/__init__.py")
    assert "NOT PyTorch/XLA" in init.read_text()

    assert sorted(p.name for p in demo.base.iterdir()) == ["demo", "outside"]
    outside = demo.base / "outside"
    assert list((outside / "home").iterdir()) == [] and list((outside / "tmp").iterdir()) == []

    # A directory that is not a demo's is refused.
    stranger = tmp_path / "not-a-demo"
    stranger.mkdir()
    (stranger / "keep.txt").write_text("mine\n")
    refused = _make_demo(stranger, outside)
    assert refused.returncode == 2, refused.stderr  # bad input, as make reports any failure
    assert "error: " in refused.stderr and "is not a previous demo's directory" in refused.stderr
    assert "fix: name an empty or new directory" in refused.stderr
    assert (stranger / "keep.txt").read_text() == "mine\n"


@pytest.mark.slow
def test_the_demo_lane_holds_the_host_wheel_the_documents_and_both_install_lists(
    demo: DemoRun,
) -> None:
    lane, project = demo.lane, demo.project
    (built,) = (project / "dist" / "host").glob("xla_wheels_host-*-py3-none-any.whl")
    served = lane / built.name
    assert served.read_bytes() == built.read_bytes()
    host_sha = hashlib.sha256(built.read_bytes()).hexdigest()
    # The documents, listed by sha256 on the index page a host checks them against.
    page = (lane / "bundles" / "index.html").read_text()
    for bundle in ("demo", "demo-next"):
        raw = (lane / "bundles" / f"{bundle}.json").read_bytes()
        assert f'href="{bundle}.json#sha256={hashlib.sha256(raw).hexdigest()}"' in page
        assert json.loads(raw)["host-wheel"]["sha256"] == host_sha
    # requirements.txt: the bundle the lane serves (demo, after the rollback), every wheel
    # of it and the host wheel by hash, nothing of demo-next.
    listed = (lane / "requirements.txt").read_text()
    assert listed.startswith("# Hash-pinned requirements of bundle demo ")
    pinned = set(re.findall(r"--hash=sha256:([0-9a-f]{64})", listed))
    assert pinned == {_locked_sha(project, "demo", "torch"),
                      _locked_sha(project, "demo", "torch_xla"), host_sha}  # fmt: skip
    assert _locked_sha(project, "demo-next", "torch_xla") not in listed
    # host-requirements.txt: the host wheel alone.
    host_list = (lane / "host-requirements.txt").read_text()
    assert re.findall(r"--hash=sha256:([0-9a-f]{64})", host_list) == [host_sha]
    assert re.findall(r"^(\S+)==", host_list, re.MULTILINE) == ["xla-wheels-host"]


@pytest.mark.slow
def test_the_runbooks_host_line_installs_the_host_package_alone_into_a_fresh_venv(
    demo: DemoRun,
) -> None:
    log = demo.log("host-install")
    (line,) = re.findall(r"^runbook \(b\): (pip install .*)$", log, re.MULTILINE)
    url = re.search(r"--index-url (http://127\.0\.0\.1:\d+/)simple/", line)
    assert url, line
    # The runbook's line (b), with the lane's address for the runbook's.
    assert line == (f"pip install --require-hashes --no-deps --index-url {url[1]}simple/ "
                    f"-r {url[1]}host-requirements.txt")  # fmt: skip
    python = demo.directory / "host-venv" / "bin" / "python"
    listed = subprocess.run(
        [str(python), "-I", "-c", "import importlib.metadata as m; print('\\n'.join("
         "f'{d.metadata[\"Name\"]} {d.version}' for d in m.distributions()))"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.split("\n")  # fmt: skip
    (built,) = (demo.project / "dist" / "host").glob("xla_wheels_host-*.whl")
    version = parse_wheel_name(built.name).version
    assert [row for row in listed if row] == [f"xla-wheels-host {version}"]  # no torch, no pip
    assert (python.parent / "xla-host").is_file()
    no_torch = subprocess.run([str(python), "-I", "-c", "import torch"], capture_output=True,
                              timeout=60, check=False)  # fmt: skip
    assert no_torch.returncode == 1


@pytest.mark.slow
def test_xla_host_doctor_from_that_venv_passes_against_the_lane_over_http(
    demo: DemoRun,
) -> None:
    log = demo.log("xla-host-doctor")
    command, *lines = log.splitlines()
    xla_host = demo.directory / "host-venv" / "bin" / "xla-host"
    assert re.fullmatch(
        rf"\$ {re.escape(str(xla_host))} doctor --lane http://127\.0\.0\.1:\d+/ --bundle demo "
        r"--python \S+/verify-install/venv/bin/python",
        command,
    ), command
    assert lines[-1] == "# exit 0", log
    verdicts = [" ".join(line.split()) for line in lines]
    assert not any(v.startswith("FAIL") for v in verdicts), log
    for expected in ("ok PJRT_DEVICE CPU", "ok torch 2.9.0a0", "ok torch-xla 2.9.0+",
                     "ok files torch-xla", "ok lane install list http://127.0.0.1:"):  # fmt: skip
        assert any(v.startswith(expected) for v in verdicts), (expected, log)
    assert any(v.endswith("/requirements.txt installs demo") for v in verdicts), log
    # It reached the lane over HTTP: the requests are in the server's log.
    requests = (demo.directory / "logs" / "lane-http.log").read_text()
    assert '"GET /bundles/demo.json HTTP/1.1" 200' in requests, requests


@pytest.mark.slow
def test_the_served_install_list_follows_publish_publish_and_rollback(demo: DemoRun) -> None:
    served = re.findall(
        r"^ {3}served http://127\.0\.0\.1:\d+/requirements\.txt names bundle (\S+): "
        r"torch-xla==(\S+)$",
        demo.result.stdout, re.MULTILINE,
    )  # fmt: skip
    assert [(bundle, version.split("+")[0]) for bundle, version in served] == [
        ("demo", "2.9.0"), ("demo-next", "2.9.1"), ("demo", "2.9.0"),
    ]  # fmt: skip
    history = tomllib.loads((demo.project / "lanes.lock").read_text())["history"]
    assert [(h["action"], h["from"], h["bundle"]) for h in history] == [
        ("publish", "", "demo"), ("publish", "demo", "demo-next"),
        ("rollback", "demo-next", "demo"),
    ]  # fmt: skip
    assert history[-1]["reason"]  # a rollback says why


@pytest.mark.slow
def test_the_demo_makes_an_ed25519_pack_key_whose_private_half_only_its_owner_reads(
    demo: DemoRun,
) -> None:
    private = demo.directory / "keys" / "pack-key.pem"
    public = read_public_key(private.with_suffix(".pub.pem"))
    assert public.keyid in demo.result.stdout
    assert private.stat().st_mode & 0o077 == 0
    # The pair signs and verifies, as a pack's manifest is signed and checked.
    message = demo.base / "message"
    message.write_bytes(b"a pack manifest")
    signature = demo.base / "message.sig"
    subprocess.run(["openssl", "pkeyutl", "-sign", "-inkey", str(private), "-rawin", "-in",
                    str(message), "-out", str(signature)], check=True, timeout=60)  # fmt: skip
    verified = subprocess.run(
        ["openssl", "pkeyutl", "-verify", "-pubin", "-inkey", str(public.path), "-rawin", "-in",
         str(message), "-sigfile", str(signature)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert verified.returncode == 0, verified.stdout + verified.stderr
    message.unlink()
    signature.unlink()


def _operating_example() -> list[str]:
    """The shell lines of docs/operating.md's "A project outside the checkout"."""
    page = (REPO_ROOT / "docs" / "operating.md").read_text()
    section = page.split("## A project outside the checkout", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


@pytest.mark.slow
def test_the_operating_pages_root_example_runs_on_the_project_a_demo_left(
    demo: DemoRun,
) -> None:
    lines = _operating_example()
    assert len(lines) == 3 and all("out/demo/project" in line for line in lines), lines
    outputs = []
    for line in lines:
        # Pasted as written, with the test's DEMO_DIR for the default out/demo.
        done = subprocess.run(
            ["bash", "-euc", line.replace("out/demo/project", str(demo.project))],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False,
            env={"PATH": os.environ["PATH"], "HOME": str(demo.base / "outside" / "home")},
        )  # fmt: skip
        assert done.returncode == 0, (line, done.stdout, done.stderr)
        outputs.append(done.stdout)
    history, status, lanes = outputs
    assert "validation: rollback demo-next -> demo" in history, history
    assert "demo-next: built, in no lane" in status and "serves demo; in sync" in status, status
    assert f"validation: {demo.lane}" in lanes and "current bundle: demo" in lanes, lanes
    # Nothing of it is written into the checkout, nor anywhere outside the demo.
    assert list((demo.base / "outside" / "home").iterdir()) == []


def test_the_demos_host_wheel_holds_the_files_setuptools_puts_in_make_host_wheels(
    tmp_path: Path,
    host_wheel: Path,
) -> None:
    # The demo writes it with the standard library (setuptools 80.9.0 needs the index):
    # the same package files and metadata as a setuptools build of host/.
    written = write_host_wheel(REPO_ROOT, tmp_path)

    def files(wheel: Path) -> dict[str, bytes]:
        with zipfile.ZipFile(wheel) as archive:
            return {
                re.sub(r"^xla_wheels_host-[^/]+\.dist-info/", "INFO/", name): archive.read(name)
                for name in archive.namelist()
            }

    ours, theirs = files(written), files(host_wheel)
    assert sorted(ours) == sorted(theirs)
    with zipfile.ZipFile(written) as archive:  # the committed host/, by make host-wheel's rule
        assert archive.testzip() is None
    version = parse_wheel_name(written.name).version
    metadata = ours["INFO/METADATA"].decode()
    assert metadata == theirs["INFO/METADATA"].decode().replace("0.1.0.dev0", version)
    for name in ("INFO/entry_points.txt", "INFO/top_level.txt"):
        assert ours[name] == theirs[name]
    # Byte for byte the same package files where the working tree is what HEAD commits.
    changed = subprocess.run(["git", "status", "--porcelain", "--", "host"], cwd=REPO_ROOT,
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
    if not changed:
        packaged = [n for n in ours if not n.startswith("INFO/")]
        assert [n for n in packaged if ours[n] != theirs[n]] == []
    # The same committed host/ writes the same bytes.
    again = write_host_wheel(REPO_ROOT, tmp_path / "again")
    assert again.read_bytes() == written.read_bytes()


def _previous_demo(directory: Path) -> dict[str, str]:
    """A directory as a demo leaves it (its marker and a log); returns what it holds."""
    (directory / "logs").mkdir(parents=True)
    (directory / MARKER).write_text("written by `make demo`\n")
    (directory / "logs" / "1-wheels.log").write_text("the first demo's log\n")
    return _contents(directory)


def _contents(directory: Path) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): p.read_text() for p in directory.rglob("*") if p.is_file()
    }


SWITCH_VALUES = "(on: 1/true/yes/on/y; off: 0/false/no/off/n or empty; any case)"


@pytest.mark.parametrize(
    ("argv", "env", "error", "fix"),
    [
        # Asked for a dry run: refused, never ignored.
        (["DRY_RUN=1"], {}, "DRY_RUN: demo has no dry run", "make demo DEMO_DIR={dir}"),
        (["DRY_RUN=yes"], {}, "DRY_RUN: demo has no dry run", "make demo DEMO_DIR={dir}"),
        ([], {"XLA_WHEELS_DRY_RUN": "1"}, "demo has no dry run, and XLA_WHEELS_DRY_RUN is set",
         "unset XLA_WHEELS_DRY_RUN to run it for real"),
        # Not a switch value at all: the value is what is named.
        (["DRY_RUN=maybe"], {}, f"DRY_RUN: 'maybe' is not a switch value {SWITCH_VALUES}",
         "make demo DEMO_DIR={dir}"),
        ([], {"XLA_WHEELS_DRY_RUN": "maybe"},
         f"XLA_WHEELS_DRY_RUN='maybe' is not a switch value {SWITCH_VALUES} (the variable "
         "of --dry-run)", "set XLA_WHEELS_DRY_RUN=1 or XLA_WHEELS_DRY_RUN=0, or unset it"),
    ],
)  # fmt: skip
def test_make_demo_refuses_a_dry_run_and_leaves_the_directory_as_it_was(
    argv: list[str], env: dict[str, str], error: str, fix: str, tmp_path: Path
) -> None:
    # It once deleted and rebuilt the demo directory: the demo has no dry run.
    demo_dir = tmp_path / "demo"
    before = _previous_demo(demo_dir)
    result = subprocess.run(
        ["make", "--no-print-directory", "demo", f"DEMO_DIR={demo_dir}", *argv],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False,
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), **env},
    )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.splitlines()
    assert lines[:2] == [f"error: {error}", f"  fix: {fix.format(dir=demo_dir)}"], lines
    assert "Traceback" not in result.stderr
    assert _contents(demo_dir) == before and result.stdout == ""


def test_a_second_demo_in_one_directory_is_refused_while_the_first_runs(
    tmp_path: Path,
) -> None:
    # The second once deleted the first one's directory under it (a traceback in the
    # first), or left the first pointing at logs it now wrote.
    demo_dir = tmp_path / "demo"
    before = _previous_demo(demo_dir)
    with bundle_run_lock(tmp_path, "demo", "make demo (the first)"):
        result = subprocess.run(
            [sys.executable, "-m", "xla_wheels.demo", "--dir", str(demo_dir)],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False,
            env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)},
        )  # fmt: skip
        assert result.returncode == 5, result.stdout + result.stderr
        assert result.stderr.splitlines()[0] == (
            f"error: another demo is running in {demo_dir} (pid and command: "
            f"{os.getpid()} make demo (the first))"
        )
        assert "DEMO_DIR=<dir>" in result.stderr
        holder = f"{os.getpid()} make demo (the first)\n"
        assert _contents(demo_dir) == {**before, LOCK_NAME: holder}
    assert _contents(demo_dir) == before  # the first run's lock is gone with it


def test_a_stage_that_prints_its_checks_twice_is_summarised_once(tmp_path: Path) -> None:
    # verify-install prints each check as it runs and again in its closing table: the
    # demo showed the block twice.
    log = tmp_path / "3-verify-install.log"
    log.write_text(
        "==> verify-install: pip install\n"
        "  ok      install: 2 pinned file(s) by sha256\n"
        "  ok      version torch: installed 2.9.0, locked 2.9.0\n"
        "verify-install demo: PASSED\n"
        "  ok      install            2 pinned file(s) by sha256\n"
        "  ok      version torch      installed 2.9.0, locked 2.9.0\n"
        "  WARN    abi                not applicable\n"
        "  fix: reinstall torch_xla from a Linux wheel\n"
        "  WARN    abi torch          not applicable\n"
        "  fix: reinstall torch_xla from a Linux wheel\n"
    )
    assert _summary(log) == [
        "verify-install demo: PASSED",
        "ok      install            2 pinned file(s) by sha256",
        "ok      version torch      installed 2.9.0, locked 2.9.0",
        # Equal fixes of two checks both stay, each under its own.
        "WARN    abi                not applicable",
        "fix: reinstall torch_xla from a Linux wheel",
        "WARN    abi torch          not applicable",
        "fix: reinstall torch_xla from a Linux wheel",
    ]
