"""``key-probe``: the cache key probed on the real runtime, input by input.

The cache-key check asks whether a few chosen settings miss. This check asks the question
the key exists to answer, for every input of :data:`PROBES_FILE` (``key_probes.toml``):
when a process with that one input changed loads an executable from the cache, is it the
executable of the program that process wants?

After a cold run with default settings fills a cache, one warm process per probe runs the
same program (``key_probe_child.py``: a few small graphs) on its own copy of that cache
with only the probe's input changed. Before syncing each graph, the child lowers it and
fingerprints the module with the canonical rules (``hlo_canonical``: names and debug
metadata left out), and it records the compile-side settings as XLA parses them. Per
probe and graph (:func:`judge_key_probe`, a pure function of the rows):

* a hit whose module or compile-side settings differ from the cold run's: FAIL, naming the
  input (the cache loaded an executable built for another program or other settings);
* a miss whose module and compile-side settings equal the cold run's: WARN (a needless
  split: a restart with this input recompiles what it could have loaded);
* a miss, or a hit of the same module and settings: pass.

The control (nothing changed) must hit every graph: a cache that never loads (stock
2.9.0) cannot be probed, and the check fails rather than pass on misses alone. It works on
any build: stock 2.7.0, whose key is the IR hash plus a list of settings, fails it naming
``XLA_DOWNCAST_BF16`` (the negative control on the real runtime).

The control runs first, alone; the other probes then run side by side on CPU (judged by
counters and fingerprints, never by time), in batches of :data:`BATCH`.
"""

from __future__ import annotations

import shutil
import time
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xla_host import log
from xla_host.errors import UsageError
from xla_host.gate.check import Declared, GateRun
from xla_host.gate.children import ChildSpec, run_child, run_side_by_side, runtime_env
from xla_host.gate.errors import GateEnvironmentError
from xla_host.gate.result import CheckResult
from xla_host.gate.target import Target
from xla_host.tables import Field, Table, loads_toml

NAME = "key-probe"
PROBES_FILE = Path(__file__).with_name("key_probes.toml")
CHILD = Path(__file__).with_name("key_probe_child.py")
#: Probe processes at once on CPU: each is one torch_xla import and a few small compiles.
BATCH = 4

PASS, WARN, FAIL, NOT_APPLICABLE = "pass", "warn", "fail", "not applicable"


class ProbeTableError(GateEnvironmentError):
    """key_probes.toml (or a --key-probes selection) is not what the check can run."""


@dataclass(frozen=True)
class Probe:
    """One input changed from the cold run (a row of ``key_probes.toml``)."""

    name: str
    why: str
    env: Mapping[str, str] = field(default_factory=dict)
    setter: str | None = None
    value: str | None = None
    xla_flags: tuple[str, ...] = ()
    flag_file: tuple[str, ...] = ()
    custom_compile_options: Mapping[str, str] = field(default_factory=dict)
    devices: tuple[str, ...] = ()
    fast: bool = False
    control: bool = False

    @property
    def setting(self) -> str:
        """The change, as the report shows it."""
        if self.control:
            return "nothing changed"
        parts = [f"{k}={v}" for k, v in self.env.items()]
        if self.setter is not None:
            parts.append(f"{self.setter}({self.value!r})")
        if self.xla_flags:
            parts.append("XLA_FLAGS+=" + " ".join(self.xla_flags))
        if self.flag_file:
            parts.append("XLA_FLAGS=<a file of: " + " ".join(self.flag_file) + ">")
        if self.custom_compile_options:
            pairs = ", ".join(f"{k!r}: {v!r}" for k, v in self.custom_compile_options.items())
            parts.append(f"set_custom_compile_options({{{pairs}}})")
        return "; ".join(parts)


