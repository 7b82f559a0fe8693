"""The lm task's tokenizer: Hugging Face `tokenizers`, from the user's tokenizer.json or trained here.

    ringtrain data tokenizer train --src corpus/ --column text --vocab-size 32768 --out tokenizer.json
    ringtrain data pack tokens --src corpus/ --tokenizer tokenizer.json --out s3://bucket/corpus/train

Nothing comes from a hub. `train_bpe` trains a byte-level BPE the way GPT-2's tokenizer is built
(Radford et al. 2019, "Language Models are Unsupervised Multitask Learners", section 2.2: BPE over
bytes, so every string encodes and nothing maps to an unknown token; Hugging Face's own recipe:
https://huggingface.co/docs/tokenizers/quicktour), with GPT-2's end-of-text token `<|endoftext|>`
as the end-of-document token packed between documents.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from train.errors import BadInput

EOD_TOKEN = "<|endoftext|>"  # GPT-2's document separator (its tokenizer.json's added token 50256)
UINT16_LIMIT = 1 << 16
UINT32_LIMIT = 1 << 32
MIN_VOCAB = 256 + 1  # the byte alphabet and the end-of-document token


def token_dtype(vocab_size: int) -> str:
    """The narrowest unsigned integer that holds every token id: uint16 up to 65,536 ids, else uint32.
    Raises BadInput beyond uint32."""
    if vocab_size <= UINT16_LIMIT:
        return "uint16"
    if vocab_size <= UINT32_LIMIT:
        return "uint32"
    raise BadInput(f"vocabulary of {vocab_size:,} tokens does not fit uint32 token shards "
                   f"(at most {UINT32_LIMIT:,} ids)")


def check_vocab_size(flag: str, vocab_size: int) -> None:
    if vocab_size < MIN_VOCAB:
        raise BadInput(f"{flag} {vocab_size}: must be >= {MIN_VOCAB} (256 bytes and {EOD_TOKEN})")
    token_dtype(vocab_size)


def _largest_id(spec: dict) -> int:
    """The largest token id a tokenizer.json names (its model's vocabulary and its added tokens), read
    from the JSON itself: `tokenizers` stores ids as u32 and would reject a larger one only as a parse
    error, where the user needs to hear that the vocabulary is too large."""
    ids = [t.get("id", -1) for t in spec.get("added_tokens") or [] if isinstance(t, dict)]
    vocab = (spec.get("model") or {}).get("vocab")
    if isinstance(vocab, dict):
        ids += list(vocab.values())
    elif isinstance(vocab, list):  # Unigram: [[piece, score], ...], ids are positions
        ids.append(len(vocab) - 1)
    return max((i for i in ids if isinstance(i, int)), default=-1)


def parse(text: str, where: str):
    """A `tokenizers.Tokenizer` from tokenizer.json text. Raises BadInput naming `where` when it is not
    a tokenizer or its ids do not fit uint32."""
    from tokenizers import Tokenizer

    try:
        spec = json.loads(text)
    except ValueError as e:
        raise BadInput(f"tokenizer {where}: not valid JSON ({e}); give a Hugging Face tokenizer.json"
                       ) from None
    if not isinstance(spec, dict) or "model" not in spec:
        raise BadInput(f"tokenizer {where}: not a Hugging Face tokenizer.json (no \"model\")")
    token_dtype(_largest_id(spec) + 1)
    try:
        return Tokenizer.from_str(text)
    except Exception as e:  # tokenizers raises its own Exception subclass with serde's message
        raise BadInput(f"tokenizer {where}: not a tokenizer `tokenizers` can load: {e}") from None


def load(path: str) -> tuple[str, object]:
    """(the tokenizer.json text, the Tokenizer) from a local file. Raises BadInput."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise BadInput(f"--tokenizer {path}: no such file (a tokenizer.json: yours, or one from "
                       "`ringtrain data tokenizer train`)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise BadInput(f"--tokenizer {path}: cannot read it: {e}") from None
    return text, parse(text, path)


def eod_id(tokenizer, eod_token: str, where: str) -> int:
    token_id = tokenizer.token_to_id(eod_token)
    if token_id is None:
        raise BadInput(f"tokenizer {where} has no {eod_token!r} token: name its end-of-document token "
                       "with --eod-token")
    return token_id


def vocab_size(tokenizer) -> int:
    """Ids run 0..n-1: the model's vocabulary and the added tokens (get_vocab_size counts both)."""
    return tokenizer.get_vocab_size(with_added_tokens=True)


def train_bpe(documents: Iterable[str], size: int):
    """A byte-level BPE with `size` tokens (merges stop early on a small corpus) and EOD_TOKEN."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    check_vocab_size("--vocab-size", size)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=size, special_tokens=[EOD_TOKEN], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(documents, trainer=trainer)
    return tokenizer
