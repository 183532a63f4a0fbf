"""Import rules of the package that an upgrade or a refactor could silently break.

- webdataset is used through its public names only (its submodules are internal and move between releases);
- the library's commands import their heavy baselines (lhotse, datasets) only when they run;
- the folders form layers (README.md's flow): no import cycle between them, features know nothing of Ray or
  storage, and the library never imports the trainers.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import types
from collections import defaultdict
from pathlib import Path

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
    """Every module a file imports, at its top or inside a function (a lazy import is still a dependency)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def _folder(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0].removesuffix(".py")


def _package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] == "audiopipe" and len(parts) > 1 and parts[1] != _folder(path):
                graph[_folder(path)].add(parts[1])
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the current path, 2 done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path + [node, nxt]
            if nxt not in state and (found := visit(nxt, path + [node])):
                return found
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node, [])):
            return found
    return None


def test_the_cycle_check_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}}) is None


def test_folders_import_each_other_without_cycles():
    assert _cycle(_package_graph()) is None, _package_graph()


def test_features_know_nothing_of_ray_storage_or_readers_and_nobody_imports_trainers():
    bad = []
    for path in PACKAGE.rglob("*.py"):
        names = _imports(path)
        where = path.relative_to(PACKAGE.parent)
        bad += [f"{where} imports {n}" for n in names if n.split(".")[0] == "trainers"]
        if _folder(path) == "features":
            bad += [f"{where} imports {n}" for n in names
                    if n.split(".")[0] == "ray" or n.split(".")[:2] in (["audiopipe", "shard"], ["audiopipe", "storage"],
                                                                        ["audiopipe", "reader"], ["audiopipe", "index"])]
    assert bad == []
