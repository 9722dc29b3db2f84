"""The hybrid proposer: which part it picks per step, and its per-row mixing.

(Exactness of speculation with the hybrid is in test_engine.py, with every other proposer.)
"""
from __future__ import annotations

import pytest
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
    hybrid.start(torch.zeros(2, 8, dtype=torch.long), torch.tensor([4, 4]), SamplingParams())
    found_all, found_one = torch.tensor([3, 3]), torch.tensor([1, 1])  # tokens each row's suffix lookup found
    assert hybrid.choose(3, verify_seconds=None, found=found_all) == "model"  # nothing measured yet
    hybrid.cost["model"] = 0.01
    hybrid.estimates["model"].prefix = [0.9, 0.8, 0.7]  # 3.4 tokens per 0.02 s: 170 / s
    hybrid.estimates["suffix"].prefix = [0.3, 0.1, 0.0]  # 1.4 tokens per 0.01 s: 140 / s
    assert hybrid.choose(3, verify_seconds=0.01, found=torch.tensor([2, 2])) == "model"
    hybrid.estimates["suffix"].prefix = [0.9, 0.9, 0.9]  # 3.7 tokens per 0.01 s: 370 / s
    assert hybrid.choose(3, verify_seconds=0.01, found=found_all) == "suffix"
    # one token found a row: 1.9 tokens per 0.01 s (190 / s) against the model's 170 / s; then one row finds none:
    # (1.9 + 1) / 2 = 1.45 tokens per 0.01 s (145 / s), and the model draft on that row pays more
    assert hybrid.choose(3, verify_seconds=0.01, found=found_one) == "suffix"
    assert hybrid.choose(3, verify_seconds=0.01, found=torch.tensor([1, 0])) == "model"
    hybrid.since_model = 100  # the model part is re-measured every explore_every steps
    assert hybrid.choose(3, verify_seconds=0.01, found=found_all) == "model"


def test_a_step_whose_suffix_lookups_found_nothing_drafts_with_the_model_and_does_not_score_the_padding(target_dir):
    """A suffix draft pads what its lookup found with guesses: a step where nothing was found is worth a plain
    step's one token, not the suffix's estimate, and its padding is not scored as the suffix's acceptance."""
    from specrl.speculation.acceptance import AcceptanceEstimate
    from specrl.speculation.hybrid import HybridProposer
    from specrl.speculation.proposer import ProposalContext

    target = LlamaModel.from_pretrained(target_dir)
    hybrid = HybridProposer(HeadProposer(make_head("mtp", target)), explore_every=100)
    tokens = torch.tensor([[1, 2, 3, 4, 5, 6, 0, 0, 0, 0, 0, 0]])  # one row, no siblings, no repeated n-gram
    num_tokens = torch.tensor([6])
    with torch.inference_mode():
        _, hidden = target.forward(tokens, target.new_cache(1, 12), hidden_layers=(-1,))
    hybrid.start(tokens, num_tokens, SamplingParams())
    hybrid.observe({-1: hidden[-1][:, :5]}, torch.tensor([0]), num_tokens - 1, tokens)
    generator = torch.Generator().manual_seed(0)
    # both parts' found drafts accepted 0.9 a position lately (held with the weight of 1000 rows): a model step is
    # worth 1 + 2.44 tokens in 0.02 s; a suffix step that found nothing 1 token in 0.01 s
    hybrid.estimates = {part: AcceptanceEstimate(8, 0.9, prior_rows=1000) for part in ("model", "suffix")}
    before = list(hybrid.estimates["suffix"].trials)
    for step in range(3):
        hybrid.cost["model"] = 0.01  # measured: the model draft costs as much as the rest of a step (set at each
        # step: on a busy machine the proposals' own times would move it)
        context = ProposalContext(tokens, num_tokens, SamplingParams(), generator, 40, groups=torch.tensor([0]),
                                  verify_seconds=0.01)
        proposal = hybrid.propose(context, 3)
        assert torch.equal(proposal.tokens, hybrid.pending[1][1])  # the model's draft ran
        emitted = 1 + step % 2  # the target keeps the bonus token, or one draft and it
        tokens[0, num_tokens[0]:num_tokens[0] + emitted] = torch.tensor([7, 8])[:emitted]
        hidden_step = {-1: hidden[-1][:, :emitted]}  # states of some positions: the head's output is not checked
        hybrid.observe(hidden_step, num_tokens - 1, torch.tensor([emitted]), tokens)
        num_tokens = num_tokens + emitted
    assert hybrid.estimates["suffix"].trials == before  # nothing found, nothing scored


