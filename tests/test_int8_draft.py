"""The int8 self-draft (`speculation/int8_draft.py`): the policy drafting for itself with int8 weights.

Chain of invariants:
    int8_copy(model)          == the same network with every projection and the LM head replaced by its
                                 dequantized int8 weights, logits to fp32 rounding (eager, and every kernel that
                                 keeps activations fp32); on VNNI, with each projection's input rounded too
                                 (`small_gemm.quantize_activations`), to within a step of that rounding;
    it shares the embeddings and norms, and a later load_weights on the target leaves it as it was;
    the proposer rebuilds the copy after a weight sync, and only then (never stale, never rebuilt for nothing),
    at the call's first proposal (a call decoded plainly throughout rebuilds nothing), out of the planner's fits;
    its exactness (speculation on == off at temperature 0, chi-square at temperature 1, q a distribution)
    runs with every other proposer in tests/test_engine.py.
"""
from __future__ import annotations

import time

import pytest
import torch

from specrl.backends import BackendConfig
from specrl.engine.engine import EngineConfig, RolloutEngine
from specrl.kernels import small_gemm
from specrl.models.checkpoint import load_state_dict
from specrl.models.llama import LlamaModel, int8_kernels
from specrl.sampling import SamplingParams
from specrl.speculation.int8_draft import Int8DraftProposer

INTEGER = tuple(small_gemm.INTEGER_KERNELS)  # the kernels that round the activations to int8 too
WEIGHT_ONLY = pytest.mark.parametrize("kernel", [k for k in int8_kernels() if k not in INTEGER] + ["eager"])


def rounded_state(target_dir) -> dict[str, torch.Tensor]:
    """The checkpoint with every projection's weight (and the LM head) replaced by its int8 rounding."""
    state = load_state_dict(target_dir)
    for name in list(state):
        if name.endswith("_proj.weight"):
            q, scale = small_gemm.quantize_int8(state[name])
            state[name] = q.float() * scale.unsqueeze(1)
    head = state.get("lm_head.weight", state["model.embed_tokens.weight"])
    q, scale = small_gemm.quantize_int8(head)
    state["lm_head.weight"] = q.float() * scale.unsqueeze(1)
    return state


@WEIGHT_ONLY
def test_the_int8_copy_computes_the_network_with_rounded_weights(target_dir, kernel):
    """Rounding q, k, v (or gate, up) row by row is rounding the fused projection row by row: the same values."""
    model = LlamaModel.from_pretrained(target_dir, fast_path=kernel != "eager")
    draft = model.int8_copy(None if kernel == "eager" else kernel)
    reference = LlamaModel(model.cfg, rounded_state(target_dir), fast_path=False)
    tokens = torch.tensor([[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]])
    got, _ = draft.forward(tokens, draft.new_cache(2, 8))
    expected, _ = reference.forward(tokens, reference.new_cache(2, 8))
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    plain, _ = model.forward(tokens, model.new_cache(2, 8))
    assert not torch.allclose(got, plain, atol=1e-6)  # it is rounded
    assert draft.embed is model.embed and draft.final_norm is model.final_norm


class RoundedInputs:
    """A projection applied to its input as the VNNI kernel rounds it."""

    def __init__(self, projection):
        self.projection, self.bias, self.packed = projection, projection.bias, None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.projection(small_gemm.quantize_activations(x))


@pytest.mark.parametrize("kernel", [k for k in INTEGER if k in int8_kernels()])
def test_the_integer_copy_computes_the_network_with_rounded_weights_and_inputs(target_dir, kernel):
    model = LlamaModel.from_pretrained(target_dir)
    draft = model.int8_copy(kernel)
    reference = LlamaModel(model.cfg, rounded_state(target_dir), fast_path=False)
    reference.layers = [{name: RoundedInputs(part) if name in ("qkv", "o", "gate_up", "down") else part
                         for name, part in layer.items()} for layer in reference.layers]
    reference.lm_head = RoundedInputs(reference.lm_head)
    tokens = torch.tensor([[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]])
    got, _ = draft.forward(tokens, draft.new_cache(2, 8))
    expected, _ = reference.forward(tokens, reference.new_cache(2, 8))
    # an input within the last bit of a rounding boundary may round to the neighbouring step on one path: an
    # output moves by about a step (max |x| / 127 of its group) times a weight; a wrong layout or scale moves all
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)
    weight_only, _ = model.int8_copy("avx2").forward(tokens, model.new_cache(2, 8))
    assert not torch.allclose(got, weight_only, atol=1e-4)  # the inputs are rounded


