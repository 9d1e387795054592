"""The byte-level test tokenizer round-trips any script and has the specials others rely on."""

from fmmeta.tasks.testing import TINY_VOCAB_SIZE, tiny_tokenizer


def test_tiny_tokenizer_is_byte_level_and_round_trips() -> None:
    tok = tiny_tokenizer()
    text = "Country: Côte d’Ivoire\nIn Japanese: コートジボワール Россия"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text.encode("utf-8"))
    assert ids[:2] == [4 + ord("C"), 4 + ord("o")]
    assert tok.decode(ids) == text
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    assert len(tok) == TINY_VOCAB_SIZE == 260
    assert max(ids) < TINY_VOCAB_SIZE


def test_tiny_tokenizer_without_pad() -> None:
    tok = tiny_tokenizer(with_pad=False)
    assert tok.pad_token is None
    assert tok.eos_token_id == 1
    assert len(tok) == TINY_VOCAB_SIZE - 1