def test_the_model_parts_cost_leaves_out_one_off_setup(target_dir):
    """A proposal's `setup_seconds` (the call's prompt, caught up at its first proposal) is not what drafting costs
    a step: the hybrid prices its model part without it."""
    import time

    from specrl.speculation.hybrid import HybridProposer
    from specrl.speculation.proposer import ProposalContext

    class SlowFirstProposal(HeadProposer):  # a real head whose first proposal also does 0.3 s of one-off work
        def propose(self, context, k):
            proposal = super().propose(context, k)
            if proposal.setup_seconds:
                time.sleep(0.3)
                proposal.setup_seconds += 0.3
            return proposal

    target = LlamaModel.from_pretrained(target_dir)
    hybrid = HybridProposer(SlowFirstProposal(make_head("mtp", target)))
    tokens, num_tokens = torch.tensor([[1, 2, 3, 4, 5, 6, 0, 0, 0, 0]]), torch.tensor([6])
    with torch.inference_mode():
        _, hidden = target.forward(tokens, target.new_cache(1, 10), hidden_layers=(-1,))
    hybrid.start(tokens, num_tokens, SamplingParams())
    hybrid.observe({-1: hidden[-1][:, :5]}, torch.tensor([0]), num_tokens - 1, tokens)
    context = ProposalContext(tokens, num_tokens, SamplingParams(), torch.Generator().manual_seed(0), 40,
                              groups=torch.tensor([0]), verify_seconds=0.01)
    proposal = hybrid.propose(context, 3)  # the first: the model part runs to be measured
    assert proposal.setup_seconds > 0.3
    assert hybrid.cost["model"] < 0.1


@pytest.mark.parametrize("kind", ["draft", "eagle3"])
def test_a_model_drafts_first_proposal_reports_the_prompts_work_as_setup_and_later_ones_none(target_dir, draft_dir,
                                                                                             kind):
    from specrl.speculation.draft_model import DraftModelProposer
    from specrl.speculation.proposer import ProposalContext

    target = LlamaModel.from_pretrained(target_dir)
    proposer = (DraftModelProposer(LlamaModel.from_pretrained(draft_dir), 40) if kind == "draft"
                else HeadProposer(make_head(kind, target)))
    tokens, num_tokens = torch.randint(0, 40, (2, 24), generator=torch.Generator().manual_seed(1)), torch.tensor([16, 16])
    with torch.inference_mode():
        _, hidden = target.forward(tokens, target.new_cache(2, 24), hidden_layers=proposer.hidden_layers)
    proposer.start(tokens, num_tokens, SamplingParams())
    if hidden:
        proposer.observe({l: h[:, :15] for l, h in hidden.items()}, torch.tensor([0, 0]), num_tokens - 1, tokens)
    generator, groups = torch.Generator().manual_seed(0), torch.tensor([0, 1])
    first = proposer.propose(ProposalContext(tokens, num_tokens, SamplingParams(), generator, 40, groups), 2)
    assert first.setup_seconds > 0
    if hidden:
        proposer.observe({l: h[:, 15:17] for l, h in hidden.items()}, num_tokens - 1, torch.tensor([2, 2]), tokens)
    second = proposer.propose(ProposalContext(tokens, num_tokens + 2, SamplingParams(), generator, 40, groups), 2)
    assert second.setup_seconds == 0.0


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
