"""vLLM loads specrl's EAGLE-3 heads (method eagle3) and drafts with them as the embedded engine does.

Chain of invariants:
  1. at temperature 0, vLLM with the head emits the same tokens as the embedded engine with it
     (and so as no speculation);
  2. greedy drafts are deterministic, so both engines accept about the same number of them: a
     head read with the wrong layer numbering, norms or vocabulary map would accept far fewer
     in vLLM (they differ only at request ends, where vLLM schedules drafts its own way);
  3. a head with a reduced output vocabulary (d2t) loads too;
  4. a head refitted into the running engine (what online adaptation sends each version) drafts
     as the embedded engine does with the same weights.
One in-process engine per head; the target has 4 layers so the aux layers (1, 2, 4) differ.
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm.sampling_params", reason="needs the vllm extra: pip install -e '.[vllm]'")

from specrl.backends import BackendConfig, make_backend  # noqa: E402
from specrl.backends.vllm import VLLMOptions  # noqa: E402
from specrl.models.checkpoint import load_state_dict  # noqa: E402
from specrl.models.llama import LlamaModel  # noqa: E402
from specrl.sampling import SamplingParams  # noqa: E402
from specrl.speculation.eagle3 import Eagle3Head  # noqa: E402
from vllm_fixtures import PROMPTS, save_checkpoint  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
GREEDY = SamplingParams(temperature=0, max_tokens=24)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    path = tmp_path_factory.mktemp("eagle3_target")
    save_checkpoint(path, layers=4, seed=0)
    return path


@pytest.mark.parametrize("reduced", [False, True], ids=["full-vocab", "reduced-vocab"])
def test_vllm_drafts_with_the_saved_head_like_the_embedded_engine(target, tmp_path, reduced):
    head = Eagle3Head.from_target(LlamaModel.from_pretrained(target), d2t=torch.arange(0, 40, 2) if reduced else None)
    head.save(tmp_path / "head")
    common = dict(model=str(target), proposer="eagle3", draft=str(tmp_path / "head"), num_speculative_tokens=3)
    embedded = make_backend(BackendConfig(adaptive=False, **common)).generate(PROMPTS, GREEDY)
    # a second head, as online adaptation would send it: the same layout, other weights
    torch.manual_seed(1)
    with torch.no_grad():
        for p in head.layer.parameters():
            p.add_(0.01 * torch.randn_like(p))
    head.save(tmp_path / "moved")
    moved = make_backend(BackendConfig(adaptive=False, **dict(common, draft=str(tmp_path / "moved")))).generate(
        PROMPTS, GREEDY)
    backend = make_backend(BackendConfig(backend="vllm", **common), VLLMOptions.for_tests())
    try:
        served = backend.generate(PROMPTS, GREEDY)
        backend.sync_weights(load_state_dict(target), version=1, draft=head.checkpoint_state())
        refitted = backend.generate(PROMPTS, GREEDY)
    finally:
        backend.close()
    for got, want in ((served, embedded), (refitted, moved)):
        assert [c.token_ids for c in got.completions] == [c.token_ids for c in want.completions]
        assert got.spec.num_accepted_tokens > 10
        assert abs(got.spec.acceptance_length - want.spec.acceptance_length) < 0.15
    assert refitted.spec.num_accepted_tokens != served.spec.num_accepted_tokens  # the refit took effect
    assert all(c.versions == [1] * len(c.token_ids) for c in refitted.completions)


def test_suffix_and_hybrid_proposers_are_refused_by_vllm_with_the_reason(target):
    for proposer, reason in (("suffix", "group-suffix"), ("hybrid", "hybrid")):
        with pytest.raises(ValueError, match=reason):
            make_backend(BackendConfig(backend="vllm", model=str(target), proposer=proposer, draft=str(target)),
                         VLLMOptions.for_tests())
