"""Releasing to the fleet, end to end: receipts, lanes, promotion, per-lane installs.

Real components only: the synthetic upstream built in host mode (as in
test_build_host.py), two pypiserver indexes on 127.0.0.1 (one per lane) started and
stopped here, twine and pip, and the gate run once on the cached stock torch_xla 2.7.0
environment. The only receipts written by hand are the tampered and the foreign one,
written to show that promotion refuses them.

Why a second bundle: a receipt is evidence about installed wheels, and the gate can run
here only on stock torch_xla from PyPI, whose wheels are not the synthetic build's. So the
bundle that is promoted, ``stock-2.7``, locks the real torch_xla 2.7.0 wheel file from
PyPI (downloaded once per machine); the environment the gate judges was installed from
that same file, and the receipt establishes it by comparing the installed files with the
wheel's members byte for byte. torch is left out of that bundle's lock (its 800 MB wheel
would be uploaded and promoted twice per run): the bundle's locked wheels are torch_xla's.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import stat
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.clirunner import CliResult, run_cli
from tests.gate_helpers import GateRun, run_gate_cli
from tests.publish_support import (
    BUNDLE,
    FakeWheels,
    IndexServer,
    cached_stock_wheel,
    make_publish_project,
    start_pypiserver,
)
from tests.servers import stop
from tests.synthetic_upstream import Synthetic, cli_args, copy_synthetic
from xla_host import receipts
from xla_host.filemode import file_sha256
from xla_host.installed_metadata import read_installed
from xla_host.net import DEFAULT_NETWORK
from xla_host.wheel_filename import parse_wheel_name
from xla_wheels import wheels_lock
from xla_wheels.bundle import load_bundle
from xla_wheels.publish.index import Credentials, project_files
from xla_wheels.release import lanes, policy
from xla_wheels.wheels_lock import WheelRecord, record_wheels, update_bundle_entry

STOCK = "2.7.0"
STOCK_BUNDLE = "stock-2.7"
HOST = ("--mode", "host", "--host-python", sys.executable)
NO_CREDENTIALS = Credentials(None, None, "none")


def _python_version(python: Path) -> str:
    return read_installed(str(python), []).version


def _add_stock_bundle(root: Path, wheel: Path, python_version: str) -> None:
    """A bundle that locks the stock PyPI torch_xla wheel (test data: the gate's control)."""
    blocks = [
        f'[bundle]\nname = "{STOCK_BUNDLE}"\ndescription = "stock torch_xla {STOCK} from PyPI"\n'
        f'python = "{python_version}"\n'
    ]
    for component, version in (("torch", STOCK), ("torch_xla", STOCK), ("openxla", None)):
        blocks.append(
            f'[components.{component}]\nremote = "https://example.invalid/{component}.git"\n'
            'unpinned = "a stock wheel built upstream, not by this pipeline"\n'
            + (f'version = "{version}"\n' if version else "")
        )
    (root / "build" / "bundles" / f"{STOCK_BUNDLE}.toml").write_text("\n".join(blocks))
    bundle = load_bundle(root, STOCK_BUNDLE)
    update_bundle_entry(root / "wheels.lock", bundle, {}, root)
    dist = root / "dist" / STOCK_BUNDLE
    dist.mkdir(parents=True)
    shutil.copyfile(wheel, dist / wheel.name)
    record = WheelRecord(wheel.name, wheel.stat().st_size, file_sha256(dist / wheel.name))
    record_wheels(root / "wheels.lock", STOCK_BUNDLE, [record])


def write_lanes(root: Path, validation: IndexServer, preferred: IndexServer, rules: str) -> None:
    (root / "build" / "lanes.toml").write_text(
        f'publish-lane = "validation"\n\n[lanes.validation]\nindex-url = "{validation.url}"\n\n'
        f'[lanes.preferred]\nindex-url = "{preferred.url}"\npromote-from = "validation"\n\n'
        f"[lanes.preferred.policy]\n{rules}"
    )


RUNTIME = '[runtime.jax]\nversion = "0.9.0"\n\n[runtime.jaxlib]\nversion = "0.9.0"\n'
TPU_POLICY = 'device = "TPU"\nchecks = ["restart", "hbm"]\nmax-warm-regression = 0.10\n'
CPU_POLICY = 'device = "CPU"\nchecks = ["restart"]\nmax-warm-regression = 0.10\n'


@dataclass
class Release:
    root: Path
    validation: IndexServer
    preferred: IndexServer
    stock_python: Path
    stock_wheel: Path
    gate: GateRun
    work: Path

    def run(self, *args: str, timeout: float = 900, **env: str) -> CliResult:
        return run_cli(
            *args,
            env={**self.validation.credentials, **env},
            timeout=timeout,
            root=self.root,
            inherit_env=True,
        )

    def receipt(self) -> receipts.StoredReceipt:
        (found,) = receipts.bundle_receipts(self.root, STOCK_BUNDLE)
        return found

    def state(self) -> dict[str, lanes.LaneState]:
        return lanes.read_state(self.root)


@pytest.fixture(scope="module")
def release(
    stock_xla_python_27: Path,
    synthetic_template: Synthetic,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Release]:
    """Build syn, start two lanes, publish both bundles to validation, run the gate once."""
    work = tmp_path_factory.mktemp("release")
    syn: Synthetic = copy_synthetic(synthetic_template, work / "syn")
    built = run_cli(*cli_args(syn, *HOST), env={"HOME": str(work)}, timeout=900)
    assert built.exit_code == 0, built.stderr
    version = _python_version(stock_xla_python_27)
    wheel = cached_stock_wheel(STOCK, version)
    _add_stock_bundle(syn.root, wheel, version)
    servers = [start_pypiserver(work / name, "update") for name in ("validation", "preferred")]
    try:
        write_lanes(syn.root, servers[0][1], servers[1][1], TPU_POLICY)
        env = {**servers[0][1].credentials, "XLA_WHEELS_ROOT": str(syn.root)}
        gate = run_gate_cli(
            "gate", "--python", str(stock_xla_python_27), "--checks", "restart",
            "--bundle", STOCK_BUNDLE, "--root", str(syn.root),
            "--baselines-dir", str(work / "baselines"), "--record-baseline",
            out_dir=work / "gate", env=env,
        )  # fmt: skip
        yield Release(syn.root, servers[0][1], servers[1][1], stock_xla_python_27, wheel, gate,
                      work)  # fmt: skip
    finally:
        for process, _ in servers:
            stop(process)


def _listed(server: IndexServer, project: str) -> dict[str, str | None]:
    listed = project_files(server.url, project, NO_CREDENTIALS, network=DEFAULT_NETWORK)
    return {n: f.sha256 for n, f in listed.items()}


def _venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    return path / "bin" / "python"


def _pip_install(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # This interpreter's pip (pinned >= 26.1 in requirements-dev.txt) installs into the
    # fresh venv through --python: one client, whose pylock.toml support we rely on.
    return subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install",
         "--disable-pip-version-check", "--no-cache-dir", *args],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip


def _installed_version(python: Path, project: str) -> str | None:
    return read_installed(str(python), [project]).version_of(project)


# --- the gate leaves a receipt for exactly the locked wheels -----------------------------


def test_the_gate_leaves_a_sealed_receipt_for_the_locked_wheel(release: Release) -> None:
    assert release.gate.exit_code == 0, release.gate.stdout + release.gate.stderr
    stored = release.receipt()
    assert f"receipt: {stored.path} (passed, for the locked wheels of {STOCK_BUNDLE})" in (
        release.gate.stdout
    )
    assert stored.path.parent == release.root / "receipts" / STOCK_BUNDLE
    assert stored.digest_ok
    receipt = stored.receipt
    locked = tomllib.loads((release.root / "wheels.lock").read_text())["bundles"][STOCK_BUNDLE]
    assert receipt.wheels_match_lock and receipt.problems == ()
    assert receipt.locked_files == {(w["name"], w["sha256"]) for w in locked["wheels"]}
    (wheel,) = receipt.wheels
    assert wheel.matched and wheel.files > 100  # every member of the real wheel compared
    assert (receipt.device, receipt.chip, receipt.workload) == ("CPU", None, "small")
    assert receipt.versions["torch"] == STOCK and receipt.versions["torch_xla"] == STOCK
    assert receipt.versions["libtpu"] is None
    restart = receipt.check("restart")
    assert restart is not None and restart.passed
    assert restart.figures["warm_ready_s"] < restart.figures["cold_ready_s"]
    warm = [r for r in restart.figures["runs"] if r["name"].startswith("warm")]
    assert warm and all(r["hits"] == restart.figures["cold_misses"] for r in warm)
    assert all(r["xla_compiles"] == 0 for r in warm)


def test_the_passing_run_records_the_baseline_later_runs_compare_with(release: Release) -> None:
    baselines = list((release.work / "baselines").glob("*.json"))
    assert [b.name for b in baselines] == ["2.7.0__CPU__small.json"]
    data = json.loads(baselines[0].read_text())
    assert data["warm_ready_s"] == release.gate.check("restart")["figures"]["warm_ready_s"]
    assert f"baseline recorded in {baselines[0]}" in release.gate.stdout


def test_an_environment_that_is_not_the_lock_gets_a_receipt_that_says_so(
    release: Release,
) -> None:
    # The same gate evidence, matched against the synthetic bundle's lock: torch_xla 2.7.0
    # is not the synthetic build, so the receipt must say so (no gate rerun needed: the
    # matching is the part under test, through the same code the gate calls).
    from xla_host import installed

    syn_lock = tomllib.loads((release.root / "wheels.lock").read_text())["bundles"]["syn"]
    records = [WheelRecord(w["name"], w["size"], w["sha256"]) for w in syn_lock["wheels"]]
    _, match = installed.match_environment(
        release.stock_python, records, release.root / "dist" / "syn"
    )
    assert not match.matches_lock
    assert any("torch-xla is 2.7.0, the locked wheel 2.9.0" in p for p in match.problems)
    # And an installed file that differs from the wheel's is caught, byte for byte.
    wheel = release.root / "dist" / STOCK_BUNDLE / release.stock_wheel.name
    record = WheelRecord(wheel.name, wheel.stat().st_size, file_sha256(wheel))
    site = release.work / "site-copy"
    facts = installed.probe_environment(release.stock_python, ["torch_xla"])
    original = Path(str(facts.dists["torch-xla"]["site"]))
    for listed in facts.dists["torch-xla"]["record"]:  # a twin of the install, by symlinks
        if not str(listed).startswith(".."):
            (site / listed).parent.mkdir(parents=True, exist_ok=True)
            (site / listed).symlink_to(original / listed)
    (site / "torch_xla" / "__init__.py").unlink()
    (site / "torch_xla" / "__init__.py").write_text("# changed after install\n")
    fake = dataclasses.replace(
        facts, dists={"torch-xla": {**facts.dists["torch-xla"], "site": str(site)}}
    )
    result = installed.match_wheel(record, wheel, fake, None)
    assert not result.matched
    assert "torch-xla: installed torch_xla/__init__.py differs from the wheel's" in result.problems


# --- publish, refuse, promote, install --------------------------------------------------


def test_publish_refuse_promote_install(release: Release) -> None:
    root = release.root

    # 1. make publish: the synthetic build into the validation lane.
    published = release.run("publish-lane", "--bundle", "syn")
    assert published.exit_code == 0, published.output
    syn_lock = tomllib.loads((root / "wheels.lock").read_text())["bundles"]["syn"]
    for wheel in syn_lock["wheels"]:
        project = parse_wheel_name(wheel["name"]).project
        assert _listed(release.validation, project)[wheel["name"]] == wheel["sha256"]
    assert release.state()["validation"].bundle == "syn"

    # 2. make requirements: the validation lane's requirements.txt and pylock.toml, and
    #    both install (pip --require-hashes; pip's own pylock.toml support).
    made = release.run("lane-requirements", "--lane", "validation")
    assert made.exit_code == 0, made.output
    out = root / "dist" / "lanes" / "validation"
    req_venv = _venv(release.work / "venv-req")
    installed = _pip_install(
        req_venv, "--require-hashes", "--index-url", release.validation.url,
        "-r", str(out / "requirements.txt"),
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    pylock = tomllib.loads((out / "pylock.toml").read_text())
    assert pylock["lock-version"] == "1.0"
    locked_by_name = {w["name"]: w["sha256"] for w in syn_lock["wheels"]}
    assert {
        w["name"]: w["hashes"]["sha256"] for p in pylock["packages"] for w in p["wheels"]
    } == locked_by_name
    lock_venv = _venv(release.work / "venv-pylock")
    installed = _pip_install(lock_venv, "-r", str(out / "pylock.toml"))
    assert installed.returncode == 0, installed.stderr
    xla_name = next(n for n in locked_by_name if n.startswith("torch_xla-"))
    xla_version = parse_wheel_name(xla_name).version
    for python in (req_venv, lock_venv):
        assert _installed_version(python, "torch_xla") == xla_version

    # 3. promote with no receipt: refused, naming the rule.
    refused = release.run("promote", "--bundle", "syn")
    assert refused.exit_code == 1, refused.output
    assert "lane preferred refuses bundle syn" in refused.stderr
    assert "receipt: no receipt for bundle syn" in refused.stderr

    # 4. a foreign receipt (the stock bundle's, relabelled and resealed by hand) and a
    #    tampered one (a figure edited after writing): both refused.
    good = release.receipt()
    foreign = dataclasses.replace(good.receipt, bundle="syn")
    foreign_path = receipts.write_receipt(root / "receipts" / "syn" / "foreign.json", foreign)
    refused = release.run("promote", "--bundle", "syn")
    assert refused.exit_code == 1, refused.output
    assert "wheels: foreign.json judged torch_xla-2.7.0" in refused.stderr
    assert "wheels.lock has torch-2.9.0a0" in refused.stderr
    data = json.loads(foreign_path.read_text())
    data["bundle"] = "syn"
    data["checks"][0]["figures"]["warm_ready_s"] = 0.001
    tampered_path = foreign_path.with_name("tampered.json")
    tampered_path.write_text(json.dumps(data))
    foreign_path.unlink()
    refused = release.run("promote", "--bundle", "syn")
    assert "seal: tampered.json does not match its digest (edited after it was" in refused.stderr
    tampered_path.unlink()
    assert "preferred" not in release.state()

    # 5. the stock bundle into validation; the real CPU receipt under the TPU rule: refused.
    published = release.run("publish-lane", "--bundle", STOCK_BUNDLE)
    assert published.exit_code == 0, published.output
    refused = release.run("promote", "--bundle", STOCK_BUNDLE)
    assert refused.exit_code == 1, refused.output
    assert f"device: {good.path.name} was judged on CPU; the lane requires TPU" in refused.stderr
    assert f"check:hbm: {good.path.name} has no hbm check" in refused.stderr
    assert _listed(release.preferred, "torch-xla") == {}

    # 6. under a lanes configuration whose policy asks for CPU receipts: a dry run changes
    #    nothing, the real run copies exactly the locked file and records the lane.
    write_lanes(root, release.validation, release.preferred, CPU_POLICY)
    dry = release.run("promote", "--bundle", STOCK_BUNDLE, XLA_WHEELS_DRY_RUN="1")
    assert dry.exit_code == 0, dry.output
    assert f"would copy {release.stock_wheel.name}" in dry.stdout
    assert _listed(release.preferred, "torch-xla") == {} and "preferred" not in release.state()
    promoted = release.run("promote", "--bundle", STOCK_BUNDLE)
    assert promoted.exit_code == 0, promoted.output
    sha = file_sha256(release.stock_wheel)
    assert _listed(release.preferred, "torch-xla") == {release.stock_wheel.name: sha}
    state = release.state()["preferred"]
    assert state.bundle == STOCK_BUNDLE and state.wheels == ((release.stock_wheel.name, sha),)
    assert state.receipt == good.path.relative_to(root).as_posix()
    assert state.receipt_digest == good.digest
    # The lane's current receipt is the bar later promotions are held to: editing it is
    # refused, like any tampering.
    original = good.path.read_text()
    edited = json.loads(original)
    edited["checks"][0]["figures"]["warm_ready_s"] = 1000.0
    good.path.write_text(json.dumps(edited))
    moved = release.run("promote", "--bundle", STOCK_BUNDLE)
    good.path.write_text(original)
    assert moved.exit_code == 1 and "is not the one lanes.lock recorded" in moved.stderr

    # 7. install from the preferred lane by hash (torch_xla only: torch is 800 MB).
    made = release.run("lane-requirements", "--lane", "preferred")
    assert made.exit_code == 0, made.output
    requirements = root / "dist" / "lanes" / "preferred" / "requirements.txt"
    assert f"--hash=sha256:{sha}" in requirements.read_text()
    host = _venv(release.work / "venv-host")
    installed = _pip_install(
        host, "--no-deps", "--require-hashes", "--index-url", release.preferred.url,
        "-r", str(requirements),
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    assert _installed_version(host, "torch_xla") == STOCK

    # 8. doctor on a host running the stock env: its bundle and lane.
    doctor = release.run(
        "doctor", "--bundle", STOCK_BUNDLE, "--python", str(release.stock_python),
        "--lane", "preferred",
    )  # fmt: skip
    assert f"runs bundle {STOCK_BUNDLE}, the current bundle of lane preferred" in doctor.stdout
    doctor = release.run(
        "doctor", "--bundle", "syn", "--python", str(req_venv), "--lane", "preferred"
    )
    assert f"runs bundle syn; lane preferred's current bundle is {STOCK_BUNDLE}" in doctor.stdout


def test_compare_names_what_is_not_like_for_like(release: Release) -> None:
    good = release.receipt()
    # A second bundle's receipt: the stock receipt relabelled (hand-written, so it is
    # resealed and cannot pass promotion: its wheels are not syn's).
    receipts.write_receipt(
        release.root / "receipts" / "other" / "compare.json",
        dataclasses.replace(good.receipt, bundle="other", workload="large", workload_sha256=None),
    )
    try:
        compared = release.run("compare", STOCK_BUNDLE, "other")
    finally:
        (release.root / "receipts" / "other" / "compare.json").unlink()
    assert compared.exit_code == 0, compared.output
    assert "warm ready s" in compared.stdout and "HBM per chip" in compared.stdout
    assert "different workload: small vs large" in compared.stdout
    rows = {line.split()[0]: line.split()[1:] for line in compared.stdout.splitlines() if line}
    # The preset's source digest, as the gate's probe read it; none in the relabelled one.
    digest = str(good.receipt.workload_sha256)
    assert rows["workload"] == ["small", "(source", "sha256", f"{digest[:12]})", "large"]
    assert rows["device"] == ["CPU", "CPU"]
    assert rows["torch_xla"] == [STOCK, STOCK] and rows["restart"] == ["PASS", "PASS"]


# --- the policy on its own (pure: receipts in, verdict out) ------------------------------


def _stored(receipt: receipts.Receipt, name: str = "r.json") -> receipts.StoredReceipt:
    payload = receipt.payload()
    return receipts.StoredReceipt(Path(name), receipt, receipts.canonical_digest(payload), True)


def test_the_restart_regression_gate_compares_with_the_current_bundle(release: Release) -> None:
    base = release.receipt().receipt
    rule = lanes.Policy(device="CPU", checks=("restart",), max_warm_regression=0.10)
    locked = base.locked_files

    def with_warm(seconds: float, **changes: object) -> receipts.Receipt:
        restart = base.check("restart")
        assert restart is not None
        check = dataclasses.replace(restart, figures={**restart.figures, "warm_ready_s": seconds})
        return dataclasses.replace(base, checks=(check,), **changes)  # type: ignore[arg-type]

    current = with_warm(1.0)
    ok = policy.judge_promotion(STOCK_BUNDLE, locked, [_stored(with_warm(1.09))], rule, current)
    assert ok.passed
    slow = policy.judge_promotion(STOCK_BUNDLE, locked, [_stored(with_warm(1.2))], rule, current)
    assert not slow.passed
    assert "slower than the current bundle's 1.000s beyond 10%" in slow.failures[0].detail
    other = policy.judge_promotion(
        STOCK_BUNDLE, locked, [_stored(with_warm(0.5, workload="large"))], rule, current
    )
    assert [f.rule for f in other.failures] == ["regression"]
    assert "not comparable" in other.failures[0].detail
    # No current bundle in the lane: the first promotion has nothing to regress against.
    assert policy.judge_promotion(
        STOCK_BUNDLE, locked, [_stored(with_warm(9.0))], rule, None
    ).passed


# --- per-lane files with a public runtime closure (generation only: jaxlib is for 3.13) -


@pytest.mark.slow
def test_lane_pylock_names_public_runtime_wheels_by_url_and_hash(
    tmp_path: Path,
    fake_wheels: FakeWheels,
) -> None:
    project = make_publish_project(
        tmp_path, [fake_wheels.torch, fake_wheels.torch_xla], runtime=RUNTIME, python="3.13"
    )
    (project / "build" / "lanes.toml").write_text(
        'publish-lane = "validation"\n\n[lanes.validation]\npath = "dist/lanes/validation"\n'
    )
    assert (
        run_cli("publish-lane", "--bundle", BUNDLE, root=project, inherit_env=True).exit_code == 0
    )
    stale = run_cli("lane-requirements", root=project, inherit_env=True)
    assert stale.exit_code == 2 and "records no resolved runtime wheels" in stale.stderr
    resolved = run_cli(
        "requirements", "--bundle", BUNDLE, timeout=900, root=project, inherit_env=True
    )
    assert resolved.exit_code == 0, resolved.output
    made = run_cli("lane-requirements", root=project, inherit_env=True)
    assert made.exit_code == 0, made.output
    entry = tomllib.loads((project / "wheels.lock").read_text())["bundles"][BUNDLE]
    pylock = tomllib.loads((project / "dist/lanes/validation/pylock.toml").read_text())
    wheels = {w["name"]: (p, w) for p in pylock["packages"] for w in p["wheels"]}
    for row in entry["runtime-wheels"]:
        package, wheel = wheels[row["name"]]
        assert wheel["hashes"] == {"sha256": row["sha256"]}
        assert package["index"] == "https://pypi.org/simple/"
        assert wheel["url"].startswith("https://") and wheel["url"].endswith(row["name"])
    ours = {w["name"] for w in entry["wheels"]}
    assert all(wheels[n][1]["url"].startswith("file://") for n in ours)
    assert len(wheels) == len(entry["runtime-wheels"]) + len(ours)
    text = (project / "dist/lanes/validation/requirements.txt").read_text()
    assert all(f"--hash=sha256:{row['sha256']}" in text for row in entry["runtime-wheels"])
    # A runtime pin changed since the resolution: the recorded closure is stale, refused.
    manifest = project / "build" / "bundles" / f"{BUNDLE}.toml"
    manifest.write_text(manifest.read_text().replace('version = "0.9.0"', 'version = "0.8.2"'))
    stale = run_cli("lane-requirements", root=project, inherit_env=True)
    assert stale.exit_code == 2 and "resolved for other inputs" in stale.stderr


# --- static-directory lanes and bad configuration (fast: no gate, no server) ------------


@pytest.mark.slow
def test_static_lanes_publish_promote_and_install_by_hash(
    tmp_path: Path,
    fake_wheels: FakeWheels,
) -> None:
    project = make_publish_project(tmp_path, [fake_wheels.torch, fake_wheels.torch_xla])
    (project / "build" / "lanes.toml").write_text(
        'publish-lane = "validation"\n\n[lanes.validation]\npath = "dist/lanes/validation"\n\n'
        '[lanes.staging]\npath = "dist/lanes/staging"\npromote-from = "validation"\n'
    )
    dry = run_cli(
        "publish-lane",
        "--bundle",
        BUNDLE,
        env={"XLA_WHEELS_DRY_RUN": "1"},
        root=project,
        inherit_env=True,
    )
    assert dry.exit_code == 0 and "would copy" in dry.stdout, dry.output
    assert not (project / "dist" / "lanes").exists() and not (project / "lanes.lock").exists()
    assert (
        run_cli(
            "publish-lane", "--bundle", BUNDLE, root=project, inherit_env=True, umask=0o022
        ).exit_code
        == 0
    )
    # A lane without a policy takes a bundle without a receipt, and says so.
    promoted = run_cli(
        "promote", "--bundle", BUNDLE, "--lane", "staging", root=project, inherit_env=True,
        umask=0o022,
    )  # fmt: skip
    assert promoted.exit_code == 0, promoted.output
    assert "lane staging has no policy: promoting without a receipt" in promoted.stdout
    staging = project / "dist" / "lanes" / "staging"
    for wheel in (fake_wheels.torch, fake_wheels.torch_xla):
        assert file_sha256(staging / wheel.name) == file_sha256(wheel)
    state = lanes.read_state(project)
    assert state["staging"].bundle == BUNDLE and state["staging"].receipt is None
    # The lane's static index serves the files by hash: pip installs from it.
    made = run_cli(
        "lane-requirements", "--lane", "staging", root=project, inherit_env=True, umask=0o022
    )
    assert made.exit_code == 0, made.output
    # What a lane holds is for others to read (a web server running as another user): the
    # modes a plain open() gives under umask 022, as for dist/ (docs/building.md "Build stage").
    for readable in (
        staging / fake_wheels.torch.name,
        staging / fake_wheels.torch_xla.name,
        staging / "requirements.txt",
        staging / "pylock.toml",
        project / "lanes.lock",
    ):
        assert stat.S_IMODE(readable.stat().st_mode) == 0o644, readable
    host = _venv(tmp_path / "host")
    installed = _pip_install(
        host, "--require-hashes", "--index-url", (staging / "simple").as_uri() + "/",
        "-r", str(staging / "requirements.txt"),
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    # A file on a lane is never overwritten by another one under the same name.
    (staging / fake_wheels.torch.name).write_bytes(b"not the wheel")
    again = run_cli(
        "promote", "--bundle", BUNDLE, "--lane", "staging", root=project, inherit_env=True
    )
    assert again.exit_code == 1 and "already holds" in again.stderr


def test_one_promotion_reads_wheels_lock_once(
    tmp_path: Path,
    fake_wheels: FakeWheels,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The CLI edge parses wheels.lock once and passes the parsed lock down: judging the
    # policy, the records to copy and the profile digest all read that one object.
    from xla_wheels.cli import main

    project = make_publish_project(tmp_path, [fake_wheels.torch, fake_wheels.torch_xla])
    (project / "build" / "lanes.toml").write_text(
        'publish-lane = "validation"\n\n[lanes.validation]\npath = "dist/lanes/validation"\n\n'
        '[lanes.staging]\npath = "dist/lanes/staging"\npromote-from = "validation"\n'
    )
    published = run_cli("publish-lane", "--bundle", BUNDLE, root=project, inherit_env=True)
    assert published.exit_code == 0, published.output
    reads: list[Path] = []
    read_regular = wheels_lock.read_regular  # the one place read_lock reads the file

    def counted(path: Path, *args: Any, **kwargs: Any) -> bytes:
        if path.name == "wheels.lock":
            reads.append(path)
        return read_regular(path, *args, **kwargs)

    monkeypatch.setattr(wheels_lock, "read_regular", counted)
    argv = ["promote", "--root", str(project), "--bundle", BUNDLE, "--lane", "staging"]
    assert main(argv) == 0
    assert lanes.read_state(project)["staging"].bundle == BUNDLE
    assert reads == [project / "wheels.lock"]


def test_a_malformed_lanes_file_and_an_unknown_lane_are_named(
    tmp_path: Path,
    fake_wheels: FakeWheels,
) -> None:
    project = make_publish_project(tmp_path, [fake_wheels.torch, fake_wheels.torch_xla])
    lanes_file = project / "build" / "lanes.toml"
    lanes_file.write_text('[lanes.validation]\npath = "x"\n[lanes.validation.policy]\ndevise = 1\n')
    bad = run_cli(
        "promote", "--bundle", BUNDLE, "--lane", "validation", root=project, inherit_env=True
    )
    assert bad.exit_code == 2  # a malformed lanes.toml is bad input
    assert "key 'lanes.validation.policy.devise': unknown key; did you mean 'device'?" in bad.stderr
    assert "fix:" in bad.stderr
    lanes_file.write_text('[lanes.validation]\npath = "x"\n')
    unknown = run_cli(
        "promote", "--bundle", BUNDLE, "--lane", "fleet", root=project, inherit_env=True
    )
    assert unknown.exit_code == 2 and "has no lane 'fleet'" in unknown.stderr


def test_the_gate_refuses_an_unknown_bundle_before_it_runs(
    tmp_path: Path,
    fake_wheels: FakeWheels,
) -> None:
    project = make_publish_project(tmp_path, [fake_wheels.torch, fake_wheels.torch_xla])
    for command in ("gate", "bench-restart"):
        run = run_gate_cli(
            command, "--bundle", "nosuch", "--root", str(project), "--python", "/nonexistent",
            out_dir=tmp_path / command,
        )  # fmt: skip
        assert run.exit_code == 2, run.stdout + run.stderr
        assert "wheels.lock has no bundle nosuch" in run.stderr
        assert not (tmp_path / command).exists()  # refused before anything ran
