"""The registry of lane kinds: ``backend = "<kind>"`` of build/lanes.toml -> its
:class:`~xla_wheels.release.lane_backend.LaneKind`.

A lane without ``backend`` is ``static`` when it has ``path`` and ``index`` when it has
``index-url`` (the form lanes.toml had before kinds had names; ``backend = "index"`` with
``path`` reads as ``static`` too).
"""

from __future__ import annotations

from collections.abc import Mapping

from xla_wheels.release import devpi, lane_index, lane_static
from xla_wheels.release.lane_backend import LaneKind

KINDS: dict[str, LaneKind] = {
    kind.name: kind for kind in (lane_static.KIND, lane_index.KIND, devpi.KIND)
}


def kind_of(table: Mapping[str, object]) -> str | None:
    """The kind a ``[lanes.<name>]`` table names, or None when it names none and its
    ``path``/``index-url`` do not tell (neither, or both)."""
    named = table.get("backend", "index")
    if named != "index":
        return str(named)
    if ("path" in table) == ("index-url" in table):
        return None
    return "static" if "path" in table else "index"
