"""The target's rollouts that drafts train on: what the engine records lines up with a teacher-forced
forward pass, a collection survives save/load, and a draft distilled from it loads and drafts exactly.

Chain of invariants:
    p stored at response step t       == softmax of the target at position len(prompt) - 1 + t;
    recorded features at position i    == the target's hidden state there (teacher-forced forward);
    save -> load                       == the same rollouts;
    a draft saved without embeddings   drafts with the target's, and speculation stays exact.
"""
from __future__ import annotations

import pytest
import torch

from specrl.models.llama import LlamaModel
from specrl.models.registry import resolve_checkpoint
from specrl.training.draft_distillation import _flat_targets
from specrl.training.rollout_data import RolloutDataConfig, Rollouts, draft_vocabulary, sample_target


@pytest.fixture(scope="module")
def samples():
    data = RolloutDataConfig(prompts=12, sample_batch=6, max_new_tokens=12, held_out_prompts=4, top_k=22)
    return sample_target("tiny", resolve_checkpoint("tiny"), data, seed=3)


def test_stored_distributions_and_features_line_up_with_a_teacher_forced_pass(samples):
    model, rollouts = samples.target, samples.train
    for i in range(len(rollouts)):
        ids, L = rollouts.ids[i], rollouts.prompt_lens[i]
        cache = model.new_cache(1, len(ids))
        logits, hidden = model.forward(ids[:-1].unsqueeze(0), cache, hidden_layers=tuple(rollouts.features[i]))
        for layer, feats in rollouts.features[i].items():
            torch.testing.assert_close(feats.float(), hidden[layer][0], atol=2e-2, rtol=2e-3)  # fp16 storage
        p = torch.softmax(logits[0, L - 1:], -1)
        d2t = torch.arange(22)
        got = _flat_targets(rollouts, [i], d2t, d2t)  # top-22 of 22: all of p
        torch.testing.assert_close(got, p, atol=2e-3, rtol=2e-2)
    assert torch.isclose(samples.soft_counts.sum(), torch.tensor(float(rollouts.tokens), dtype=torch.float64), atol=1e-2)


def test_a_collection_survives_save_and_load(samples, tmp_path):
    samples.train.save(tmp_path, {"target": "tiny"})
    loaded, record = Rollouts.load(tmp_path)
    assert record["target"] == "tiny" and len(loaded) == len(samples.train)
    for a, b in zip(loaded.ids, samples.train.ids):
        assert torch.equal(a, b)
    for a, b in zip(loaded.features, samples.train.features):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert all(torch.equal(a, b) for a, b in zip(loaded.top_ids, samples.train.top_ids))


def test_draft_vocabulary_takes_the_most_expected_ids_in_order():
    d2t, t2d = draft_vocabulary(torch.tensor([0.1, 5.0, 0.0, 3.0, 2.0], dtype=torch.float64), 3)
    assert d2t.tolist() == [1, 3, 4] and t2d.tolist() == [-1, 0, -1, 1, 2]


@pytest.mark.slow
def test_a_distilled_draft_shares_the_targets_embedding_and_drafts_exactly(tmp_path):
    from specrl.backends import BackendConfig, make_backend
    from specrl.sampling import SamplingParams
    from specrl.training.draft_distillation import TrainDraftConfig, train_draft

    data = RolloutDataConfig(prompts=24, sample_batch=12, max_new_tokens=12, held_out_prompts=6)
    summary = train_draft("tiny", resolve_checkpoint("tiny"), tmp_path / "draft",
                          TrainDraftConfig(layers=1, draft_vocab=16, steps=30, threads=2, data=data))
    assert summary["acceptance_after"] > summary["acceptance_before"]
    with pytest.raises(ValueError, match="shares \\['model.embed_tokens.weight'\\] with its target"):
        LlamaModel.from_pretrained(tmp_path / "draft")
    config = dict(model="tiny", num_speculative_tokens=3, adaptive=False)
    spec = make_backend(BackendConfig(proposer="draft", draft=str(tmp_path / "draft"), **config))
    base = make_backend(BackendConfig(**config))
    greedy = SamplingParams(temperature=0, max_tokens=12, n=2)
    prompts = ["Q:12+34\nA:", "Q:7+58\nA:"]
    assert [c.token_ids for c in spec.generate(prompts, greedy).completions] == \
        [c.token_ids for c in base.generate(prompts, greedy).completions]


def test_head_training_takes_micro_batches_of_responses_too_short_for_its_depth(samples):
    """Pooling micro-batches by length puts the shortest responses together: with one response token
    each, depths 2 and 3 have no row to train, and the step trains depth 1 alone (a finite loss)."""
    import dataclasses

    from specrl.training.head_training import TrainHeadConfig, new_head, train

    r = samples.train
    cut = Rollouts([ids[:L + 1] for ids, L in zip(r.ids, r.prompt_lens)], list(r.prompt_lens),
                   [{layer: f[:L] for layer, f in feats.items()} for feats, L in zip(r.features, r.prompt_lens)],
                   [p[:1] for p in r.top_p], [i[:1] for i in r.top_ids])
    head = new_head("eagle3", samples.target, samples.soft_counts, 0)
    before = [p.detach().clone() for p in head.parameters()]
    loss, steps = train(head, cut, None, dataclasses.replace(TrainHeadConfig(), steps=2, micro_batch=4, depth=3))
    assert steps == 2 and torch.isfinite(torch.tensor(loss))
    assert any(not torch.equal(a, b) for a, b in zip(before, head.parameters()))