def load_probes(path: Path = PROBES_FILE) -> list[Probe]:
    """Every row of the probe table, checked (a wrong key is named, with the fix)."""
    fix = f"correct {path.name} (its header says what a row holds)"
    try:
        data = loads_toml(path.read_text(), source=str(path), error=ProbeTableError, fix=fix)
    except tomllib.TOMLDecodeError as error:
        raise ProbeTableError(f"{path}: not TOML: {error}", fix=fix) from None
    rows = Table(data, source=str(path), error=ProbeTableError).rows("probe") or []
    probes = []
    for row in rows:
        values = row.read(
            Field("name", str, required=True),
            Field("why", str, required=True),
            Field("env", dict, default={}),
            Field("setter", str),
            Field("value", str),
            Field("xla_flags", list, default=[], items=str),
            Field("flag_file", list, default=[], items=str),
            Field("custom_compile_options", dict, default={}),
            Field("devices", list, default=[], items=str),
            Field("fast", bool, default=False),
            Field("control", bool, default=False),
        )
        changes = [
            bool(values["env"]),
            values["setter"] is not None,
            bool(values["xla_flags"]),
            bool(values["flag_file"]),
            bool(values["custom_compile_options"]),
        ]
        if sum(changes) != (0 if values["control"] else 1):
            raise row.fail(
                "name",
                f"probe {values['name']!r} changes {sum(changes)} inputs",
                "a probe changes exactly one input (env, setter, xla_flags, flag_file or "
                "custom_compile_options); the control changes none",
            )
        probes.append(
            Probe(
                name=values["name"],
                why=values["why"],
                env={str(k): str(v) for k, v in values["env"].items()},
                setter=values["setter"],
                value=values["value"],
                xla_flags=tuple(values["xla_flags"]),
                flag_file=tuple(values["flag_file"]),
                custom_compile_options={
                    str(k): str(v) for k, v in values["custom_compile_options"].items()
                },
                devices=tuple(values["devices"]),
                fast=values["fast"],
                control=values["control"],
            )
        )
    return probes


def not_probed(path: Path = PROBES_FILE) -> dict[str, str]:
    """``[not_probed]``: inputs that change the module or how it is compiled but that no
    probe changes, each with why."""
    data = loads_toml(path.read_text(), source=str(path), error=ProbeTableError)
    table = Table(data, source=str(path), error=ProbeTableError).table("not_probed", optional=True)
    return {str(name): str(table.get(str(name), str)) for name in table.data}


def select(probes: Sequence[Probe], names: Iterable[str] | None) -> list[Probe]:
    """``--key-probes``: the named probes (``fast``: the fast subset), the control always
    first; None: every probe."""
    if names is None:
        return sorted(probes, key=lambda p: not p.control)
    wanted = set(names)
    if "fast" in wanted:
        wanted |= {p.name for p in probes if p.fast}
        wanted.discard("fast")
    unknown = sorted(wanted - {p.name for p in probes})
    if unknown:
        raise UsageError(
            f"unknown key probe(s): {', '.join(unknown)}",
            fix="name probes of key_probes.toml, comma-separated, or 'fast': "
            + ", ".join(p.name for p in probes),
        )
    chosen = [p for p in probes if p.control or p.name in wanted]
    return sorted(chosen, key=lambda p: not p.control)


def not_applicable(probe: Probe, device: str) -> str | None:
    if probe.devices and device not in probe.devices:
        return f"means something on {'/'.join(probe.devices)} only, not on {device}"
    return None


def probe_env(base: Mapping[str, str], probe: Probe, flag_file: Path | None) -> dict[str, str]:
    """The cold run's environment with the probe's one change."""
    env = {**base, **probe.env}
    if probe.xla_flags:
        # After the caller's own flags: XLA keeps the last value of a flag.
        env["XLA_FLAGS"] = " ".join([*base.get("XLA_FLAGS", "").split(), *probe.xla_flags])
    if flag_file is not None:
        # XLA reads flags from the file an XLA_FLAGS value without a leading "-" names
        # (xla/parse_flags_from_env.cc); the caller's own flags go into the file first.
        env["XLA_FLAGS"] = str(flag_file)
    return env


def probe_args(probe: Probe) -> list[str]:
    args = []
    if probe.setter is not None:
        args.append(f"--setter={probe.setter}={probe.value}")
    args += [f"--custom-compile-option={k}={v}" for k, v in probe.custom_compile_options.items()]
    return args


# --- the verdict -------------------------------------------------------------------------


def _graph_outcome(cold: Mapping[str, Any], warm: Mapping[str, Any], same_side: bool) -> str:
    loaded = warm["hits"] > 0 and warm["compiles"] == 0
    same_program = warm["module"] == cold["module"] and same_side
    if loaded:
        return PASS if same_program else FAIL
    return WARN if same_program else PASS


