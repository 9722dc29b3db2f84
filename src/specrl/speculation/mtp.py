"""A DeepSeek-V3-style multi-token-prediction (MTP) module on the target's last hidden state.

    x0      = eh_proj([enorm(emb(t_{s+1})); hnorm(h)])     [2H -> H]; h = the target's final
                                                             (normed) hidden state at s, then g
    g       = decoder layer(input_layernorm(x0), residual = x0)
    logits  = the target's lm_head(shared_head.norm(g))      full vocabulary, head shared

DeepSeek-V3 trains D = 1 module and, like vLLM's MTP proposer, drafting K > 1 tokens runs
that one module recursively on its own output g. Sequential modules beyond depth 1 are
not built here.

Checkpoint: config.json (a Llama config, num_hidden_layers 1, num_nextn_predict_layers 1,
architectures ["SpecrlLlamaMTP"]) and tensors under `model.layers.{L}.` as DeepSeek-V3
names them (enorm, hnorm, eh_proj, shared_head.norm, the layer's self_attn/mlp/norms), L =
the target's layer count. The embedding and output head are the target's and are not saved.
vLLM's `mtp` method only serves architectures that ship an MTP model class (DeepSeek-V3,
Qwen3-Next, MiMo, GLM-4.5, ...); a Llama target has none, so specrl's vLLM plugin registers
one for these heads (`specrl.backends.vllm.mtp_model.SpecrlLlamaMTP`).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from specrl.models.checkpoint import ModelConfig, load_state_dict, parse_config
from specrl.models.llama import LlamaModel
from specrl.speculation.draft_head import DraftHead
from specrl.speculation.head_layer import HeadLinear, RMSNorm
from specrl.speculation.head_proposer import HeadProposer
from specrl.speculation.plugin import ProposerKind

ARCHITECTURE = "SpecrlLlamaMTP"
_NAMES = {  # our parameter name -> DeepSeek-V3 name after the `model.layers.{L}.` prefix
    "enorm.weight": "enorm.weight",
    "hnorm.weight": "hnorm.weight",
    "eh_proj.weight": "eh_proj.weight",
    "input_layernorm.weight": "input_layernorm.weight",
    "layer.q_proj.weight": "self_attn.q_proj.weight",
    "layer.k_proj.weight": "self_attn.k_proj.weight",
    "layer.v_proj.weight": "self_attn.v_proj.weight",
    "layer.o_proj.weight": "self_attn.o_proj.weight",
    "layer.post_attention_layernorm.weight": "post_attention_layernorm.weight",
    "layer.gate_proj.weight": "mlp.gate_proj.weight",
    "layer.up_proj.weight": "mlp.up_proj.weight",
    "layer.down_proj.weight": "mlp.down_proj.weight",
    "shared_head_norm.weight": "shared_head.norm.weight",
}


class MTPHead(DraftHead):
    kind = "mtp"
    hidden_layers = (-1,)  # the target's final normed hidden state

    def __init__(self, cfg: ModelConfig, target: LlamaModel):
        super().__init__(cfg, target, in_features=cfg.hidden_size)
        H = cfg.hidden_size
        self.enorm = RMSNorm(H, cfg.rms_norm_eps)
        self.hnorm = RMSNorm(H, cfg.rms_norm_eps)
        self.eh_proj = HeadLinear(2 * H, H, bias=False)
        self.input_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.shared_head_norm = RMSNorm(H, cfg.rms_norm_eps)

    def fuse(self, hidden: dict[int, torch.Tensor]) -> torch.Tensor:
        return hidden[-1]

    def layer_input(self, feature, emb):
        x0 = self.eh_proj(torch.cat([self.enorm(emb), self.hnorm(feature)], dim=-1))
        return self.input_layernorm(x0), x0

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        return self.target.lm_head(self.shared_head_norm(g))

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def from_target(cls, target: LlamaModel, d2t: torch.Tensor | None = None) -> "MTPHead":
        """A fresh module: the layer from the target's last layer, eh_proj passing h through,
        shared_head.norm from the target's final norm. It drafts over the target's whole vocabulary."""
        if d2t is not None:
            raise ValueError("an MTP head drafts over the target's whole vocabulary: it takes no d2t")
        cfg = dataclasses.replace(target.cfg, num_hidden_layers=1, draft_vocab_size=None)
        head = cls(cfg, target)
        last, H = target.layers[-1], cfg.hidden_size
        head.layer.copy_from(last)
        with torch.no_grad():
            head.input_layernorm.weight.copy_(last["attn_norm"])
            head.eh_proj.weight.zero_()
            head.eh_proj.weight[:, H:] = torch.eye(H)
            head.shared_head_norm.weight.copy_(target.final_norm)
        return head

    def _prefix(self) -> str:
        return f"model.layers.{self.target.cfg.num_hidden_layers}."

    def checkpoint_names(self) -> dict[str, str]:
        return {ours: self._prefix() + theirs for ours, theirs in _NAMES.items()}

    def save(self, out_dir: Path, dtype: torch.dtype = torch.float32) -> None:
        """config.json + model.safetensors with DeepSeek-V3's MTP names (weights stored as `dtype`)."""
        self.write(out_dir, self.checkpoint_state(), {
            "architectures": [ARCHITECTURE], "num_nextn_predict_layers": 1,
            "target_num_hidden_layers": self.target.cfg.num_hidden_layers, "tie_word_embeddings": True,
        }, dtype)

    @classmethod
    def load(cls, head_dir: Path, raw: dict, target: LlamaModel) -> "MTPHead":
        cfg = parse_config(raw, Path(head_dir) / "config.json")
        head = cls(cfg, target)
        head.load_checkpoint_state(load_state_dict(Path(head_dir)),
                                   f"{head_dir} (an MTP head for a target with {target.cfg.num_hidden_layers} layers)")
        return head


PLUGIN = ProposerKind(
    "mtp", "a DeepSeek-V3-style MTP head on the target's last hidden state",
    lambda s: HeadProposer(MTPHead.load_checked(s.checkpoint, s.target)), checkpoint="mtp",
    # served by specrl's out-of-tree vLLM model class (backends/vllm/mtp_model.py)
    vllm=lambda v: {"method": "mtp", "model": str(v.checkpoint)}, training="head", head=MTPHead)
