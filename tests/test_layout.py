"""Import rules of the package that an upgrade or a refactor could silently break.

- webdataset is used through its public names only (its submodules are internal and move between releases);
- the library's commands import their heavy baselines (lhotse, datasets) only when they run;
- the modules form layers: no import cycle between any of them, inside a folder or across folders, and none
  between the folders (README.md's flow); features know nothing of Ray or storage, and the library never
  imports the trainers;
- every folder's __init__.py says what the folder does and, in a paragraph that starts `May import:`, which
  other parts of audiopipe its modules may import (named in backticks: `audiopipe.storage` allows that folder
  and its modules); they import nothing else of audiopipe. Every folder may import `audiopipe.errors`, the base
  of the errors audiopipe raises on purpose.

What counts as an import (an edge of the module graph), wherever it stands: at module level, in a function or
a class, under `if` or `try`:
- `import audiopipe.x.y`, `from audiopipe.x import y`, and the relative forms (`from . import y`, `from .y import
  z`, `from .. import w`) are an edge to the module they name; `from P import n` goes to P.n when that is a
  module, else to P. Python runs a package's __init__ before its modules: that implicit step is no edge (a
  package that imports its own modules is no cycle); an import that names the package is one.
- A string constant that is the dotted name of an audiopipe module, alone or as "module:function", is an edge
  to it: `importlib.import_module("audiopipe.x.y")`, the subcommand table of audiopipe/cli.py (PLUGGED), the
  converter registry of audiopipe/checkpoints/cli.py (MODELS). An f-string whose text starts with
  "audiopipe.x." names every module of audiopipe.x (as corpus/layouts/__init__.py picks its layouts).
- A function-level import of an audiopipe module is an edge like any other: a cycle hidden in a function is
  still a cycle. An import of another package is never an edge: it cannot close a cycle in audiopipe, and
  importing a heavy optional package (torch, ray, lhotse, datasets, transformers, matplotlib) inside the
  function that needs it is how commands stay quick to start, so it is allowed anywhere.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import types
from collections import defaultdict, deque
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Collection, Iterable

import webdataset

import audiopipe

PACKAGE = Path(audiopipe.__file__).parent


def _webdataset_uses(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for every webdataset module or name the code reaches, however it is imported; `what` is a
    module path ("webdataset.tariterators") or a name taken from the package ("webdataset:gopen")."""
    aliases = {"webdataset"}
    uses: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "webdataset":
                    uses.append((node.lineno, a.name))
                    if a.name == "webdataset":
                        aliases.add(a.asname or a.name)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "webdataset":
            uses.append((node.lineno, node.module))
            if node.module == "webdataset":
                uses += [(node.lineno, f"webdataset:{a.name}") for a in node.names]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and node.args[0].value.split(".")[0] == "webdataset":
            uses.append((node.lineno, node.args[0].value))  # importlib.import_module("webdataset.x"), __import__
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            uses.append((node.lineno, f"webdataset:{node.attr}"))
    return uses


def _is_public(what: str) -> bool:
    """The package itself, or a name it exports that is not a module: its submodules (tariterators, gopen the
    module, ...) are implementation files."""
    if what == "webdataset":
        return True
    package, colon, name = what.partition(":")
    obj = getattr(webdataset, name, None) if colon else None
    return obj is not None and not isinstance(obj, types.ModuleType)


def test_the_rule_catches_every_way_to_reach_a_private_module():
    code = """
import webdataset.tariterators
from webdataset.tariterators import group_by_keys
from webdataset import tariterators
import importlib
gopen = importlib.import_module("webdataset.gopen").gopen
import webdataset as wds
wds.tariterators.tar_file_expander
"""
    bad = sorted((line, name) for line, name in _webdataset_uses(ast.parse(code)) if not _is_public(name))
    assert bad == [(2, "webdataset.tariterators"), (3, "webdataset.tariterators"), (4, "webdataset:tariterators"),
                   (6, "webdataset.gopen"), (8, "webdataset:tariterators")]
    ok = "import webdataset\nwebdataset.gopen('x')\nfrom webdataset import TarWriter\n"
    assert [n for _, n in _webdataset_uses(ast.parse(ok)) if not _is_public(n)] == []


def test_audiopipe_uses_only_public_webdataset_names():
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for line, name in _webdataset_uses(ast.parse(path.read_text(), str(path))):
            if not _is_public(name):
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{line} uses {name}")
    assert bad == [], "webdataset internals (use its public names or plain tarfile):\n" + "\n".join(bad)


def test_commands_do_not_import_their_heavy_baselines_until_run():
    probe = """
import sys
import audiopipe.bench, audiopipe.bench.loader_bench, audiopipe.bench.loaders, audiopipe.reader.wds
from audiopipe.cli import main
for argv in (["--help"], ["bench-loader", "--help"]):
    try:
        main(argv)
    except SystemExit:
        pass
print("LOADED", sorted({m.split(".")[0] for m in sys.modules} & {"lhotse", "datasets"}))
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "LOADED []"


def _imports(path: Path) -> set[str]:
    """Every absolute module name a file imports, at its top or inside a function (a lazy import is still a
    dependency): for the rules about other packages (ray, trainers)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: dict[str, Path] = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
