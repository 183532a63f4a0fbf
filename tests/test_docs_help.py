"""The speaker and GPT-SoVITS trainers' --help answers: every flag that has a default shows it, and the
optimizer it names is the one the trainer builds."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Flags without a value to show: switches, and paths that are empty unless given.
NO_DEFAULT = {"-h", "--resume", "--init-from"}


@lru_cache(maxsize=None)
def _help(trainer: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, str(ROOT / "trainers" / f"train_{trainer}.py"), "--help"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _blocks(text: str) -> dict[str, str]:
    """Option -> its whole help text, from argparse's layout (an option line, then indented lines)."""
    out: dict[str, str] = {}
    opt = None
    for line in text.splitlines():
        m = re.match(r"  (-[-\w]+)", line)
        if m:
            opt = m.group(1)
            out[opt] = line
        elif opt and line.startswith("      "):
            out[opt] += " " + line.strip()
        else:
            opt = None
    return out


@pytest.mark.parametrize("trainer", ["eres2net", "campplus", "gpt_sovits"])
def test_every_flag_shows_its_default(trainer):
    blocks = _blocks(_help(trainer))
    assert "--max-steps" in blocks and "--lr" in blocks
    missing = [o for o, b in blocks.items() if o not in NO_DEFAULT and "default" not in b]
    assert not missing, f"train_{trainer}.py --help shows no default for {missing}"


@pytest.mark.parametrize("trainer", ["eres2net", "campplus"])
def test_speaker_help_names_the_optimizer_it_uses(trainer):
    blocks = _blocks(_help(trainer))
    assert "SGD" in blocks["--weight-decay"] and "AdamW" not in blocks["--weight-decay"]
    assert "SGD" in blocks["--lr"]
