"""specrl's MTP head as a vLLM model class, so vLLM's `mtp` speculative method drafts with it.

vLLM serves MTP drafts only for architectures that ship an MTP model class (DeepSeek-V3,
MiMo, Qwen3-Next, ...); a Llama target has none. `SpecrlLlamaMTP` is that class for the
heads specrl trains (`specrl.speculation.mtp`), registered out of tree with vLLM's
`ModelRegistry` by specrl's vLLM plugin (`specrl.backends.vllm_plugin.register`), which vLLM
runs in every process, its engine core included. The same math as the embedded engine's
`MTPHead`, on vLLM's layers (paged attention, its RMSNorm and rotary embedding):

    x0      = eh_proj([enorm(emb(t_{s+1})); hnorm(h_s)])      h_s: the target's final normed hidden state
    g       = Llama decoder layer(x0)                          (input_layernorm inside, residual x0)
    logits  = the target's lm_head(shared_head.norm(g))
and drafts past the first run the layer again on its own g, as vLLM's MTP proposer does
(`forward` returns g for both uses). The embedding and lm_head are the target's: the class
owns neither, and vLLM's proposer gives it the target's at load (`embed_tokens`,
`lm_head`), as it does for every MTP draft. Until then the class cannot run, so a load
that did not share them fails loudly instead of drafting from uninitialised weights.

vLLM picks the `mtp` method only for a draft config whose model_type is an MTP type; a
specrl head's config.json says `llama` (its loaders read it as one). `mark_mtp_draft`,
passed to vLLM as the target's `hf_overrides`, which vLLM also applies to the draft's
config, re-types a config whose architecture is `SpecrlLlamaMTP`, and leaves every other
config as it is.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.model_executor.models.llama import LlamaDecoderLayer

from specrl.speculation.mtp import ARCHITECTURE

MTP_MODEL_TYPE = "mtp"  # one of vLLM's MTP model types (config/speculative.py MTPModelTypes), the generic one
# checkpoint tensor (q/k/v, gate/up) -> vLLM's fused parameter and its shard
_STACKED = ((".qkv_proj", ".q_proj", "q"), (".qkv_proj", ".k_proj", "k"), (".qkv_proj", ".v_proj", "v"),
            (".gate_up_proj", ".gate_proj", 0), (".gate_up_proj", ".up_proj", 1))


def mark_mtp_draft(config):
    """vLLM `hf_overrides`: type a specrl MTP head's config as an MTP draft; any other config unchanged."""
    if ARCHITECTURE in (getattr(config, "architectures", None) or []):
        config.model_type = MTP_MODEL_TYPE
    return config


class SharedHead(nn.Module):
    """DeepSeek-V3's `shared_head`, norm only: the head itself is the target's lm_head."""

    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.norm = RMSNorm(hidden, eps=eps)


class SpecrlMTPLayer(LlamaDecoderLayer):
    """The MTP module: a Llama decoder layer (self_attn, mlp and their norms, checkpoint names as they
    are) with DeepSeek-V3's input fusion (enorm, hnorm, eh_proj) and shared_head.norm."""

    def __init__(self, vllm_config: VllmConfig, prefix: str):
        super().__init__(vllm_config, prefix=prefix)
        config = vllm_config.model_config.hf_config
        H, eps = config.hidden_size, config.rms_norm_eps
        self.enorm = RMSNorm(H, eps=eps)
        self.hnorm = RMSNorm(H, eps=eps)
        self.eh_proj = nn.Linear(2 * H, H, bias=False)
        self.shared_head = SharedHead(H, eps)

    def predict(self, inputs_embeds: torch.Tensor, positions: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
        """[T, H] token embeddings, positions [T], previous hidden states [T, H] -> g [T, H]."""
        x0 = self.eh_proj(torch.cat([self.enorm(inputs_embeds), self.hnorm(previous)], dim=-1))
        hidden, residual = self.forward(positions, x0, None)
        return hidden + residual


class SpecrlMTPPredictor(nn.Module):
    """`model.layers.{L}`: the one MTP layer, numbered after the target's L layers as its checkpoint names it
    (so its attention's KV-cache name differs from every target layer's); `embed_tokens` is set by vLLM."""

    def __init__(self, vllm_config: VllmConfig, prefix: str):
        super().__init__()
        index = vllm_config.speculative_config.target_model_config.hf_config.num_hidden_layers
        self.index = str(index)
        self.layers = nn.ModuleDict({self.index: SpecrlMTPLayer(vllm_config, prefix=f"{prefix}.layers.{index}")})

    @property
    def layer(self) -> SpecrlMTPLayer:
        return self.layers[self.index]


class SpecrlLlamaMTP(nn.Module):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        self.config = vllm_config.model_config.hf_config
        self.model = SpecrlMTPPredictor(vllm_config, prefix=f"{prefix}.model" if prefix else "model")
        self.logits_processor = LogitsProcessor(self.config.vocab_size)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor, hidden_states: torch.Tensor,
                intermediate_tensors=None, inputs_embeds: torch.Tensor | None = None,
                spec_step_idx: int = 0) -> torch.Tensor:
        if inputs_embeds is None:
            inputs_embeds = self.model.embed_tokens(input_ids)
        return self.model.layer.predict(inputs_embeds, positions, hidden_states)

    def compute_logits(self, hidden_states: torch.Tensor, spec_step_idx: int = 0) -> torch.Tensor | None:
        return self.logits_processor(self.lm_head, self.model.layer.shared_head.norm(hidden_states))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """The head's tensors under their checkpoint names; q/k/v and gate/up go into vLLM's fused
        parameters. A tensor the class has no place for is an error that names it."""
        params = dict(self.named_parameters())
        loaded = set()
        for name, tensor in weights:
            for fused, part, shard in _STACKED:
                if part in name:
                    name = name.replace(part, fused)
                    params[name].weight_loader(params[name], tensor, shard)
                    break
            else:
                if name not in params:
                    raise ValueError(f"{ARCHITECTURE}: the checkpoint's tensor {name!r} has no place in the model "
                                     f"(expected names: {sorted(params)[:4]} ...)")
                getattr(params[name], "weight_loader", default_weight_loader)(params[name], tensor)
            loaded.add(name)
        return loaded
