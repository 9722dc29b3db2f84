"""The reduced-vocabulary draft: initialisation from the target, save/load, and its q."""
import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from helpers import load_reduced_draft as load_draft

from specrl.models.reduced_vocab import build_draft, save_draft
from specrl.speculation.proposer import to_target_vocab
from specrl.models.registry import resolve_checkpoint


@pytest.fixture(scope="module")
def target():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return LlamaForCausalLM(config).eval()


D2T = torch.tensor([2, 5, 7, 11, 13, 40, 63])


def test_draft_copies_the_targets_first_layers_and_head_rows(target):
    draft = build_draft(target, 2, D2T)
    assert draft.config.num_hidden_layers == 2 and draft.config.draft_vocab_size == 7
    for name, tensor in draft.model.layers[1].state_dict().items():
        assert torch.equal(tensor, target.model.layers[1].state_dict()[name])
    assert torch.equal(draft.lm_head.weight, target.lm_head.weight[D2T])
    assert draft.lm_head.weight.data_ptr() != draft.model.embed_tokens.weight.data_ptr()


def test_a_full_depth_draft_with_full_vocab_reproduces_the_target(target):
    draft = build_draft(target, 3, torch.arange(64))
    ids = torch.randint(0, 64, (2, 9))
    torch.testing.assert_close(draft(ids).logits, target(ids).logits)


def test_save_then_load_round_trips_and_resolves(target, tmp_path):
    draft = build_draft(target, 1, D2T)
    save_draft(draft, tmp_path / "d")
    config = json.loads((tmp_path / "d" / "config.json").read_text())
    assert config["model_type"] == "llama" and config["draft_vocab_size"] == 7 and config["vocab_size"] == 64
    assert not config["tie_word_embeddings"]
    assert resolve_checkpoint(str(tmp_path / "d")) == (tmp_path / "d").resolve()
    loaded = load_draft(tmp_path / "d")
    ids = torch.randint(0, 64, (1, 5))
    assert torch.equal(loaded.d2t, D2T)
    torch.testing.assert_close(loaded(ids).logits, draft(ids).logits)


def test_q_is_zero_outside_the_draft_vocabulary_and_sums_to_one():
    q = to_target_vocab(torch.randn(3, 7).softmax(-1), D2T, 64)
    torch.testing.assert_close(q.sum(-1), torch.ones(3))
    outside = torch.ones(64, dtype=torch.bool)
    outside[D2T] = False
    assert (q[:, outside] == 0).all()


def test_bad_maps_are_refused(target):
    with pytest.raises(ValueError, match="same target id"):
        build_draft(target, 1, torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="outside the target vocabulary"):
        build_draft(target, 1, torch.tensor([1, 64]))
    with pytest.raises(ValueError, match="draft layers"):
        build_draft(target, 4, D2T)


def test_loading_a_plain_checkpoint_as_a_draft_names_the_problem(tmp_path):
    with pytest.raises(ValueError, match="draft_vocab_size"):
        load_draft(resolve_checkpoint("tiny"))
