"""Model catalogue: parameter and KV counts against the published totals."""
import pytest

from specrl.sim.drafters import get_drafter
from specrl.sim.models import active_params, get_model, kv_bytes_per_token, total_params

PUBLISHED = {  # total, active (billions), KV bytes per token (bf16)
    "llama-3.1-8b": (8.03, 8.03, 131072),
    "qwen3-8b": (8.19, 8.19, 147456),
    "qwen3-235b-a22b": (235.0, 22.2, 192512),
    "deepseek-v3": (671.0, 37.6, 70272),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_match_published_within_one_percent(name):
    total, active, kv = PUBLISHED[name]
    m = get_model(name)
    assert total_params(m) / 1e9 == pytest.approx(total, rel=0.01)
    assert active_params(m) / 1e9 == pytest.approx(active, rel=0.01)
    assert kv_bytes_per_token(m) == kv


def test_specrl_cpu_models_have_their_documented_sizes():
    assert total_params(get_model("tiny")) == pytest.approx(0.40e6, rel=0.05)
    assert total_params(get_model("smollm2-135m")) == pytest.approx(134.5e6, rel=0.01)


def test_ngram_drafter_has_no_device_network_and_eagle3_is_a_small_fraction():
    target = get_model("qwen3-8b")
    assert get_drafter("ngram", target).network is None
    eagle3 = get_drafter("eagle3", target).network
    assert total_params(eagle3) < 0.1 * total_params(target)


def test_unknown_model_names_fail_with_the_known_list():
    with pytest.raises(ValueError, match="known"):
        get_model("gpt-9")
