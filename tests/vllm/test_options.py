"""vLLM backend settings: speculative_config building, the lossy-acceptance guard, sampling mapping.

No engine starts here.
"""
from __future__ import annotations

import sys

import pytest

pytest.importorskip("vllm.sampling_params", reason="needs the vllm extra: pip install -e '.[vllm]'")

from specrl.backends import BackendConfig, make_backend  # noqa: E402
from specrl.backends.vllm import VLLMBackend, VLLMOptions  # noqa: E402
from specrl.backends.vllm import backend as backend_module  # noqa: E402
from specrl.backends.vllm.convert import finish_reason, to_vllm_sampling  # noqa: E402
from specrl.backends.vllm.options import speculative_config  # noqa: E402
from specrl.sampling import SamplingParams  # noqa: E402

pytestmark = pytest.mark.vllm


def test_proposers_map_onto_vllm_methods_with_k_and_ngram_window():
    ngram = speculative_config(BackendConfig(backend="vllm", proposer="ngram", num_speculative_tokens=4,
                                             ngram_max_n=5), VLLMOptions())
    assert ngram == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 5, "prompt_lookup_min": 1}
    draft = speculative_config(BackendConfig(backend="vllm", proposer="draft", model="tiny"),
                               VLLMOptions(draft_sample_method="probabilistic"))
    assert draft["method"] == "draft_model" and draft["model"].endswith("tiny-draft")
    assert draft["draft_sample_method"] == "probabilistic" and draft["num_speculative_tokens"] == 3


def test_no_proposer_or_k_zero_means_no_speculative_config():
    assert speculative_config(BackendConfig(backend="vllm"), VLLMOptions()) is None
    assert speculative_config(BackendConfig(backend="vllm", proposer="ngram", num_speculative_tokens=0),
                              VLLMOptions()) is None


def test_overrides_pass_through_for_methods_specrl_does_not_name():
    options = VLLMOptions(speculative_overrides={"method": "eagle3", "num_speculative_tokens": 5})
    spec = speculative_config(BackendConfig(backend="vllm", proposer="draft", model="tiny"), options)
    assert spec["method"] == "eagle3" and spec["num_speculative_tokens"] == 5


@pytest.mark.parametrize("lossy", [{"rejection_sample_method": "synthetic", "synthetic_acceptance_length": 2.5},
                                   {"synthetic_acceptance_rates": [0.9, 0.8, 0.7]}])
def test_lossy_acceptance_is_refused_unless_opted_into_by_name(lossy):
    config = BackendConfig(backend="vllm", proposer="ngram")
    with pytest.raises(ValueError, match="lossy_acceptance=True"):
        speculative_config(config, VLLMOptions(speculative_overrides=lossy))
    assert speculative_config(config, VLLMOptions(speculative_overrides=lossy, lossy_acceptance=True))


def test_lossless_acceptance_methods_need_no_opt_in():
    for method in ("standard", "block"):
        overrides = {"rejection_sample_method": method}
        assert speculative_config(BackendConfig(backend="vllm", proposer="ngram"),
                                  VLLMOptions(speculative_overrides=overrides))


def test_bad_options_fail_at_construction_naming_the_field():
    with pytest.raises(ValueError, match=r"vllm\.mode"):  # named as a train config writes it
        VLLMOptions(mode="threads")
    with pytest.raises(ValueError, match=r"vllm\.gpu_memory_utilization"):
        VLLMOptions(gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="draft_sample_method"):
        VLLMOptions(draft_sample_method="typical")


def test_a_speculative_engine_refuses_to_start_without_the_sampling_fix(monkeypatch):
    monkeypatch.setattr(backend_module, "plugin_is_registered", lambda: False)
    started = []
    monkeypatch.setattr(backend_module, "start_engine", lambda *a, **k: started.append(a))
    with pytest.raises(RuntimeError, match="vllm.general_plugins"):
        VLLMBackend(BackendConfig(backend="vllm", proposer="ngram"), VLLMOptions.for_tests())
    assert not started


def test_sampling_params_map_field_for_field_with_the_sampled_tokens_logprob():
    params = SamplingParams(n=4, temperature=0.7, top_p=0.9, top_k=0, max_tokens=33, stop=("\n",),
                            stop_token_ids=(7,), seed=3, ignore_eos=True)
    v = to_vllm_sampling(params)
    assert (v.n, v.temperature, v.top_p, v.max_tokens, v.seed, v.ignore_eos) == (4, 0.7, 0.9, 33, 3, True)
    assert v.top_k in (0, -1)  # vLLM's "all tokens"
    assert v.stop == ["\n"] and v.stop_token_ids == [7] and v.logprobs == 0
    assert to_vllm_sampling(SamplingParams(top_k=5)).top_k == 5


def test_an_aborted_request_is_an_error_not_a_silent_finish():
    assert finish_reason("stop") == "stop" and finish_reason("length") == "length"
    with pytest.raises(RuntimeError, match="abort"):
        finish_reason("abort")


def test_make_backend_names_the_extra_to_install_when_vllm_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` fail
    with pytest.raises(ImportError, match=r"pip install -e '\.\[vllm\]'"):
        make_backend(BackendConfig(backend="vllm"))


def test_block_verification_is_refused_naming_the_reason_and_token_verification_is_vllms_own():
    with pytest.raises(ValueError, match="verification=block is not available with backend=vllm"):
        speculative_config(BackendConfig(backend="vllm", proposer="ngram", verification="block"), VLLMOptions())
    spec = speculative_config(BackendConfig(backend="vllm", proposer="ngram", verification="token"), VLLMOptions())
    assert spec.get("rejection_sample_method", "standard") == "standard"