def judge_key_probe(
    cold: Mapping[str, Any], probes: Sequence[tuple[Probe, Mapping[str, Any] | None, str | None]]
) -> CheckResult:
    """``probes``: (probe, its child's report or None, why not applicable or None)."""
    reasons: list[str] = []
    notes: list[str] = []
    table: list[dict[str, Any]] = []
    if not cold.get("ok"):
        return CheckResult(NAME, False, [f"the cold run did not finish: {cold.get('error')}"])
    cold_graphs = {g["graph"]: g for g in cold["graphs"]}
    if not any(g["misses"] for g in cold["graphs"]):
        reasons.append("the cold run had no persistent-cache misses: nothing was written to probe")
    for probe, report, why_not in probes:
        entry: dict[str, Any] = {"probe": probe.name, "setting": probe.setting, "why": probe.why}
        why_not = why_not or (report or {}).get("not_applicable")
        if why_not is not None:
            entry.update({"status": NOT_APPLICABLE, "reason": why_not})
            notes.append(f"{probe.name}: not applicable, {why_not}")
            table.append(entry)
            continue
        if report is None or not report.get("ok"):
            error = (report or {}).get("error", "no report")
            entry.update({"status": FAIL, "reason": f"did not finish: {error}"})
            reasons.append(f"{probe.name}: the probe run did not finish ({error})")
            table.append(entry)
            continue
        same_side = report["compile_side_digest"] == cold["compile_side_digest"]
        graphs = _graph_rows(report, cold_graphs, same_side)
        entry["graphs"] = graphs
        entry["same_compile_side"] = same_side
        entry["status"], probe_reasons, probe_notes = _probe_verdict(probe, graphs)
        reasons += probe_reasons
        notes += probe_notes
        table.append(entry)
    figures: dict[str, Any] = {"probes": table}
    figures["lower_and_fingerprint_s"] = {
        g["graph"]: g.get("lower_and_fingerprint_s") for g in cold["graphs"]
    }
    return CheckResult(NAME, not reasons, reasons, notes, figures)


def _graph_rows(
    report: Mapping[str, Any], cold_graphs: Mapping[str, Mapping[str, Any]], same_side: bool
) -> list[dict[str, Any]]:
    """Each graph of a probe's run beside the cold run's: its outcome, whether it loaded,
    lowered the same module and gave the same output."""
    graphs = []
    for warm in report["graphs"]:
        base = cold_graphs[warm["graph"]]
        outcome = _graph_outcome(base, warm, same_side)
        graphs.append(
            {
                "graph": warm["graph"],
                "outcome": outcome,
                "loaded": warm["hits"] > 0 and warm["compiles"] == 0,
                "same_module": warm["module"] == base["module"],
                "same_output": warm["output_sha256"] == base["output_sha256"],
            }
        )
    return graphs


def _probe_verdict(probe: Probe, graphs: list[dict[str, Any]]) -> tuple[str, list[str], list[str]]:
    """A finished probe's status from its graphs, with its reasons and notes."""
    reasons: list[str] = []
    notes: list[str] = []
    worst = [g for g in graphs if g["outcome"] == FAIL]
    split = [g for g in graphs if g["outcome"] == WARN]
    if probe.control:
        unloaded = [g["graph"] for g in graphs if not g["loaded"]]
        if unloaded:
            reasons.append(
                f"control (nothing changed): graph(s) {', '.join(unloaded)} did not load "
                "the cold run's executables: this cache does not load, so its key cannot "
                "be probed"
            )
            status = FAIL
        else:
            status = PASS
    elif worst:
        status = FAIL
        other_module = not all(g["same_module"] for g in worst)
        wanted = "lowered another module" if other_module else "compiles under other settings"
        reasons.append(
            f"{probe.name} ({probe.setting}): graph(s) {', '.join(g['graph'] for g in worst)} "
            f"loaded the cold run's executable although this process {wanted}: the cache "
            f"key misses {probe.name}, a wrong executable ran"
        )
    elif split:
        status = WARN
        notes.append(
            f"WARN {probe.name} ({probe.setting}): graph(s) "
            f"{', '.join(g['graph'] for g in split)} missed although module and compile "
            "settings equal the cold run's: a needless split (a restart with it recompiles)"
        )
    else:
        status = PASS
    return status, reasons, notes


# --- the run -----------------------------------------------------------------------------


def _control_loaded(done: Sequence[tuple[Probe, Mapping[str, Any] | None, str | None]]) -> bool:
    for probe, report, _ in done:
        if probe.control:
            graphs = (report or {}).get("graphs") or []
            return bool(graphs) and all(g["hits"] and not g["compiles"] for g in graphs)
    return True


