"""Test helpers that need no download: a byte-level tokenizer for tiny models.

Tests across fmmeta build tiny Llama models from a config; they need a tokenizer that handles any
text (CLDR names come in many scripts) without touching the hub. :func:`tiny_tokenizer` maps every
UTF-8 byte to its own token, so its vocabulary is 256 bytes plus a few specials, small enough for a
``LlamaConfig(vocab_size=260..512)``. This module imports no test framework, so recipes' smoke
configs can use it too.
"""

from __future__ import annotations

from functools import lru_cache

from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN)
"""Specials take ids 0..3 (pad=0, bos=1, eos=2, unk=3); byte ``b`` has id ``4 + b``."""

TINY_VOCAB_SIZE = len(SPECIAL_TOKENS) + 256
"""Vocabulary size of :func:`tiny_tokenizer` (260); a tiny model needs ``vocab_size >= 260``."""


@lru_cache(maxsize=4)
def _build_backend(with_pad: bool) -> str:
    """Serialised ``tokenizers`` backend (cached: building it takes a few milliseconds)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    specials = SPECIAL_TOKENS if with_pad else SPECIAL_TOKENS[1:]
    vocab: dict[str, int] = {tok: i for i, tok in enumerate(specials)}
    # ByteLevel's alphabet is the GPT-2 byte->unicode map; order it by byte value so ids are stable.
    byte_chars = _bytes_to_unicode()
    for b in range(256):
        vocab[byte_chars[b]] = len(vocab)
    # A BPE model with no merges is exactly "one token per byte".
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK_TOKEN))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(specials))
    return tok.to_str()


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character map (what ByteLevel uses)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def tiny_tokenizer(*, with_pad: bool = True) -> PreTrainedTokenizerFast:
    """A byte-level tokenizer that needs no download: every UTF-8 byte is one token.

    Args:
        with_pad: if False, the tokenizer has no pad token (to test
            :func:`fmmeta.tasks.task.ensure_pad_token`); ids then shift down by one.

    Returns:
        A fresh ``PreTrainedTokenizerFast`` with bos ``<s>``, eos ``</s>``, unk ``<unk>`` and
        (by default) pad ``<pad>`` = id 0; no special tokens are added when encoding.

    Example:
        >>> tok = tiny_tokenizer()
        >>> tok("Hi", add_special_tokens=False)["input_ids"]
        [76, 109]
    """
    from tokenizers import Tokenizer

    backend = Tokenizer.from_str(_build_backend(with_pad))
    kwargs: dict[str, str] = {"bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN, "unk_token": UNK_TOKEN}
    if with_pad:
        kwargs["pad_token"] = PAD_TOKEN
    return PreTrainedTokenizerFast(tokenizer_object=backend, **kwargs)
