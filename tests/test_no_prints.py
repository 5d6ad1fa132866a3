"""Library modules never print: what they say goes through ``xla_host.log`` (``info`` and
``warning`` to stderr, ``result`` for a command's product on stdout), which the edges
(the command lines, the entry points of processes of their own) own.

Read from the source (an AST scan), so a new ``print(`` in a library module fails here
before anyone sees its output interleaved with a plan or a verdict.
"""

from __future__ import annotations

import ast

from tests.gitrepos import REPO_ROOT

PACKAGES = (REPO_ROOT / "src" / "xla_wheels", REPO_ROOT / "host" / "src" / "xla_host")

#: The edges, which may print, each with why it is one.
EDGES: dict[str, str] = {
    "xla_wheels/cli/": "the builder's command line: its subcommands' output",
    "xla_wheels/demo.py": "python -m xla_wheels.demo, a command of its own",
    "xla_wheels/builder/run_recipe.py": "the recipe runner, a process of its own (in the image)",
    "xla_host/cli.py": "the host's command line",
    "xla_host/edge.py": "the one CLI edge both command lines end in (errors, exit codes)",
    "xla_host/log.py": "the logger itself",
    "xla_host/cache_command.py": "the `cache` subcommand of both command lines",
    "xla_host/gate/arguments.py": "the gate subcommand of both command lines (its verdicts)",
    "xla_host/host_commands.py": "gate, doctor and launch-env of both command lines (reports)",
    "xla_host/xla_launch_profile.py": "the launch helper a launcher runs, a process of its own",
    "xla_host/entrypoint.py": "the runtime image's entry point, a process of its own",
    "xla_host/installed_metadata.py": "a script run in the interpreter under test",
}


def _is_edge(relative: str) -> bool:
    return any(relative == edge or relative.startswith(edge) for edge in EDGES)


def printing_calls(source: str) -> list[int]:
    """The lines of ``source`` that call ``print`` or write to ``sys.stdout``/``sys.stderr``
    (code only: a ``print(`` inside a string, a child's script, is no call)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        function = node.func
        prints = isinstance(function, ast.Name) and function.id == "print"
        writes = (
            isinstance(function, ast.Attribute)
            and function.attr in ("write", "writelines")
            and isinstance(function.value, ast.Attribute)
            and function.value.attr in ("stdout", "stderr")
            and isinstance(function.value.value, ast.Name)
            and function.value.value.id == "sys"
        )
        if prints or writes:
            lines.append(node.lineno)
    return lines


def library_printers() -> dict[str, list[int]]:
    found = {}
    for package in PACKAGES:
        for path in sorted(package.rglob("*.py")):
            relative = path.relative_to(package.parent).as_posix()
            if not _is_edge(relative) and (lines := printing_calls(path.read_text())):
                found[relative] = lines
    return found


def test_no_library_module_prints() -> None:
    printers = library_printers()
    assert not printers, (
        f"library modules that print: {printers}; say it with xla_host.log (info, warning, "
        "result), or, for a new command line or process entry point, add it to EDGES"
    )


def test_every_edge_exists() -> None:
    # An edge renamed or removed must leave the list, or the list grows stale.
    for edge in EDGES:
        assert any((package.parent / edge).exists() for package in PACKAGES), edge


def test_the_scan_finds_a_print_and_a_stream_write_but_no_string() -> None:
    source = (
        "import sys\n"
        "SCRIPT = 'print(1)'\n"
        "def f():\n"
        "    print('x')\n"
        "    sys.stderr.write('y')\n"
        "    log.info('z')\n"
    )
    assert printing_calls(source) == [4, 5]
