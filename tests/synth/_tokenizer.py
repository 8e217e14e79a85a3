"""Tokenizer vocabularies that llama.cpp's ``llama-vocab.cpp`` accepts.

Three kinds, matching ``tokenizer.ggml.model``:

* ``gpt2``  – byte-level BPE: 256 byte tokens (GPT-2's bytes→unicode map), then merged
  tokens each with its merge rule ``"A B"`` (both parts are earlier tokens, so the merge
  table is self-consistent), then control tokens at the end.
* ``llama`` – SentencePiece: ``<unk> <s> </s>``, the 256 ``<0xNN>`` byte tokens (so the
  newline token resolves), then ``▁``-prefixed pieces with descending scores.
* ``bert``  – WordPiece: ``[PAD]``/``[unusedN]``/``[UNK]``/``[CLS]``/``[SEP]``/``[MASK]`` at
  BERT's usual ids 0/1‥99/100/101/102/103, then characters and ``##`` continuations.

Every token string is unique: llama.cpp asserts ``id_to_token.size() == token_to_id.size()``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# llama.cpp token types (LLAMA_TOKEN_TYPE_*)
TT_NORMAL = 1
TT_UNKNOWN = 2
TT_CONTROL = 3
TT_USER_DEFINED = 4
TT_BYTE = 6

_MAX_TOKEN_CHARS = 12


@dataclass(frozen=True)
class Vocab:
    """A tokenizer ready to be written as ``tokenizer.ggml.*`` keys."""

    model: str
    pre: str | None
    tokens: list[str]
    token_types: list[int]
    merges: list[str] | None = None
    scores: list[float] | None = None
    special_ids: tuple[tuple[str, int], ...] = ()
    add_bos: bool | None = None
    add_eos: bool | None = None
    token_type_count: int | None = None


def _bytes_to_unicode() -> list[str]:
    """GPT-2's reversible byte→printable-character table, in byte order."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    table: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def _grow_pairs(
    letters: list[str], seen: set[str], n_new: int, *, seed: int, max_chars: int
) -> tuple[list[str], list[str]]:
    """Make ``n_new`` unique tokens, each the concatenation of two known ones.

    ``letters`` are the single-character building blocks (a space marker may be among them);
    ``seen`` holds every token already in the vocabulary and is updated. Returns
    (new tokens, merge rules ``"A B"``). The left part is usually a recent token, so lengths
    grow toward the ~4–12 byte range of real vocabularies and then stay there.
    """
    rng = random.Random(seed)
    rand = rng.random
    pool = list(letters)
    new: list[str] = []
    merges: list[str] = []
    while len(new) < n_new:
        if rand() < 0.75:
            a = pool[-1 - int(rand() * min(len(pool), 4096))]
        else:
            a = letters[int(rand() * len(letters))]
        b = letters[int(rand() * len(letters))] if rand() < 0.5 else pool[int(rand() * len(pool))]
        s = a + b
        if len(s) > max_chars or s in seen:
            continue
        seen.add(s)
        new.append(s)
        merges.append(f"{a} {b}")
        pool.append(s)
    return new, merges


def gpt2_vocab(n_vocab: int, *, pre: str, seed: int = 0) -> Vocab:
    """Byte-level BPE vocabulary of exactly ``n_vocab`` tokens."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    byte_tokens = _bytes_to_unicode()
    n_merged = n_vocab - len(byte_tokens) - len(specials)
    if n_merged < 1:
        raise ValueError(f"gpt2 vocab needs more than {len(byte_tokens) + len(specials)} tokens")
    letters = [t for t in byte_tokens if t.isascii() and t.isalpha()] + ["Ġ"] * 8
    merged, merges = _grow_pairs(
        letters, set(byte_tokens), n_merged, seed=seed, max_chars=_MAX_TOKEN_CHARS
    )
    tokens = byte_tokens + merged + specials
    types = [TT_NORMAL] * (len(byte_tokens) + len(merged)) + [TT_CONTROL] * len(specials)
    eos = len(tokens) - len(specials)  # <|endoftext|>
    eot = len(tokens) - 1  # <|im_end|>
    return Vocab(
        model="gpt2",
        pre=pre,
        tokens=tokens,
        token_types=types,
        merges=merges,
        special_ids=(("bos", eos), ("eos", eot), ("pad", eos)),
        add_bos=False,
    )


def spm_vocab(n_vocab: int, *, seed: int = 0) -> Vocab:
    """SentencePiece (``llama``) vocabulary of exactly ``n_vocab`` tokens."""
    head = ["<unk>", "<s>", "</s>"]
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    n_pieces = n_vocab - len(head) - len(byte_tokens)
    if n_pieces < 1:
        raise ValueError(f"llama vocab needs more than {len(head) + len(byte_tokens)} tokens")
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    base = ["▁", *letters, *(c.upper() for c in letters)]
    pieces = base[:n_pieces]
    grown, _ = _grow_pairs(
        [*letters, "▁", "▁", "▁"],
        set(head) | set(byte_tokens) | set(pieces),
        n_pieces - len(pieces),
        seed=seed,
        max_chars=_MAX_TOKEN_CHARS,
    )
    pieces += grown
    tokens = head + byte_tokens + pieces
    types = [TT_UNKNOWN, TT_CONTROL, TT_CONTROL] + [TT_BYTE] * 256 + [TT_NORMAL] * n_pieces
    scores = [0.0] * (len(head) + len(byte_tokens)) + [-float(i) for i in range(n_pieces)]
    return Vocab(
        model="llama",
        pre="default",
        tokens=tokens,
        token_types=types,
        scores=scores,
        special_ids=(("unk", 0), ("bos", 1), ("eos", 2)),
        add_bos=True,
        add_eos=False,
    )


def wpm_vocab(n_vocab: int, *, seed: int = 0) -> Vocab:
    """WordPiece (``bert``) vocabulary with BERT's special-token ids."""
    if n_vocab < 200:
        raise ValueError("bert vocab needs at least 200 tokens")
    tokens = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    types = [TT_CONTROL] * len(tokens)
    chars = [chr(c) for c in range(ord("a"), ord("z") + 1)] + list("0123456789.,!?'-")
    words = chars + ["##" + c for c in chars]
    n_grow = n_vocab - len(tokens) - len(words)
    grown, _ = _grow_pairs(chars[:26], set(tokens) | set(words), n_grow, seed=seed, max_chars=10)
    words += [w if i % 2 == 0 else "##" + w for i, w in enumerate(grown)]
    tokens += words
    types += [TT_NORMAL] * len(words)
    return Vocab(
        model="bert",
        pre="default",
        tokens=tokens,
        token_types=types,
        special_ids=(("unk", 100), ("bos", 101), ("sep", 102), ("pad", 0), ("mask", 103)),
        add_bos=True,
        add_eos=True,
        token_type_count=2,
    )


def build_vocab(kind: str, n_vocab: int, *, pre: str | None, seed: int = 0) -> Vocab:
    if kind == "gpt2":
        return gpt2_vocab(n_vocab, pre=pre or "default", seed=seed)
    if kind == "llama":
        return spm_vocab(n_vocab, seed=seed)
    if kind == "bert":
        return wpm_vocab(n_vocab, seed=seed)
    raise ValueError(f"unknown tokenizer kind {kind!r}")
