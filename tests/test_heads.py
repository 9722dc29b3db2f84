"""Hidden-state draft heads (EAGLE-3, MTP): the chain they draft, how they are saved, how they learn.

Chain of invariants:
    the training-time-test pass   == the engine's cached drafting, element by element (same logits);
    the recorder's hidden states  == a teacher-forced forward of the finished rollout;
    save -> load                  == the same head (vLLM's EAGLE-3 layout, DeepSeek-style MTP names);
    training                      lowers the held-out loss and raises held-out acceptance.
(Exactness of speculation with these heads is in test_engine.py, with every other proposer.)
"""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from helpers import make_head, save_random_checkpoint
from specrl.engine.engine import EngineConfig, RolloutEngine
from specrl.models.llama import LlamaModel
from specrl.sampling import SamplingParams
from specrl.speculation.head_layer import chain_mask, chain_rows
from specrl.speculation.head_proposer import HeadProposer
from specrl.speculation.proposer import ProposalContext
from specrl.speculation.proposer_registry import load_head


def test_chain_mask_matches_the_worked_example():
    expected = torch.tensor([[1, 0, 0, 1, 0],
                             [1, 1, 0, 0, 1]], dtype=torch.bool)
    assert torch.equal(chain_mask(3, 2), expected)
    assert torch.equal(chain_mask(4, 1), torch.ones(4, 4, dtype=torch.bool).tril())
    # first anchor 2 of S = 6, depth 3: rows 4, 5; keys depth-1 s = 0..5 | depth-2 s = 3..5 | depth-3 s = 4, 5
    assert chain_rows(6, 3, first_anchor=2) == [0, 3, 4]
    assert torch.equal(chain_mask(6, 3, first_anchor=2),
                       torch.tensor([[1, 1, 1, 0, 0, 0, 1, 0, 0, 1, 0],
                                     [1, 1, 1, 1, 0, 0, 0, 1, 0, 0, 1]], dtype=torch.bool))


@pytest.mark.parametrize("kind", ["eagle3", "mtp"])
def test_skipping_the_rows_before_the_first_anchor_changes_no_row_that_counts(target_dir, kind):
    """Rows of anchors >= first_anchor equal the full pass's, in value and in gradient (right padding too)."""
    target = LlamaModel.from_pretrained(target_dir)
    head = make_head(kind, target)
    ids = torch.randint(0, 40, (2, 14), generator=torch.Generator().manual_seed(4))
    pad = torch.ones_like(ids, dtype=torch.bool)
    pad[1, 11:] = False
    with torch.no_grad():
        _, hidden = target.forward(ids, target.new_cache(2, 14), hidden_layers=head.hidden_layers)
    first, weights = 5, torch.randn(3, head.cfg.hidden_size, generator=torch.Generator().manual_seed(5))
    grads = []
    for anchor in (0, first):
        head.zero_grad()
        g = head.forward_train(hidden, ids, pad, depth=3, first_anchor=anchor)
        kept = [x[:, first + j:] for j, x in enumerate(g)]  # depth j+1: rows of anchors >= first
        sum((x * w).sum() for x, w in zip(kept, weights)).backward()
        grads.append([p.grad.clone() for p in head.parameters() if p.grad is not None])  # lm_head and norm: unused
        if anchor == 0:
            full = [x.detach() for x in kept]
        else:
            assert all(torch.allclose(a, b.detach(), atol=1e-5) for a, b in zip(full, kept))
            assert all(not x[:, :first + j].any() for j, x in enumerate(g[1:], start=1))  # skipped rows are zeros
    assert len(grads[0]) == len(grads[1]) > 5 and all(torch.allclose(a, b, atol=1e-4) for a, b in zip(*grads))


@pytest.mark.parametrize("kind", ["eagle3", "mtp"])
@torch.inference_mode()
def test_training_pass_equals_cached_drafting_element_by_element(target_dir, kind):
    target = LlamaModel.from_pretrained(target_dir)
    head = make_head(kind, target)
    ids = torch.randint(0, 40, (1, 14), generator=torch.Generator().manual_seed(3))
    _, hidden = target.forward(ids, target.new_cache(1, 14), hidden_layers=head.hidden_layers)
    g_train = head.forward_train(hidden, ids, torch.ones_like(ids, dtype=torch.bool), depth=3)
    proposer = HeadProposer(head)
    for e in (2, 6, 10):  # anchor: target states known at positions <= e
        proposer.start(ids, torch.tensor([e + 2]), SamplingParams())
        # the target's states arrive in two steps (padded like the engine's), caught up in one go
        first = {l: torch.cat([h[:, :e - 1], torch.zeros_like(h[:, :2])], dim=1) for l, h in hidden.items()}
        proposer.observe(first, torch.tensor([0]), torch.tensor([e - 1]), ids)
        proposer.observe({l: h[:, e - 1:e + 1] for l, h in hidden.items()}, torch.tensor([e - 1]), torch.tensor([2]), ids)
        proposer.catch_up(ids)
        feature, cache = proposer.feature, proposer.cache
        for j in range(3):  # element j+1 at position e + j, fed the true token as its draft
            if j:
                feature = head.forward_cached(feature.unsqueeze(1), ids[:, e + j + 1].view(1, 1), cache)[:, 0]
                cache.lens += 1
            assert torch.allclose(head.logits(feature), head.logits(g_train[j][:, e + j]), atol=1e-4), (e, j)


