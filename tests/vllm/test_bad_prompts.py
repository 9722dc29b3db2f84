"""Bad prompts on the vLLM backend are refused with a clear error before any work starts.

Each case is checked in `VLLMBackend.generate` (the context length) or in the shared
`encode_prompts` (empty prompts, ids outside the vocabulary) before the batch reaches
vLLM: the error names the prompt and the problem, the engine is never asked to generate,
and it still serves a normal prompt afterwards. One in-process engine serves the module.
"""
from __future__ import annotations

import pytest

pytest.importorskip("vllm.sampling_params", reason="needs the vllm extra: pip install -e '.[vllm]'")

from specrl.backends import BackendConfig, make_backend  # noqa: E402
from specrl.backends.vllm import VLLMOptions  # noqa: E402
from specrl.sampling import SamplingParams  # noqa: E402
from vllm_fixtures import PROMPTS, save_checkpoint  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
GREEDY = SamplingParams(temperature=0, max_tokens=24)
GOOD = PROMPTS[0]


@pytest.fixture(scope="module")
def backend(tmp_path_factory):
    path = tmp_path_factory.mktemp("vllm_bad_prompts")
    save_checkpoint(path, seed=0)
    b = make_backend(BackendConfig(backend="vllm", model=str(path)), VLLMOptions.for_tests())
    yield b
    b.close()


@pytest.fixture
def engine_calls(backend, monkeypatch):
    """Every batch the backend hands to vLLM's `LLM.generate` during the test (passed through)."""
    calls = []
    real = backend.llm.generate

    def spy(prompts, *args, **kwargs):
        calls.append(prompts)
        return real(prompts, *args, **kwargs)
    monkeypatch.setattr(backend.llm, "generate", spy)
    return calls


def assert_refused_then_serves(backend, engine_calls, prompts, params, message):
    """`prompts` raise a ValueError matching `message` without reaching vLLM; a normal prompt then generates."""
    with pytest.raises(ValueError, match=message):
        backend.generate(prompts, params)
    assert engine_calls == []
    result = backend.generate([GOOD], GREEDY)
    assert len(engine_calls) == 1 and result.completions[0].token_ids


def test_a_prompt_that_leaves_no_room_for_max_tokens_is_refused_naming_the_context(backend, engine_calls):
    room = backend.max_model_len - GREEDY.max_tokens
    message = (rf"prompt 1 is too long for the context: {room + 1} prompt tokens \+ max_tokens 24 > "
               rf"max_model_len {backend.max_model_len}")
    assert_refused_then_serves(backend, engine_calls, [GOOD, [5] * (room + 1)], GREEDY, message)


def test_a_prompt_longer_than_the_context_on_its_own_is_refused(backend, engine_calls):
    too_long = [5] * (backend.max_model_len + 10)
    assert_refused_then_serves(backend, engine_calls, [too_long], SamplingParams(temperature=0, max_tokens=1),
                               "prompt 0 is too long for the context")


def test_a_prompt_that_exactly_fills_the_context_is_served_to_the_last_token(backend):
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    result = backend.generate([[5] * (backend.max_model_len - 24)], params)
    assert len(result.completions[0].token_ids) == 24 and result.completions[0].finish_reason == "length"


@pytest.mark.parametrize("empty", [[], ""], ids=["no token ids", "empty text"])
def test_an_empty_prompt_is_refused_naming_the_prompt(backend, engine_calls, empty):
    assert_refused_then_serves(backend, engine_calls, [GOOD, empty], GREEDY, "prompt 1 is empty")


@pytest.mark.parametrize("bad_id", [40, 400, -1], ids=["vocab size", "far above", "negative"])
def test_a_token_id_outside_the_vocabulary_is_refused_naming_the_id_and_the_size(backend, engine_calls, bad_id):
    message = rf"prompt 0 has token ids outside the vocabulary \(size 40\): \[{bad_id}\]"
    assert_refused_then_serves(backend, engine_calls, [[5, bad_id, 6]], GREEDY, message)


def test_an_empty_prompt_list_is_refused_naming_it(backend, engine_calls):
    assert_refused_then_serves(backend, engine_calls, [], GREEDY, "the prompt list is empty")
