"""The group-suffix index on hand-built cases."""
import torch

from specrl.sampling import SamplingParams
from specrl.speculation.proposer import ProposalContext
from specrl.speculation.suffix import GroupIndex, SuffixConfig, SuffixProposer


def test_lookup_proposes_what_followed_the_tail_in_a_sibling():
    index = GroupIndex(min_n=2, max_n=4)
    sibling = index.new_sequence([1, 2, 3, 4, 5, 6, 7])
    row = index.new_sequence([9, 3, 4])
    assert index.lookup(row, k=3) == [5, 6, 7]
    assert index.lookup(sibling, k=3) == []  # its own tail occurs nowhere else


def test_lookup_prefers_the_longest_matching_tail():
    index = GroupIndex(min_n=2, max_n=4)
    index.new_sequence([8, 3, 4, 1, 1])  # matches the 2-token tail [3, 4]
    index.new_sequence([2, 3, 4, 5, 5])  # matches the 3-token tail [2, 3, 4]
    row = index.new_sequence([7, 2, 3, 4])
    assert index.lookup(row, k=2) == [5, 5]


def test_lookup_prefers_the_sibling_that_got_further():
    index = GroupIndex(min_n=2, max_n=2)
    index.new_sequence([3, 4, 6])
    index.new_sequence([3, 4, 5, 6, 7])
    row = index.new_sequence([0, 3, 4])
    assert index.lookup(row, k=3) == [5, 6, 7]


def test_own_earlier_tokens_are_matched_but_not_the_tail_itself():
    index = GroupIndex(min_n=2, max_n=3)
    row = index.new_sequence([1, 2, 3, 1, 2])
    assert index.lookup(row, k=2) == [3, 1]


def test_proposer_keeps_finished_siblings_and_indexes_new_tokens():
    proposer = SuffixProposer()
    tokens = torch.tensor([[5, 6, 7, 8, 9, 0], [5, 6, 0, 0, 0, 0]])
    context = ProposalContext(tokens, torch.tensor([5, 2]), SamplingParams(), None, 10, groups=torch.tensor([0, 0]))
    proposer.start(tokens, context.num_tokens, context.params)
    assert proposer.propose(context, 2).tokens.tolist()[1] == [7, 8]
    proposer.select_rows(torch.tensor([1]))  # row 0 finished; its tokens stay in the group's store
    tokens = torch.tensor([[5, 6, 7, 8, 0, 0]])
    later = ProposalContext(tokens, torch.tensor([4]), SamplingParams(), None, 10, groups=torch.tensor([0]))
    assert proposer.propose(later, 2).tokens.tolist() == [[9, 9]]  # the finished sibling's continuation, padded


def test_a_prompt_seen_in_an_earlier_call_drafts_from_its_earlier_rollouts(target_dir):
    """Greedy decoding repeats itself exactly, so the second call's drafts, taken from the first
    call's rollout of the same prompt, are right until that rollout's last indexed token."""
    from specrl.engine.engine import EngineConfig, RolloutEngine
    from specrl.models.llama import LlamaModel

    engine = RolloutEngine(LlamaModel.from_pretrained(target_dir), proposer=SuffixProposer(),
                           config=EngineConfig(num_speculative_tokens=3, adaptive=False))
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    first = engine.generate([[11, 17, 25, 33]], params)
    second = engine.generate([[11, 17, 25, 33]], params)
    assert second.completions[0].token_ids == first.completions[0].token_ids
    assert second.spec.acceptance_rate > 0.8 > first.spec.acceptance_rate
    forgetful = RolloutEngine(engine.model, proposer=SuffixProposer(SuffixConfig(remember=0)),
                              config=EngineConfig(num_speculative_tokens=3, adaptive=False))
    forgetful.generate([[11, 17, 25, 33]], params)
    assert forgetful.generate([[11, 17, 25, 33]], params).spec.acceptance_rate == first.spec.acceptance_rate