@pytest.mark.parametrize("kind", ["eagle3", "mtp"])
@torch.inference_mode()
def test_the_prompts_catch_up_waits_for_a_proposal_and_equals_one_on_the_repeated_rows(target_dir, kind):
    """The engine's lifecycle on 2 prompts x n = 2 rows: prefill states, the repeat, a decode step, a row
    retiring. The head runs nothing until the proposal, and then drafts what a proposer given the
    repeated rows from the start drafts (greedy tokens, and the anchor state they come from)."""
    target = LlamaModel.from_pretrained(target_dir)
    head = make_head(kind, target)
    L, group, keep = 6, torch.tensor([0, 0, 1, 1]), torch.tensor([0, 2, 3])
    ids = torch.randint(0, 40, (4, L + 2), generator=torch.Generator().manual_seed(5))
    ids[1, :L], ids[3, :L] = ids[0, :L], ids[2, :L]  # rows of a group share their prompt
    _, hidden = target.forward(ids, target.new_cache(4, L + 2), hidden_layers=head.hidden_layers)
    prompt = {l: h[:, :L - 1] for l, h in hidden.items()}  # the prefill: every prompt token but the last
    step = {l: h[:, L - 1:L + 1] for l, h in hidden.items()}  # one decode step verifying two tokens per row
    params = SamplingParams(temperature=0)
    context = ProposalContext(ids[keep], torch.full((3,), L + 2), params, None, 40, groups=group[keep])

    calls = []
    forward = head.forward_cached
    head.forward_cached = lambda *a, **kw: calls.append(1) or forward(*a, **kw)
    lazy = HeadProposer(head)
    lazy.start(ids[[0, 2]], torch.tensor([L, L]), params)
    lazy.observe({l: h[[0, 2]] for l, h in prompt.items()}, torch.tensor([0, 0]), torch.tensor([L - 1, L - 1]),
                 ids[[0, 2]])
    lazy.select_rows(group)
    lazy.observe(step, torch.full((4,), L - 1), torch.full((4,), 2), ids)
    lazy.select_rows(keep)
    assert not calls  # no draft yet: the head has not run
    got = lazy.propose(context, 3)

    eager = HeadProposer(head)  # the repeated rows from the start: no repeat, nothing deferred
    eager.start(ids, torch.full((4,), L), params)
    eager.observe(prompt, torch.zeros(4, dtype=torch.long), torch.full((4,), L - 1), ids)
    eager.observe(step, torch.full((4,), L - 1), torch.full((4,), 2), ids)
    eager.select_rows(keep)
    want = eager.propose(context, 3)
    assert torch.equal(got.tokens, want.tokens)
    assert torch.allclose(lazy.feature, eager.feature, atol=1e-5)
    assert torch.equal(lazy.cache.lens, eager.cache.lens)


def test_recorder_collects_the_hidden_states_of_a_teacher_forced_forward(target_dir):
    from specrl.speculation.hidden_recorder import HiddenStateRecorder

    target = LlamaModel.from_pretrained(target_dir)
    recorder = HiddenStateRecorder((0, -1))
    engine = RolloutEngine(target, proposer=recorder, config=EngineConfig(num_speculative_tokens=0))
    prompts = [[1, 2, 3, 4], [5, 6]]
    result = engine.generate(prompts, SamplingParams(n=2, max_tokens=9, seed=0, ignore_eos=True))
    for slot, completion in enumerate(result.completions):
        ids = torch.tensor([prompts[completion.prompt_index] + completion.token_ids])
        _, ref = target.forward(ids, target.new_cache(1, ids.shape[1]), hidden_layers=(0, -1))
        got = recorder.features(slot, ids.shape[1] - 1)
        for layer in (0, -1):
            assert torch.allclose(got[layer].float(), ref[layer][0, :-1], atol=2e-2)