ERRORS = "audiopipe.errors"  # every folder may import it


@dataclass(frozen=True)
class Edge:
    source: str  # the importing module
    target: str  # the imported module
    line: int
    lazy: bool  # inside a function


def _edges(name: str, code: str, is_package: bool, modules: Collection[str]) -> list[Edge]:
    """Every import of an audiopipe module (one of `modules`) by module `name`, by the rules at the top."""
    package = name if is_package else name.rpartition(".")[0]
    found: list[Edge] = []

    def add(target: str, node: ast.AST, lazy: bool) -> None:
        if target in modules and target != name:
            found.append(Edge(name, target, node.lineno, lazy))

    def visit(node: ast.AST, lazy: bool) -> None:
        if isinstance(node, ast.Import):
            for a in node.names:
                add(a.name, node, lazy)
        elif isinstance(node, ast.ImportFrom):
            origin = node.module or ""
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            for a in node.names:
                sub = f"{origin}.{a.name}"
                add(sub if sub in modules else origin, node, lazy)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "." in node.value:
            add(node.value.partition(":")[0], node, lazy)
        elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            prefix = str(node.values[0].value)
            if prefix.startswith("audiopipe.") and prefix.endswith("."):
                for target in sorted(m for m in modules if m.startswith(prefix)):
                    add(target, node, lazy)
        inner = lazy or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(ast.parse(code), False)
    return found


@cache
def _module_graph() -> dict[str, dict[str, Edge]]:
    """module -> {imported module: its first import (a top-level one when there is one)}."""
    graph: dict[str, dict[str, Edge]] = {m: {} for m in MODULES}
    for name, path in MODULES.items():
        for e in _edges(name, path.read_text(), path.name == "__init__.py", MODULES):
            if e.target not in graph[name] or graph[name][e.target].lazy and not e.lazy:
                graph[name][e.target] = e
    return graph


def _cycles(graph: dict[str, Iterable[str]]) -> list[list[list[str]]]:
    """The import cycles of `graph`, one list per strongly connected group of nodes: for each node of the group
    the shortest cycle through it ([a, b, a]), each cycle once. [] when there is none."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1 or v in graph.get(v, ()):
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    found = []
    for group in sorted(groups):
        members, cycles, seen = set(group), [], set()
        for start in group:
            came_from: dict[str, str] = {}
            todo = deque([start])
            while todo and start not in came_from:  # breadth first: the shortest way back to start
                v = todo.popleft()
                for w in sorted(graph.get(v, ())):
                    if w in members and w not in came_from:
                        came_from[w] = v
                        todo.append(w)
            path = [start]
            while path[-1] != start or len(path) == 1:
                path.append(came_from[path[-1]])
            cycle = path[::-1]
            if frozenset(cycle) not in seen:
                seen.add(frozenset(cycle))
                cycles.append(cycle)
        found.append(cycles)
    return found


def _where(e: Edge) -> str:
    return f"{MODULES[e.source].relative_to(PACKAGE.parent)}:{e.line}{', in a function' if e.lazy else ''}"


def _folder(module: str) -> str:
    """The folder of audiopipe/ a module belongs to ("cli" for audiopipe/cli.py; "" for audiopipe itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_the_import_rules_see_every_way_to_import():
    modules = {"audiopipe", "audiopipe.a", "audiopipe.a.b", "audiopipe.a.c", "audiopipe.a.p", "audiopipe.a.p.q",
               "audiopipe.d", "audiopipe.d.e"}
    code = """
import torch
from . import c
from .c import thing
from .. import d
from ..d.e import f
import audiopipe.d.e
from audiopipe.a import p
from audiopipe.a.p import q


def later():
    import ray
    from audiopipe.d import e
    importlib.import_module("audiopipe.a.c")


TABLE = {"cmd": ("audiopipe.a.p.q", "help"), "conv": "audiopipe.d:fn", "name": "audiopipe", "x": "audiopipe.zz"}


class K:
    from audiopipe import a


def pick(name):
    return importlib.import_module(f"audiopipe.a.p.{name}")
"""
    got = [(e.target, e.line, e.lazy) for e in _edges("audiopipe.a.b", code, False, modules)]
    assert got == [("audiopipe.a.c", 3, False), ("audiopipe.a.c", 4, False), ("audiopipe.d", 5, False),
                   ("audiopipe.d.e", 6, False), ("audiopipe.d.e", 7, False), ("audiopipe.a.p", 8, False),
                   ("audiopipe.a.p.q", 9, False), ("audiopipe.d.e", 14, True), ("audiopipe.a.c", 15, True),
                   ("audiopipe.a.p.q", 18, False), ("audiopipe.d", 18, False), ("audiopipe.a", 22, False),
                   ("audiopipe.a.p.q", 26, True)]
    # In a package's __init__, `.` is the package itself.
    got = [e.target for e in _edges("audiopipe.a.p", "from . import q\nfrom .. import c\n", True, modules)]
    assert got == ["audiopipe.a.p.q", "audiopipe.a.c"]


def test_the_cycle_check_finds_every_cycle_and_names_its_modules():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [[["a", "b", "c", "a"]]]
    assert _cycles({"a": {"b"}, "b": {"a", "c"}, "c": {"b"}, "d": {"a"}}) == [[["a", "b", "a"], ["c", "b", "c"]]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "x": {"y"}, "y": {"x"}}) == [[["x", "y", "x"]]]
    assert _cycles({"a": {"b"}, "b": {"c"}}) == []


