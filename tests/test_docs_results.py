"""Every benchmarks/results/ file the docs cite exists, and every results file is cited in README.md or docs/.

A results file nobody cites is a superseded run (git keeps history); a cited one that is missing leaves a
figure in the docs without its evidence.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
CITE = re.compile(r"benchmarks/results/([\w.{},\[\]\-]+\.json)")
NAMED = re.compile(r"([\w{},\[\]\-]+\.json)")  # a bare file name next to a command that writes it


def _expand(name: str) -> list[str]:
    """Shell brace expansion, as the docs write `bench_loader_{short,big}_w0.json`; `[x]` is an optional part."""
    name = re.sub(r"\[([^\[\]]*)\]", r"{,\1}", name)
    parts = re.split(r"(\{[^{}]*\})", name)
    choices = [p[1:-1].split(",") if p.startswith("{") else [p] for p in parts]
    return ["".join(c) for c in itertools.product(*choices)]


def _cited(paths: list[Path], pattern: re.Pattern = CITE) -> dict[str, str]:
    out: dict[str, str] = {}
    for p in paths:
        text = p.read_text(encoding="utf-8")
        for line in text.splitlines():
            if "git show" in line:  # a figure quoted from an older commit, cited by its commit
                continue
            for m in pattern.finditer(line):
                for name in _expand(m.group(1)):
                    out.setdefault(name, str(p.relative_to(ROOT)))
    return out


def _docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_expand_braces():
    assert _expand("a_{x,y}_w0{,_before}.json") == [
        "a_x_w0.json", "a_x_w0_before.json", "a_y_w0.json", "a_y_w0_before.json"]
    assert _expand("f5tts_choices[_seed7].json") == ["f5tts_choices.json", "f5tts_choices_seed7.json"]


def test_every_results_file_the_docs_cite_exists():
    missing = {n: where for n, where in _cited(_docs()).items() if not (RESULTS / n).is_file()}
    assert not missing, f"docs cite results files that do not exist: {missing}"


def test_every_results_file_is_cited():
    # A benchmark script naming its own output is no citation: a figure the docs do not show is a superseded run.
    cited = _cited(_docs(), NAMED)
    orphans = sorted(p.name for p in RESULTS.glob("*.json") if p.name not in cited)
    assert not orphans, f"results files that README.md and docs/ do not name (superseded: git rm them): {orphans}"