@pytest.mark.parametrize("kind", ["eagle3", "mtp"])
def test_saved_head_loads_back_identical(tmp_path, target_dir, kind):
    target = LlamaModel.from_pretrained(target_dir)
    head = make_head(kind, target)
    head.save(tmp_path)
    loaded = load_head(tmp_path, target, kind)
    assert type(loaded) is type(head)
    for (name, a), (_, b) in zip(head.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    if kind == "eagle3":  # vLLM's layout: d2t as offsets, t2d as a mask, midlayer.* names
        assert torch.equal(loaded.d2t, head.d2t)
        tensors = load_file(str(tmp_path / "model.safetensors"))
        assert torch.equal(tensors["d2t"] + torch.arange(20), head.d2t)
        assert int(tensors["t2d"].sum()) == 20 and "midlayer.self_attn.q_proj.weight" in tensors
        config = json.loads((tmp_path / "config.json").read_text())
        assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 20


def test_head_for_another_vocabulary_or_kind_is_refused(tmp_path, target_dir):
    target = LlamaModel.from_pretrained(target_dir)
    make_head("eagle3", target).save(tmp_path / "eagle3")
    with pytest.raises(ValueError, match="is a eagle3 head, but proposer=mtp"):
        load_head(tmp_path / "eagle3", target, "mtp")
    other = tmp_path / "other"
    save_random_checkpoint(other, vocab=48, seed=5)
    with pytest.raises(ValueError, match="vocabulary mismatch"):
        load_head(tmp_path / "eagle3", LlamaModel.from_pretrained(other))
    with pytest.raises(ValueError, match="not an EAGLE-3 or MTP head"):
        load_head(other, target)
    (tmp_path / "eagle3" / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="corrupt"):
        load_head(tmp_path / "eagle3", target)



@pytest.mark.slow
@pytest.mark.parametrize("kind", ["eagle3", "mtp"])
def test_training_on_the_targets_rollouts_raises_held_out_acceptance(tmp_path, kind):
    """tiny's arithmetic rollouts, a few seconds of training: the held-out loss falls and the
    expected acceptance of every chain depth rises by a wide margin (measured: ~0.1 -> ~0.7-0.8,
    tau_est ~1.1 -> 1.9-2.6 depending on thread timing of the sampled rollouts)."""
    from specrl.models.registry import resolve_checkpoint
    from specrl.training.head_training import TrainHeadConfig, train_head
    from specrl.training.rollout_data import RolloutDataConfig

    data = RolloutDataConfig(prompts=192, max_new_tokens=24, held_out_prompts=32, sample_seconds=300)
    config = TrainHeadConfig(kind=kind, steps=120, train_seconds=300, threads=2, data=data)
    summary = train_head("tiny", resolve_checkpoint("tiny"), tmp_path / kind, config)
    before, after = summary["before"]["per_depth"], summary["after"]["per_depth"]
    for b, a in zip(before, after):
        assert a["loss"] < b["loss"] - 1.0
        assert a["acceptance"] > b["acceptance"] + 0.3
    assert summary["train_steps"] == 120  # the step count, not the clock, ended training
    assert summary["after"]["tau_est"] > 1.6
    head = load_head(tmp_path / kind, LlamaModel.from_pretrained(resolve_checkpoint("tiny")), kind)
    assert head.kind == kind


def test_a_head_trained_from_a_saved_one_starts_where_it_left_off_and_keeps_its_vocabulary(tmp_path):
    """`--init`: the head starts as the shipped tiny EAGLE-3 head (its held-out acceptance before training is the
    shipped head's, far above a fresh head's), keeps its output vocabulary (tiny's whole 22 ids: the d2t of a
    reduced one is kept as it is), and its TV-balanced loss trains."""
    from specrl.models.registry import resolve_checkpoint
    from specrl.training.head_training import TrainHeadConfig, train_head
    from specrl.training.rollout_data import RolloutDataConfig

    data = RolloutDataConfig(prompts=8, sample_batch=4, max_new_tokens=12, held_out_prompts=8)
    shipped = load_head(resolve_checkpoint("tiny-eagle3"), LlamaModel.from_pretrained(resolve_checkpoint("tiny")))
    common = dict(kind="eagle3", steps=4, threads=1, data=data, loss="ce+tv")
    warm = train_head("tiny", resolve_checkpoint("tiny"), tmp_path / "warm",
                      TrainHeadConfig(init=str(resolve_checkpoint("tiny-eagle3")), **common))
    fresh = train_head("tiny", resolve_checkpoint("tiny"), tmp_path / "fresh", TrainHeadConfig(**common))
    assert warm["before"]["per_depth"][0]["acceptance"] > fresh["before"]["per_depth"][0]["acceptance"] + 0.3
    assert warm["draft_vocab"] == shipped.output_vocab_size and warm["train_steps"] == 4
    saved = load_head(tmp_path / "warm", LlamaModel.from_pretrained(resolve_checkpoint("tiny")), "eagle3")
    assert saved.output_vocab_size == shipped.output_vocab_size
    assert (saved.d2t is None and shipped.d2t is None) or torch.equal(saved.d2t, shipped.d2t)
