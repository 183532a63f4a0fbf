"""The speaker and GPT-SoVITS trainers' --help answers: every flag that has a default shows it, and the
optimizer it names is the one the trainer builds."""

from __future__ import annotations

import contextlib
import importlib
import io
import re
from functools import lru_cache

import pytest

# Flags without a value to show: switches, and paths that are empty unless given.
NO_DEFAULT = {"-h", "--resume", "--init-from"}


@lru_cache(maxsize=None)
def _help(trainer: str) -> str:
    """What `python trainers/train_<trainer>.py --help` prints: the trainer's own main, in this process (the
    trainers are on pytest's pythonpath; a subprocess per trainer would import torch again for a page of text)."""
    main = importlib.import_module(f"train_{trainer}").main
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    return out.getvalue()


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
