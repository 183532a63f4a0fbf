"""What a newcomer reads first matches what the code does: the README's install and tokens lines, export.md's
NeMo line, f5tts.md's data folder naming, ns2.md's parameter counts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_readme_installs_the_debian_packages_through_the_makefile():
    install = README[README.index("## Install by hand"):]
    install = install[:install.index("```", install.index("```bash") + 7)]
    assert "make sysdeps" in install and "apt-get install " not in install.replace("`sudo apt-get install ...`", "")
    assert re.search(r"^sysdeps:", (ROOT / "Makefile").read_text(encoding="utf-8"), re.M)


def test_readme_calls_kmeans_tokens_what_the_command_calls_them():
    from audiopipe.tokens import kmeans

    line = next(x for x in README.splitlines() if "audiopipe tokens" in x and "--kmeans" in x)
    assert "k-means units, NOT GPT-SoVITS semantic tokens" in line
    assert "k-means units, NOT GPT-SoVITS semantic tokens" in Path(kmeans.__file__).read_text(encoding="utf-8")
    assert "semantic tokens for GPT-SoVITS" not in README


def test_export_md_nemo_line_has_the_keys_the_export_writes(f5_shards, tmp_path):
    import audiopipe as ap

    doc = (ROOT / "docs" / "export.md").read_text(encoding="utf-8")
    shown = json.loads(next(x for x in doc.splitlines() if x.startswith('{"audio_filepath"')))
    ap.export_nemo(f5_shards, tmp_path / "nemo", audio="source")
    written = json.loads((tmp_path / "nemo" / "manifest.json").read_text(encoding="utf-8").splitlines()[0])
    assert set(shown) == set(written)


def test_f5tts_md_names_the_folder_f5_loads():
    doc = (ROOT / "docs" / "trainers" / "f5tts.md").read_text(encoding="utf-8")
    assert "`data/<name>_<tokenizer>`" in doc and "`data/<name>_custom`" in doc
    # the rule as F5-TTS states it, when its source is installed (the upstream venv)
    up = Path("/work/main/.upstream-venv")
    src = next(up.glob("lib/python*/site-packages/f5_tts/model/dataset.py"), None) if up.is_dir() else None
    if src is not None:
        assert 'data/{dataset_name}_{tokenizer}' in src.read_text(encoding="utf-8")


@pytest.mark.parametrize("config", ["tiny", "small"])
def test_ns2_md_gives_the_parameter_counts_of_the_models(config):
    import train_ns2
    from core import count_parameters

    doc = (ROOT / "docs" / "trainers" / "ns2.md").read_text(encoding="utf-8")
    m = re.search(rf"`(?:--config )?{config}` \(([\d.]+) M", doc)
    counted = count_parameters(train_ns2.NaturalSpeech2(train_ns2.CONFIGS[config])) / 1e6
    assert m and float(m.group(1)) == round(counted, 2), (m and m.group(0), counted)
