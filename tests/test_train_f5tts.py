"""trainers/train_f5tts.py: tokenizer, DiT shapes and size, padding invariance, the infill span and CFG drops,
the flow-matching loss, refusal of other mel configs, training from S3, --shapes."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch

import train_f5tts as f5
from shard_helpers import shard

pytest_plugins = ["s3server"]


def _model(seed: int = 0, cfg: f5.ModelConfig | None = None) -> f5.F5TTS:
    """A tiny model whose zero-initialised layers (adaLN-zero, output) get random weights, so every input matters."""
    torch.manual_seed(seed)
    m = f5.F5TTS(cfg or f5.CONFIGS["tiny"])
    with torch.no_grad():
        for p in m.parameters():
            if not p.any():
                p.normal_(0, 0.2)
    return m


def _loss(m: f5.F5TTS, mel: torch.Tensor, lens: torch.Tensor, text: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """The training loss through loss_fn, as core.train calls it (mel [B, T, 100] as the batch's transpose)."""
    return f5.loss_fn(m, {"mel": mel.transpose(1, 2), "mel_lengths": lens, "text_ids": text})


def _inputs(lens: list[int], texts: list[str], seed: int = 1, pad_value: float = 0.0):
    g = torch.Generator().manual_seed(seed)
    n = max(lens)
    mel = torch.randn(len(lens), n, 100, generator=g) * 2 - 5
    for i, t in enumerate(lens):
        mel[i, t:] = pad_value
    return mel, torch.tensor(lens), f5.Tokenizer().batch(texts)


# ----------------------------------------------------------------------------- text

def test_byte_tokenizer_and_f5_vocab(tmp_path):
    tok = f5.Tokenizer()
    ids = tok.batch(["hé!", "", "ab"])
    assert tok.size == 256 and ids.dtype == torch.long
    assert ids.tolist() == [[104, 195, 169, 33], [-1, -1, -1, -1], [97, 98, -1, -1]]  # UTF-8 bytes, -1 padded
    (tmp_path / "vocab.txt").write_text(" \n!\na\nb\n", encoding="utf-8")  # export-f5's layout
    v = f5.Tokenizer.from_file(tmp_path / "vocab.txt")
    assert v.size == 4 and v.batch(["ab a!", "zz"]).tolist() == [[2, 3, 0, 2, 1], [0, 0, -1, -1, -1]]
    batch = f5.AddTextIds(v)({"text": ["a", "bb"]})
    assert batch["text_ids"].tolist() == [[2, -1], [3, 3]]


# ----------------------------------------------------------------------------- model

def test_shapes_and_reference_size():
    m = _model()
    mel, lens, text = _inputs([30, 22], ["hello there", "hi"])
    out = m.transformer(mel, mel, text, torch.rand(2), lens)
    assert out.shape == (2, 30, 100)
    loss, logs = _loss(m, mel, lens, text)
    assert loss.dim() == 0 and torch.isfinite(loss) and set(logs) == {"drop_audio", "drop_text", "span_frac"}
    with torch.device("meta"):
        base = f5.F5TTS(f5.CONFIGS["default"])
    n = f5.count_parameters(base)
    assert 334e6 < n < 338e6, n  # F5-TTS Base is ~336 M (its pinyin vocabulary adds ~1.2 M of embedding)
    assert base.cfg.dim == 1024 and len(base.transformer.blocks) == 22 and base.cfg.heads == 16
    assert len(base.transformer.text_embed.blocks) == 4 and base.cfg.text_dim == 512 and base.cfg.ff_mult == 2


def test_fresh_model_starts_from_adaln_zero():
    m = f5.F5TTS(f5.CONFIGS["tiny"])
    mel, lens, text = _inputs([20, 12], ["a", "b"])
    out = m.transformer(mel, mel, text, torch.rand(2), lens)
    assert torch.equal(out, torch.zeros_like(out))  # zero gates and zero output layer, as F5 initialises


def test_padding_does_not_change_real_frames():
    m = _model().eval()
    lens, texts = [37, 20, 9], ["a longer sentence here", "short one", "x"]
    mel, lens_t, text = _inputs(lens, texts, pad_value=123.0)  # garbage in the padding
    t = torch.tensor([0.1, 0.5, 0.9])
    with torch.no_grad():
        batch = m.transformer(mel, mel * 0.5, text, t, lens_t)
        for i, n in enumerate(lens):
            ids = f5.Tokenizer().batch([texts[i]])
            alone = m.transformer(mel[i:i + 1, :n], mel[i:i + 1, :n] * 0.5, ids, t[i:i + 1], lens_t[i:i + 1])
            torch.testing.assert_close(batch[i, :n], alone[0], atol=2e-5, rtol=1e-5)


def test_padded_frames_do_not_affect_the_loss():
    m = _model()
    mel_a, lens, text = _inputs([40, 25, 11], ["one", "two", "three"], pad_value=0.0)
    mel_b = mel_a.clone()
    for i, n in enumerate(lens.tolist()):
        mel_b[i, n:] = torch.randn(mel_b.shape[1] - n, 100) * 50
    mel_b.requires_grad_(True)
    torch.manual_seed(5)
    random.seed(5)
    loss_a, _ = _loss(m, mel_a, lens, text)
    torch.manual_seed(5)
    random.seed(5)
    loss_b, _ = _loss(m, mel_b, lens, text)
    assert torch.equal(loss_a, loss_b)
    loss_b.backward()
    pad = ~f5.lengths_to_mask(lens, mel_b.shape[1])
    assert torch.count_nonzero(mel_b.grad[pad]) == 0 and torch.count_nonzero(mel_b.grad[~pad]) > 0


# ----------------------------------------------------------------------------- span, drops, loss

def test_span_is_one_contiguous_70_to_100_percent_run_inside_each_utterance():
    torch.manual_seed(0)
    lens = torch.randint(5, 400, (2000,))
    span = f5.random_span_mask(lens, (0.7, 1.0), int(lens.max()))
    count = span.sum(1)
    assert (count >= torch.floor(0.7 * lens)).all() and (count <= lens).all()
    first = span.float().argmax(1)
    assert (first + count <= lens).all()  # ends inside the utterance
    idx = torch.arange(span.shape[1])[None]
    assert torch.equal(span, (idx >= first[:, None]) & (idx < (first + count)[:, None]))  # one run
    frac = (count / lens).numpy()
    assert abs(frac.mean() - 0.85) < 0.01 and frac.min() < 0.72 and frac.max() > 0.97
    starts = (first.float() / (lens - count).clamp(min=1)).numpy()[(lens - count).numpy() > 20]
    assert 0.4 < starts.mean() < 0.6  # the span starts anywhere, not always at 0


def test_cfg_drop_rates():
    random.seed(0)  # drawn from Python's random, in F5's order (test_checkpoint_f5tts checks the loss against F5's)
    draws = np.array([f5.draw_drops(0.3, 0.2) for _ in range(20000)])
    audio, text = draws[:, 0], draws[:, 1]
    assert abs(text.mean() - 0.2) < 0.015
    assert abs(audio.mean() - (1 - 0.7 * 0.8)) < 0.015  # audio alone 0.3, or together with the text 0.2
    assert audio[text].all()  # dropping the text drops everything


def test_drops_remove_their_condition():
    m = _model().eval()
    mel, lens, text = _inputs([16, 16], ["hello", "world"])
    other = f5.Tokenizer().batch(["zzzzz", "qq"])
    t = torch.tensor([0.3, 0.7])
    with torch.no_grad():
        keep = m.transformer(mel, mel, text, t, lens)
        assert not torch.allclose(keep, m.transformer(mel, mel, other, t, lens))
        assert not torch.allclose(keep, m.transformer(mel, mel * 0, text, t, lens))
        no_text = m.transformer(mel, mel, text, t, lens, drop_audio_cond=True, drop_text=True)
        # F5 keeps the text length when it drops the text: same length, other symbols, same output.
        same_len = f5.Tokenizer().batch(["abcde", "xyzwv"])
        torch.testing.assert_close(no_text, m.transformer(mel, mel * 3, same_len, t, lens, drop_audio_cond=True,
                                                          drop_text=True), rtol=0, atol=0)
        no_audio = m.transformer(mel, mel, text, t, lens, drop_audio_cond=True)
        torch.testing.assert_close(no_audio, m.transformer(mel, mel * 0, text, t, lens, drop_audio_cond=True),
                                   rtol=0, atol=0)


def test_the_training_forward_compiles_to_one_graph():
    """What --compile compiles (the model's forward; loss_fn draws the guidance drops and hands them in as
    tensors) traces to one graph: no Python random draw, no branch on it and no boolean-mask index breaks it.
    Each break would be a return to Python, the index a wait for the device, every step."""
    m = _model()
    mel, lens, text = _inputs([30, 22], ["hello there", "hi"])
    for drops in ((True, False), (False, False)):
        flags = [torch.full((), v) for v in drops]
        ex = torch._dynamo.explain(m)(mel, lens, text, *flags)
        assert (ex.graph_count, ex.graph_break_count) == (1, 0), [r.reason for r in ex.break_reasons]


def test_loss_is_the_flow_mse_inside_the_span():
    cfg = f5.ModelConfig(**{**f5.asdict(f5.CONFIGS["tiny"]), "audio_drop_prob": 0.0, "cond_drop_prob": 0.0})
    m = _model(cfg=cfg)
    mel, lens, text = _inputs([50, 31], ["some words", "more"])
    seen = {}
    m.transformer.register_forward_hook(lambda mod, args, out: seen.update(args=args, out=out))
    loss, logs = _loss(m, mel, lens, text)
    xt, cond, _, t, _ = seen["args"]
    mask = f5.lengths_to_mask(lens, mel.shape[1])
    tt = t[:, None, None]
    x0 = (xt - tt * mel) / (1 - tt)
    flow = mel - x0  # the OT-path velocity with sigma = 0
    span = (cond == 0).all(-1) & mask
    for i, n in enumerate(lens.tolist()):
        frac = span[i].sum().item() / n
        assert 0.7 - 1 / n <= frac < 1.0
        # Outside the span the condition is the clean mel: the audio prompt.
        keep = mask[i] & ~span[i]
        assert torch.equal(cond[i][keep], mel[i][keep])
    expected = ((seen["out"] - flow) ** 2)[span].mean()
    torch.testing.assert_close(loss, expected, rtol=1e-4, atol=1e-4)
    assert logs["drop_audio"] == logs["drop_text"] == 0.0
    assert math.isclose(logs["span_frac"], (span.sum() / lens.sum()).item(), rel_tol=1e-6)


# ----------------------------------------------------------------------------- learning

@pytest.mark.usefixtures("one_torch_thread")  # a tiny model: a second spinning thread only slows it down
def test_overfitting_one_batch_drives_the_loss_down():
    """One padded batch with the same draws every step (noise, t, span, CFG drops), AdamW and F5's LR schedule:
    the model memorises it. The loss falls from the zero-output start (~30, the mean square of the flow) far
    below what predicting the batch's mean flow per mel bin would give (~5, where learning only the spectrum's
    level and shape stops)."""
    # a 7-tap position convolution: with tiny's 31 taps (F5's) these 250 steps do not reach the bound
    cfg = f5.ModelConfig(**{**f5.asdict(f5.CONFIGS["tiny"]), "dropout": 0.0, "conv_pos_kernel": 7})
    mel, lens, text = _inputs([48, 40, 29], ["some words here", "more", "a last one"])
    torch.manual_seed(0)
    m = f5.F5TTS(cfg)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.01)
    seen = {}
    m.transformer.register_forward_hook(lambda mod, args, out: seen.update(args=args))
    losses = []
    for step in range(250):
        for g in opt.param_groups:
            g["lr"] = f5.f5_lr(step, 1e-2, 10, 250)
        torch.manual_seed(1)
        random.seed(1)
        loss, _ = _loss(m, mel, lens, text)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    xt, cond, _, t, _ = seen["args"]  # the one set of draws, to price the mean-flow predictor
    tt = t[:, None, None]
    flow = mel - (xt - tt * mel) / (1 - tt)
    span = (cond == 0).all(-1) & f5.lengths_to_mask(lens, mel.shape[1])
    mean_flow = ((flow[span] - flow[span].mean(0)) ** 2).mean().item()
    end = float(np.mean(losses[-5:]))
    assert losses[0] > 20 and 3 < mean_flow < 8, (losses[0], mean_flow)
    assert end < 0.15 * mean_flow and end < 0.03 * losses[0], (losses[0], mean_flow, end)


