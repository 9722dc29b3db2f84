"""The hybrid proposer: which part it picks per step, and its per-row mixing.

(Exactness of speculation with the hybrid is in test_engine.py, with every other proposer.)
"""
from __future__ import annotations

import torch

from helpers import make_head
from specrl.models.llama import LlamaModel
from specrl.sampling import SamplingParams
from specrl.speculation.head_proposer import HeadProposer


def test_drafts_are_scored_by_their_leading_matches_with_the_known_emitted_tokens():
    from specrl.speculation.acceptance import AcceptanceEstimate
    from specrl.speculation.hybrid import observe_matches

    estimate = AcceptanceEstimate(3, prior=0.5, smoothing=0.1)
    observe_matches(estimate, torch.tensor([[1, 2, 3], [1, 5, 3]]), torch.tensor([[1, 2, 9], [1, 2, 3]]),
                    torch.tensor([3, 1]))
    assert estimate.prefix == [1.0, 1.0, 0.0]  # the first observation replaces the prior
    observe_matches(estimate, torch.tensor([[4, 4, 4]]), torch.tensor([[0, 0, 0]]), torch.tensor([3]))
    # position 0: 2 of 2 matched, forgotten by 0.9, then 0 of 1; deeper positions saw no trials
    assert abs(estimate.prefix[0] - 1.8 / 2.8) < 1e-12 and estimate.prefix[1:] == [estimate.prefix[0], 0.0]


def test_hybrid_picks_the_part_with_more_tokens_per_second(target_dir):
    from specrl.speculation.hybrid import HybridProposer

    target = LlamaModel.from_pretrained(target_dir)
    hybrid = HybridProposer(HeadProposer(make_head("mtp", target)), explore_every=100)
    hybrid.start(torch.zeros(1, 8, dtype=torch.long), torch.tensor([4]), SamplingParams())
    assert hybrid.choose(3, verify_seconds=None) == "model"  # nothing measured yet
    hybrid.cost["model"] = 0.01
    hybrid.estimates["model"].prefix = [0.9, 0.8, 0.7]  # 3.4 tokens per 0.02 s: 170 / s
    hybrid.estimates["suffix"].prefix = [0.3, 0.1, 0.0]  # 1.4 tokens per 0.01 s: 140 / s
    assert hybrid.choose(3, verify_seconds=0.01) == "model"
    hybrid.estimates["suffix"].prefix = [0.9, 0.9, 0.9]  # 3.7 tokens per 0.01 s: 370 / s
    assert hybrid.choose(3, verify_seconds=0.01) == "suffix"
    hybrid.since_model = 100  # the model part is re-measured every explore_every steps
    assert hybrid.choose(3, verify_seconds=0.01) == "model"


def test_hybrid_gives_rows_with_a_full_sibling_match_the_suffix_draft(target_dir):
    """Mixing is per row: a row whose siblings supply all k tokens drafts them with a one-hot q;
    the other rows keep the model's draft and its q."""
    from specrl.speculation.hybrid import HybridProposer
    from specrl.speculation.proposer import ProposalContext

    target = LlamaModel.from_pretrained(target_dir)
    hybrid = HybridProposer(HeadProposer(make_head("mtp", target)))
    # rows 0 and 1 share a prompt; row 0 already wrote 7 8 9 after "5 6", row 1 is at "5 6"; row 2 is alone
    tokens = torch.tensor([[1, 5, 6, 7, 8, 9, 0, 0, 0, 0], [1, 5, 6, 0, 0, 0, 0, 0, 0, 0], [2, 3, 0, 0, 0, 0, 0, 0, 0, 0]])
    num_tokens = torch.tensor([6, 3, 2])
    with torch.inference_mode():
        _, hidden = target.forward(tokens, target.new_cache(3, 10), hidden_layers=(-1,))
    hybrid.start(tokens, num_tokens, SamplingParams())
    hybrid.observe({-1: hidden[-1][:, :5]}, torch.tensor([0, 0, 0]), num_tokens - 1, tokens)
    context = ProposalContext(tokens, num_tokens, SamplingParams(), torch.Generator().manual_seed(0), 40,
                              groups=torch.tensor([0, 0, 1]), verify_seconds=0.01)
    proposal = hybrid.propose(context, 3)  # the model part runs first (its cost is unknown)
    assert proposal.tokens[1].tolist() == [7, 8, 9]
    assert torch.equal(proposal.probs[1], torch.nn.functional.one_hot(torch.tensor([7, 8, 9]), 40).float())
    assert torch.allclose(proposal.probs[2].sum(-1), torch.ones(3))
    assert proposal.probs[2].max() < 1.0  # row 2 kept the model's sampled draft distribution