def test_the_draft_is_rebuilt_after_a_weight_sync_and_only_then(target_dir, tmp_path):
    model = LlamaModel.from_pretrained(target_dir)
    proposer = Int8DraftProposer(model)
    engine = RolloutEngine(model, proposer=proposer, config=EngineConfig(num_speculative_tokens=3, adaptive=False))
    params = SamplingParams(max_tokens=6, seed=0, ignore_eos=True)
    first = proposer.model
    engine.generate([[1, 2, 3]], params)
    assert proposer.model is first  # same weights: nothing rebuilt

    state = load_state_dict(target_dir)
    state = {name: tensor * 1.5 if name.endswith("_proj.weight") else tensor for name, tensor in state.items()}
    engine.load_weights(state, version=1)
    assert proposer.model is first and first.layers[0]["down"].q is not None  # the old copy is untouched
    result = engine.generate([[1, 2, 3]], params)
    assert proposer.model is not first and proposer.rebuild_seconds > 0
    q, _ = small_gemm.quantize_int8(state["model.layers.0.mlp.down_proj.weight"])
    assert torch.equal(proposer.model.layers[0]["down"].q, q)
    assert result.spec.num_drafts > 0 and result.spec.acceptance_rate > 0.5  # drafts the new policy


def test_a_weight_sync_rebuilds_the_draft_at_its_first_proposal_and_the_planner_does_not_fit_the_rebuild(
        target_dir, monkeypatch):
    """A call's start builds nothing, so a call the planner decodes plainly throughout pays no rebuild (in GRPO on
    AVX2 most rollout calls are: ~0.1 s of a ~5 s call on SmolLM2); the first proposal after the sync rebuilds,
    the call's draft time counts it, and the step the planner fits leaves it out."""
    model = LlamaModel.from_pretrained(target_dir)
    proposer = Int8DraftProposer(model)
    engine = RolloutEngine(model, proposer=proposer, config=EngineConfig(num_speculative_tokens=3, adaptive=False))
    state = {name: t * 1.5 if name.endswith("_proj.weight") else t for name, t in load_state_dict(target_dir).items()}
    engine.load_weights(state, version=1)
    first = proposer.model
    proposer.start(torch.tensor([[1, 2, 3]]), torch.tensor([3]), SamplingParams())
    assert proposer.model is first

    make_copy = model.int8_copy

    def slow_copy(*args, **kwargs):
        time.sleep(0.3)
        return make_copy(*args, **kwargs)

    fitted = []
    observe = engine.planner.observe

    def recorded(batch, k, seconds, per_pos, **kwargs):
        fitted.append((seconds, kwargs["draft_seconds"]))
        return observe(batch, k, seconds, per_pos, **kwargs)

    monkeypatch.setattr(model, "int8_copy", slow_copy)
    monkeypatch.setattr(engine.planner, "observe", recorded)
    result = engine.generate([[1, 2, 3]], SamplingParams(max_tokens=6, seed=0, ignore_eos=True))
    assert proposer.model is not first and proposer.rebuild_seconds >= 0.3 and result.draft_seconds >= 0.3
    assert fitted and max(seconds for seconds, _ in fitted) < 0.3 and max(draft for _, draft in fitted) < 0.3


def test_k_left_unset_is_the_proposers_own_default_and_a_set_k_wins():
    """The self-draft is accepted ~0.97 per token on SmolLM2, so its chains may run to 8 (the controller still
    chooses per step, and turns speculation off where it does not pay); every other kind keeps 3."""
    assert BackendConfig(proposer="int8").speculative_tokens == 8
    assert BackendConfig(proposer="eagle3").speculative_tokens == 3
    assert BackendConfig(proposer="none").speculative_tokens == 0
    assert BackendConfig(proposer="int8", num_speculative_tokens=2).speculative_tokens == 2


def test_the_draft_drafts_on_from_the_targets_cache_and_never_runs_the_prompt(target_dir):
    """No prefill of its own: its first pass feeds one token per row (the one the target has not cached yet), later
    passes at most a step's emitted tokens (k + 1); a pass over the 7-token prompt would be 6 wide."""
    model = LlamaModel.from_pretrained(target_dir)
    proposer = Int8DraftProposer(model)
    widths = []
    forward = proposer.model.forward

    def recorded(ids, cache, *args, **kwargs):
        widths.append(ids.shape[1])
        return forward(ids, cache, *args, **kwargs)

    proposer.model.forward = recorded
    engine = RolloutEngine(model, proposer=proposer, config=EngineConfig(num_speculative_tokens=2, adaptive=False))
    result = engine.generate([[1, 2, 3, 4, 5, 6, 7]], SamplingParams(n=2, max_tokens=8, seed=0, ignore_eos=True))
    assert widths[0] == 1 and max(widths) <= 3 and result.spec.num_drafts > 0
