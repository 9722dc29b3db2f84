"""The staleness-bounded buffer between rollout actors and the trainer, on hand-built groups."""
from specrl.generation import Completion
from specrl.pipeline.buffer import StalenessBuffer
from specrl.pipeline.groups import Group


def make_group(index: int, version: int) -> Group:
    return Group(index=index, prompt_ids=[1], completions=[], rewards=[], issued_version=version)


def test_buffer_drops_groups_past_the_bound_and_hands_out_the_oldest_first():
    buffer = StalenessBuffer(max_staleness=1)
    buffer.put([make_group(0, 1), make_group(1, 2), make_group(2, 3), make_group(3, 2)])
    assert buffer.take(4, trainer_version=3) is None  # the version-1 group is 2 behind: dropped; 3 remain
    assert buffer.dropped == [0] and len(buffer) == 3
    batch = buffer.take(2, trainer_version=3)
    assert [g.index for g in batch] == [1, 3]
    assert [u.staleness for u in buffer.consumed] == [1, 1]
    buffer.put([make_group(1, 3)])  # a re-issued request whose first answer also arrived
    assert buffer.duplicates == 1 and len(buffer) == 1


def test_max_staleness_zero_buffer_accepts_only_the_current_version():
    buffer = StalenessBuffer(max_staleness=0)
    buffer.put([make_group(0, 4), make_group(1, 5)])
    assert [g.index for g in buffer.take(1, trainer_version=5)] == [1]
    assert buffer.dropped == [0]


def test_a_group_whose_tokens_span_versions_is_as_old_as_its_oldest_token():
    """In-flight weight updates give one sequence tokens of several versions; the bound is on every token."""
    mixed = Completion(prompt_index=0, sample_index=0, prompt_ids=[1], token_ids=[5, 6, 7], logprobs=[-1.0] * 3,
                       versions=[1, 2, 3], finish_reason="length")
    group = Group(index=0, prompt_ids=[1], completions=[mixed], rewards=[0.0], issued_version=1)
    assert group.version == 1
    buffer = StalenessBuffer(max_staleness=1)
    buffer.put([group, make_group(1, 3)])
    assert [g.index for g in buffer.take(1, trainer_version=3)] == [1]  # version-1 token: 2 behind, dropped
    assert buffer.dropped == [0]