def run_key_probe(
    target: Target,
    runs_dir: Path,
    scratch: Path,
    *,
    probes: Sequence[Probe],
    timeout_s: float = 600.0,
) -> CheckResult:
    """The cold run, then every probe on its own copy of the cold cache, in batches."""
    began = time.monotonic()
    runs = runs_dir / "key-probe"
    root = scratch / "key-probe"
    cold_cache = root / "cold"
    cold_cache.mkdir(parents=True)
    with log.section("key probe: cold"):
        cold_result = run_child(
            target.python,
            "cold",
            runs,
            [],
            runtime_env(target.device, cache_dir=cold_cache),
            timeout_s,
            script=CHILD,
        )
    cold = {**(cold_result.report or {}), "ok": cold_result.ok}
    if not cold_result.ok:
        cold["error"] = cold_result.failure()
    done: list[tuple[Probe, Mapping[str, Any] | None, str | None]] = []
    specs: list[tuple[int, ChildSpec]] = []
    for probe in probes:
        why_not = not_applicable(probe, target.device)
        if why_not is not None or not cold["ok"]:
            done.append((probe, None, why_not or "the cold run did not finish"))
            continue
        slug = "".join(c if c.isalnum() else "-" for c in probe.name.lower()).strip("-")
        copy = root / slug
        # Each probe loads from the cache as the cold run left it: what one probe writes
        # (a miss stores a new entry) must not decide another's outcome.
        shutil.copytree(cold_cache, copy)
        flag_file = None
        if probe.flag_file:
            flag_file = root / f"{slug}.flags"
            given = runtime_env(target.device).get("XLA_FLAGS", "").split()
            flag_file.write_text("\n".join([*given, *probe.flag_file]) + "\n")
        env = probe_env(runtime_env(target.device, cache_dir=copy), probe, flag_file)
        specs.append((len(done), ChildSpec(slug, probe_args(probe), env, script=CHILD)))
        done.append((probe, None, None))
    # The control alone first: on a cache that does not load (stock 2.9.0) nothing else
    # can be probed, and no other probe starts.
    batches = [specs[:1], *(specs[i : i + BATCH] for i in range(1, len(specs), BATCH))]
    for start, batch in enumerate(b for b in batches if b):
        if start and not _control_loaded(done):
            # A cache that does not load cannot be probed: the verdict is already FAIL,
            # and every further probe would only recompile.
            for slot, _ in batch:
                done[slot] = (done[slot][0], None, "not run: the control did not load")
            continue
        names = ", ".join(spec.name for _, spec in batch)
        with log.section(f"key probe: {names}"):
            finished = run_side_by_side(
                target.python, runs, [spec for _, spec in batch], timeout_s, device=target.device
            )
        for (slot, _), child in zip(batch, finished, strict=True):
            report = {**(child.report or {}), "ok": child.ok}
            if not child.ok:
                report["error"] = child.failure()
            done[slot] = (done[slot][0], report, None)
    result = judge_key_probe(cold, done)
    result.duration_s = time.monotonic() - began
    result.figures["check_s"] = round(result.duration_s, 3)
    result.runs = [
        {"name": "cold", "ok": cold["ok"], "graphs": cold.get("graphs")},
        *(
            {"name": probe.name, "ok": bool(report.get("ok")), "graphs": report.get("graphs")}
            for probe, report, _ in done
            if report is not None
        ),
    ]
    return result


# --- the docs' table -------------------------------------------------------------------------

TABLE_BEGIN = (
    "<!-- key-probe-table: begin (rendered from host/src/xla_host/gate/key_probes.toml) -->"
)
TABLE_END = "<!-- key-probe-table: end -->"


def docs_table(probes: Sequence[Probe]) -> str:
    """The probes as docs/gate.md shows them (a test keeps the page equal to this)."""
    lines = [
        "| probe | the change | devices | in `fast` | what it shows |",
        "|---|---|---|---|---|",
    ]
    for probe in probes:
        cells = [
            probe.name,
            f"`{probe.setting}`".replace("|", "\\|"),
            ", ".join(probe.devices) or "every",
            "yes" if probe.fast or probe.control else "",
            probe.why,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def with_docs_table(page: str, probes: Sequence[Probe]) -> str:
    """``page`` with the text between the table's markers rendered anew."""
    head, begin, rest = page.partition(TABLE_BEGIN)
    _, end, tail = rest.partition(TABLE_END)
    if not begin or not end:
        raise ValueError(f"the page has no {TABLE_BEGIN} ... {TABLE_END} markers")
    return head + begin + "\n" + docs_table(probes) + end + tail


def _judge(run: GateRun, names: tuple[str, ...]) -> list[CheckResult]:
    return [
        run_key_probe(
            run.target, run.runs_dir, run.scratch, probes=run.config.key_probes,
            timeout_s=run.timeout_s,
        )
    ]  # fmt: skip


#: As the gate's registry lists it (xla_host.gate.checks): its children are its own script.
CHECK = Declared(names=(NAME,), child_runs=(CHILD.name,), judge=_judge)
