"""Text front ends: transcripts -> the token or phone sequences a model family was trained with.

- `f5_pinyin`: F5-TTS's `pinyin` tokenisation (jieba words, pypinyin TONE3 with tone sandhi, other characters
  kept) and its vocab.txt mapping, with unknown symbols counted.
- `zh_phones`: GPT-SoVITS Chinese phones (initials + toned finals) on its pypinyin path, in its symbol table
  (`symbols`), with cn2an number normalisation (`zh_normalize`) and its tone-sandhi rules (`tone_sandhi`).
- `f5_vocab`: the pinyin vocab an F5-TTS run uses (a checkpoint's vocab.txt, or the one F5's preparation writes).
- `frontend`: which front end a line goes to (`zh`, `en`, or `auto` by script), and GPT-SoVITS phones for it.
- `segment`: one quiet, lazily built jieba for word segmentation.
- `bert`: GPT-SoVITS's per-phone BERT features of Chinese text (a local chinese-roberta folder, run at shard
  time), stored as the `bert` column beside `phones`.

Everything here is offline: jieba, pypinyin and cn2an ship their dictionaries in their wheels.
English G2P is `audiopipe.text.en_phones`.

May import: `audiopipe.features.base` and `audiopipe.features.codec` (BERT features are a stored feature: their
contract, and the checkpoint identity their spec records).
"""
