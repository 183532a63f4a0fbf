# Two entry points for a fresh machine; both build the virtual environment when it is missing.
#   make demo   the whole pipe on a small corpus of real speech: shard, verify, inspect, bench-loader,
#               and 20 F5-TTS steps on 2 CPU ranks (a few minutes; README.md says how long)
#   make test   run the test suite (what .ci/run calls)
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
# The CPU wheel of torch must go in first: any looser torch requirement resolved by pip pulls a multi-GB CUDA build.
TORCH   ?= torch==2.13.0
# Two test processes, one test file each (module fixtures stay in one process): most of the suite waits on
# subprocesses (torchrun ranks, Ray, S3 servers), so two overlap well even on a 2-core machine.
# `make test PYTEST_ARGS=` runs it in one process.
PYTEST_ARGS ?= -n 2 --dist loadfile
# The Debian packages the tests, the demo and gpu-bundle read: one list, sysdeps.txt (the tests read it too).
DEBS    := $(shell sed 's/\#.*//' sysdeps.txt)

.PHONY: demo test sysdeps venv upstream bench clean-demo gpu-bundle

# librosa (the tests' reference for the mel) compiles its numba kernels on first import, ~16 s of CPU, and caches
# them in the venv: the last step compiles them once, as pip compiles .pyc files, rather than in the first test run.
$(BIN)/.ok: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip "setuptools<82" wheel
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[dev]"
	$(BIN)/python -c "import librosa.util.utils"
	touch $@

venv: $(BIN)/.ok

# The upstream projects' own model code (F5-TTS, 3D-Speaker, GPT-SoVITS, vocos, EnCodec) in a side venv: the
# checkpoint tests build upstream's model there, write its checkpoint with its own code, and read ours back with
# its own loader (tests/upstream/). Kept apart because upstream pins clash with ours; ~3 min, 2.2 GB, once.
UPSTREAM := .upstream-venv
$(UPSTREAM)/.ok: tests/upstream/venv.sh
	rm -rf $(UPSTREAM)
	V=$(abspath $(UPSTREAM)) TMPDIR=$(abspath $(UPSTREAM)).tmp bash -c 'mkdir -p "$$TMPDIR" && bash tests/upstream/venv.sh' >/dev/null
	touch $@

upstream: $(UPSTREAM)/.ok

# Real speech for the demo, the tests and the GPU bundle comes from Debian packages (asterisk prompts, espeak-ng
# voices): sysdeps.txt lists them.
sysdeps:
	@missing=$$(for p in $(DEBS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q ' installed$$' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-remove $$missing >/dev/null; \
	  else echo "please install: sudo apt-get install $$missing" >&2; exit 1; fi; fi

# The demo budget (9,600 padded frames, ~100 s of audio) gives the 0.37 h corpus enough batches per epoch for
# bucketing to show; the trainer prints its data-wait and padding share every 5 steps. F5's own schedule (20,000
# warm-up updates at 7.5e-5) would leave 20 steps at a learning rate near 0: a short warm-up and a rate fit for the
# tiny model let the loss visibly fall.
DEMO_FRAMES := 9600

demo: sysdeps venv
	$(BIN)/python -m audiopipe.corpus.demo demo/wavs
	$(BIN)/audiopipe shard --corpus demo/wavs --out demo/shards --preset f5tts,eres2net
	$(BIN)/audiopipe verify demo/shards
	$(BIN)/audiopipe inspect demo/shards
	$(BIN)/audiopipe bench-loader --shards demo/shards --workers 0 --seconds 2 --batch-frames $(DEMO_FRAMES) \
	  --loaders mmap,wds,npy_per_utt,on_the_fly --cache demo/bench-cache \
	  --json demo/bench-loader.json --plot demo/bench-loader.png
	rm -rf demo/run
	$(BIN)/torchrun --nproc_per_node=2 trainers/train_f5tts.py --shards demo/shards --config tiny \
	  --out demo/run --max-steps 20 --log-every 5 --batch-frames $(DEMO_FRAMES) --warmup-steps 5 --lr 1e-3
	@echo "demo done: demo/shards (durations.png), demo/bench-loader.png, demo/run/log.jsonl"

# Here nothing the suite reads may be missing: the checkpoint tests fail rather than skip without the upstream venv,
# the speech tests without a package of sysdeps.txt (AUDIOPIPE_SYSDEPS), and the run fails on any skip but the
# allowed ones (tests/skips.py: CUDA tests, the opt-in oracles). It ends with the skip count and reasons, and the
# 30 slowest test phases (--durations), so that every CI run says where the suite's time goes. First, audiopipe's
# numba kernels are compiled once into their cache (tests/compile_kernels.py, ~12 s on a fresh checkout, ~3 s
# after): otherwise the two workers and their first subprocesses each compile the same kernels at once.
test: sysdeps venv upstream
	$(BIN)/python tests/compile_kernels.py
	AUDIOPIPE_UPSTREAM_PYTHON=$(abspath $(UPSTREAM))/bin/python AUDIOPIPE_SYSDEPS=installed \
	  $(BIN)/python -m pytest -q --durations=30 $(PYTEST_ARGS)

bench: venv
	$(BIN)/python benchmarks/bench_features.py --json bench_features.json  # docs/features.md#speed-and-f0-accuracy

clean-demo:
	rm -rf demo

# What benchmarks/gpu_proof.py needs on a GPU machine, in one folder that travels with the repository
# (docs/gpu-proof.md gives the exact device call): real-speech shards for every trainer, the audio F5's own loading
# rule decodes, and cp312 wheels of soundfile/soxr. Rebuilt whole (~5 min on 2 cores).
gpu-bundle: sysdeps venv
	rm -rf .gpu-bundle
	RAY_AUTH_MODE=disabled $(BIN)/python benchmarks/gpu_bundle.py --out .gpu-bundle
