"""The character tokenizer of `tiny`: exact round trips, and loading through transformers."""
import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from specrl.tasks.arithmetic import ALPHABET
from specrl.models.char_tokenizer import build_char_tokenizer, save_char_tokenizer
from specrl.models.registry import resolve_checkpoint

SAMPLES = ["Q:12+34\nA:12+34=46", "Q:9-17\nA:9-17=-8", "", "=\n\n==", "QA:*"]


@pytest.fixture(scope="module")
def hf_tokenizer():
    return AutoTokenizer.from_pretrained(resolve_checkpoint("tiny"))


def test_committed_tokenizer_loads_as_a_fast_tokenizer_with_special_tokens(hf_tokenizer):
    assert isinstance(hf_tokenizer, PreTrainedTokenizerFast)
    assert (hf_tokenizer.pad_token_id, hf_tokenizer.bos_token_id, hf_tokenizer.eos_token_id) == (0, 1, 2)
    assert hf_tokenizer.eos_token == "</s>"
    assert len(hf_tokenizer) == 4 + len(ALPHABET)


@pytest.mark.parametrize("text", SAMPLES)
def test_encode_then_decode_is_the_identity(hf_tokenizer, text):
    ids = hf_tokenizer(text)["input_ids"]
    assert len(ids) == len(text)  # one token per character, no special tokens added
    assert hf_tokenizer.decode(ids) == text


def test_decode_skips_eos_and_inserts_no_spaces(hf_tokenizer):
    ids = hf_tokenizer("12+34=46")["input_ids"] + [hf_tokenizer.eos_token_id]
    assert hf_tokenizer.decode(ids, skip_special_tokens=True) == "12+34=46"
    assert hf_tokenizer.decode(ids) == "12+34=46</s>"


def test_characters_outside_the_alphabet_become_unk():
    tok = build_char_tokenizer(ALPHABET)
    assert tok.encode("1 2", add_special_tokens=False).ids == [tok.token_to_id("1"), 3, tok.token_to_id("2")]


def test_saved_tokenizer_matches_the_committed_one(tmp_path, hf_tokenizer):
    save_char_tokenizer(ALPHABET, tmp_path, 64)
    fresh = AutoTokenizer.from_pretrained(tmp_path)
    assert fresh.get_vocab() == hf_tokenizer.get_vocab()


def test_repeated_alphabet_is_rejected():
    with pytest.raises(ValueError, match="repeated"):
        build_char_tokenizer("112")