def test_modules_import_each_other_without_cycles():
    graph = _module_graph()
    shown = []
    for cycles in _cycles({m: set(t) for m, t in graph.items()}):
        members = sorted({m for c in cycles for m in c})
        shown.append(f"import cycle among {', '.join(members)}:")
        for cycle in cycles:
            shown.append("  " + " -> ".join(cycle))
            shown += [f"      {a} -> {b} ({_where(graph[a][b])})" for a, b in zip(cycle, cycle[1:])]
    assert not shown, "\n" + "\n".join(shown)


def test_folders_import_each_other_without_cycles():
    # audiopipe/__init__.py is the package's front door, not a layer: it is left out here (its cycles are the
    # module check's).
    folders: dict[str, set[str]] = defaultdict(set)
    for name, targets in _module_graph().items():
        for target in targets:
            if _folder(name) and _folder(target) and _folder(name) != _folder(target):
                folders[_folder(name)].add(_folder(target))
    assert _cycles(folders) == [], dict(folders)


def _declared(package: str) -> tuple[str, list[str]] | None:
    """(what the folder does, the modules it may import) from its __init__.py's docstring; None without one."""
    doc = ast.get_docstring(ast.parse(MODULES[package].read_text())) or ""
    paragraphs = [p.strip() for p in doc.split("\n\n")]
    allowed = [p for p in paragraphs if p.startswith("May import:")]
    if not allowed or not paragraphs[0] or paragraphs[0].startswith("May import:"):
        return None
    return paragraphs[0], re.findall(r"`(audiopipe(?:\.\w+)*)`", allowed[0])


# Folders whose __init__.py does not say yet what the folder does and what it may import. Each is written by
# whoever works in that folder; the list only shrinks (a folder that declares and is still listed fails).
UNDECLARED: set[str] = set()


def _packages() -> list[str]:
    return [m for m, p in MODULES.items() if p.name == "__init__.py" and m != "audiopipe"]


def _allows(declared: list[str], target: str) -> bool:
    # `audiopipe` alone allows the package's own __init__ (its version), not everything under it.
    return target == ERRORS or any(target == d or d != "audiopipe" and target.startswith(d + ".") for d in declared)


def test_every_folder_says_what_it_does_and_what_it_may_import():
    missing = [str(MODULES[p].relative_to(PACKAGE.parent)) for p in _packages()
               if _declared(p) is None and p not in UNDECLARED]
    assert missing == [], f"no docstring saying what the folder does, with a 'May import:' paragraph: {missing}"
    stale = sorted(p for p in UNDECLARED if p not in MODULES or _declared(p) is not None)
    assert stale == [], f"declared (or gone) now: remove them from UNDECLARED: {stale}"
    unknown = {p: [d for d in _declared(p)[1] if d not in MODULES] for p in _packages() if p not in UNDECLARED}
    assert {p: d for p, d in unknown.items() if d} == {}, "'May import:' names modules that do not exist"


def test_folders_import_only_what_their_docstring_allows():
    graph = _module_graph()
    bad = []
    for package in _packages():
        if package in UNDECLARED:
            continue
        declared = _declared(package)
        assert declared is not None, package
        for name, targets in graph.items():
            if name != package and not name.startswith(package + "."):
                continue
            for target, edge in sorted(targets.items()):
                inside = target == package or target.startswith(package + ".")
                if not inside and not _allows(declared[1], target):
                    bad.append(f"{_where(edge)} imports {target}, which "
                               f"{MODULES[package].relative_to(PACKAGE.parent)} does not allow")
    assert bad == [], "\n" + "\n".join(bad)


def test_features_know_nothing_of_ray_storage_or_readers_and_nobody_imports_trainers():
    bad = []
    for path in PACKAGE.rglob("*.py"):
        names = _imports(path)
        where = path.relative_to(PACKAGE.parent)
        bad += [f"{where} imports {n}" for n in names if n.split(".")[0] == "trainers"]
        if _folder(_module_name(path)) == "features":
            bad += [f"{where} imports {n}" for n in names if n.split(".")[0] == "ray"]
    # The folder's own docstring must not allow what the rule forbids.
    allowed = _declared("audiopipe.features")[1] if _declared("audiopipe.features") else []
    bad += [f"audiopipe/features/__init__.py allows {d}" for d in allowed
            if d.split(".")[:2] in (["audiopipe", "shard"], ["audiopipe", "storage"], ["audiopipe", "reader"],
                                    ["audiopipe", "index"])]
    assert bad == []
