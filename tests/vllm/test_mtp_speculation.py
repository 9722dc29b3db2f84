"""vLLM drafts with specrl's MTP heads (method mtp, through specrl's out-of-tree `SpecrlLlamaMTP`)
as the embedded engine does.

Chain of invariants:
  1. at temperature 0, vLLM with the head emits the same tokens as the embedded engine with it
     (and so as no speculation);
  2. greedy drafts are deterministic, so both engines accept about the same number of them
     (within 0.15 tokens per step): a head read with the wrong norms, input order or layer would
     accept far fewer in vLLM;
  3. a head refitted into the running engine (what online adaptation sends each version) drafts
     as the embedded engine does with the same weights;
  4. at temperature 1 the sampled tokens' mean logprob matches plain sampling (z-score).
One in-process engine per module.
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
from specrl.speculation.mtp import MTPHead  # noqa: E402
from vllm_fixtures import PROMPTS, completion_means, save_checkpoint, two_sample_z  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
GREEDY = SamplingParams(temperature=0, max_tokens=24)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    target = tmp_path_factory.mktemp("mtp_target")
    save_checkpoint(target, layers=2, seed=0)
    head_dir = tmp_path_factory.mktemp("mtp_head")
    # initialised from the target (its last layer, eh_proj passing h through): it accepts about half its drafts
    head = MTPHead.from_target(LlamaModel.from_pretrained(target))
    head.save(head_dir)
    common = dict(model=str(target), proposer="mtp", draft=str(head_dir), num_speculative_tokens=3)
    backend = make_backend(BackendConfig(backend="vllm", **common), VLLMOptions.for_tests())
    yield common, backend, head
    backend.close()


def test_vllm_drafts_with_the_mtp_head_like_the_embedded_engine(setup):
    common, backend, _ = setup
    embedded = make_backend(BackendConfig(adaptive=False, **common)).generate(PROMPTS, GREEDY)
    plain = make_backend(BackendConfig(model=common["model"])).generate(PROMPTS, GREEDY)
    served = backend.generate(PROMPTS, GREEDY)
    assert [c.token_ids for c in served.completions] == [c.token_ids for c in embedded.completions] \
        == [c.token_ids for c in plain.completions]
    assert served.spec.num_accepted_tokens > 10
    assert abs(served.spec.acceptance_length - embedded.spec.acceptance_length) < 0.15, \
        (served.spec.acceptance_length, embedded.spec.acceptance_length)


def test_a_refitted_mtp_head_drafts_as_the_embedded_engine_with_it(setup, tmp_path):
    common, backend, head = setup
    before = backend.generate(PROMPTS, GREEDY)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in head.layer.parameters():
            p.add_(0.02 * torch.randn_like(p))
    head.save(tmp_path / "moved")
    moved = make_backend(BackendConfig(adaptive=False, **dict(common, draft=str(tmp_path / "moved")))).generate(
        PROMPTS, GREEDY)
    backend.sync_weights(load_state_dict(common["model"]), version=1, draft=head.checkpoint_state())
    refitted = backend.generate(PROMPTS, GREEDY)
    assert [c.token_ids for c in refitted.completions] == [c.token_ids for c in moved.completions]
    assert abs(refitted.spec.acceptance_length - moved.spec.acceptance_length) < 0.15
    assert refitted.spec.num_accepted_tokens != before.spec.num_accepted_tokens  # the refit took effect
    assert all(c.versions == [1] * len(c.token_ids) for c in refitted.completions)


def test_mtp_sampling_at_temperature_one_keeps_the_target_distribution(setup):
    common, backend, _ = setup
    params = SamplingParams(temperature=1.0, max_tokens=16, n=24, seed=7)
    speculative = backend.generate(PROMPTS, params)
    plain = make_backend(BackendConfig(model=common["model"])).generate(PROMPTS, params)
    assert speculative.spec.num_accepted_tokens > 0
    assert two_sample_z(completion_means(speculative), completion_means(plain)) < 4