# ----------------------------------------------------------------------------- shards and torchrun

def test_refuses_shards_with_another_mel(synthetic_corpus, tmp_path):
    other = tmp_path / "mel80"
    shard(synthetic_corpus.root, other, [("vocos_mel", {"n_mels": 80})])
    with pytest.raises(SystemExit) as e:
        f5.main(["--shards", str(other), "--config", "tiny", "--out", str(tmp_path / "run"), "--max-steps", "1"])
    msg = str(e.value)
    assert msg.startswith("f5tts: error:") and f5.MEL_HASH in msg and "asks for" in msg  # core says it, for every trainer


def _log(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


# Two ranks under torchrun and their bit-exact resume: tests/test_mandarin_e2e.py, with the pinyin tokenizer (whose
# vocabulary the resumed run must rebuild alike); the byte tokenizer holds no state a resume could lose.


def test_trains_from_an_s3_prefix_as_from_the_folder(f5_shards, s3, tmp_path):
    """`--shards s3://...` in a real trainer, with the pinyin tokenizer (its vocab is built from the shards'
    transcripts): two steps give the losses the local folder gives, on a real S3 server on 127.0.0.1."""
    from s3server import upload

    server, bucket = s3
    url = upload(server, f5_shards, f"{bucket}/f5")
    logs = []
    for src, out in ((str(f5_shards), tmp_path / "local"), (url, tmp_path / "s3")):
        f5.main(["--shards", src, "--config", "tiny", "--out", str(out), "--max-steps", "2", "--log-every", "1",
                 "--batch-frames", "1600", "--tokenizer", "pinyin"])
        logs.append([r["loss"] for r in _log(out)])
    assert len(logs[0]) == 2 and logs[0] == logs[1]
    assert (tmp_path / "s3" / "vocab.txt").read_text() == (tmp_path / "local" / "vocab.txt").read_text()


@pytest.mark.usefixtures("one_torch_thread")
def test_shapes_pads_to_one_shape_and_trains_on_empty_rows(f5_shards, tmp_path):
    """--shapes 1: every batch has the one shape, its empty rows get empty transcripts, and the loss stays finite
    (the empty rows' frames are masked everywhere, and their all-masked attention never reaches a real frame)."""
    out = tmp_path / "run"
    f5.main(["--shards", str(f5_shards), "--config", "tiny", "--out", str(out), "--max-steps", "2",
             "--log-every", "1", "--batch-frames", "1600", "--shapes", "1", "--lr", "1e-3"])
    log = _log(out)
    assert len(log) == 2 and all(np.isfinite(r["loss"]) and np.isfinite(r["grad_norm"]) for r in log)
    # Fill: each batch's padded frames (the shape's rows x edge) over the budget: one shape, one figure.
    assert len({r["fill"] for r in log}) == 1 and 0.5 < log[0]["fill"] <= 1
    cfg = json.loads((out / "model_config.json").read_text())  # what an export and a resume read back
    assert cfg["mel_hash"] == f5.MEL_HASH and cfg["model"]["dim"] == 64 and cfg["tokenizer"] == "byte"
    batch = {"mel": torch.zeros(4, 100, 8), "text": ["ab", "c"]}
    assert f5.AddTextIds(f5.Tokenizer())(batch)["text_ids"].shape[0] == 4
