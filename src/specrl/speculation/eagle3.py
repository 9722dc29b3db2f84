"""The EAGLE-3 head (Li et al. 2025), saved in the layout vLLM's `eagle3` method loads.

    f        = fc([h_low; h_mid; h_high])                          [3H -> H], target features
    x        = [input_layernorm(emb(t_{s+1})); hidden_norm(f)]     [2H]   (g replaces f after element 1)
    g        = decoder layer(x, residual = f)                       attention reads 2H, the rest is H
    logits   = lm_head(norm(g))                                     over the head's V_out ids

h_low/mid/high are the residual stream entering target layers `eagle_aux_hidden_state_layer_ids`
(vLLM's numbering; the engine's `hidden_layers` index is one less: the output of the layer before).

Checkpoint (vLLM's Eagle3LlamaForCausalLM / `LlamaForCausalLMEagle3`): config.json is a Llama
config with num_hidden_layers 1, draft_vocab_size, target_hidden_size and
eagle_config.eagle_aux_hidden_state_layer_ids; tensors fc, midlayer.*, norm, lm_head and,
for a reduced vocabulary, d2t [V_out] as *offsets* (target id = draft id + d2t[draft id]) and
t2d [V] bool. No embed_tokens: vLLM then shares the target's, as this engine does.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from specrl.models.checkpoint import ModelConfig, check_d2t, load_state_dict, parse_config
from specrl.models.llama import LlamaModel
from specrl.speculation.draft_head import DraftHead, default_aux_layers
from specrl.speculation.head_layer import HeadLinear, RMSNorm
from specrl.speculation.head_proposer import HeadProposer
from specrl.speculation.plugin import ProposerKind

ARCHITECTURE = "LlamaForCausalLMEagle3"
_LAYER_NAMES = {  # our parameter name -> vLLM's midlayer.* name
    "layer.q_proj.weight": "midlayer.self_attn.q_proj.weight",
    "layer.k_proj.weight": "midlayer.self_attn.k_proj.weight",
    "layer.v_proj.weight": "midlayer.self_attn.v_proj.weight",
    "layer.o_proj.weight": "midlayer.self_attn.o_proj.weight",
    "layer.post_attention_layernorm.weight": "midlayer.post_attention_layernorm.weight",
    "layer.gate_proj.weight": "midlayer.mlp.gate_proj.weight",
    "layer.up_proj.weight": "midlayer.mlp.up_proj.weight",
    "layer.down_proj.weight": "midlayer.mlp.down_proj.weight",
    "input_layernorm.weight": "midlayer.input_layernorm.weight",
    "hidden_norm.weight": "midlayer.hidden_norm.weight",
    "fc.weight": "fc.weight",
    "norm.weight": "norm.weight",
    "lm_head.weight": "lm_head.weight",
}


def engine_layers(aux_layers: tuple[int, ...]) -> tuple[int, ...]:
    """vLLM's aux layer ids (the stream entering layer j) -> the engine's `hidden_layers` (layer j-1's output)."""
    return tuple(sorted({j - 1 for j in aux_layers}))


class Eagle3Head(DraftHead):
    kind = "eagle3"
    reduced_vocabulary = True

    def __init__(self, cfg: ModelConfig, target: LlamaModel, aux_layers: tuple[int, ...]):
        super().__init__(cfg, target, in_features=2 * cfg.hidden_size)
        H = cfg.hidden_size
        self.aux_layers = tuple(aux_layers)  # vLLM numbering
        self.hidden_layers = engine_layers(self.aux_layers)
        self.fc = HeadLinear(len(self.aux_layers) * H, H, bias=False)
        self.input_layernorm = RMSNorm(H, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.norm = RMSNorm(H, cfg.rms_norm_eps)
        self.lm_head = HeadLinear(H, cfg.output_vocab_size, bias=False)

    def fuse(self, hidden: dict[int, torch.Tensor]) -> torch.Tensor:
        return self.fc(torch.cat([hidden[j - 1] for j in self.aux_layers], dim=-1))

    def layer_input(self, feature, emb):
        return torch.cat([self.input_layernorm(emb), self.hidden_norm(feature)], dim=-1), feature

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(g))

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def from_target(cls, target: LlamaModel, d2t: torch.Tensor | None = None,
                    aux_layers: tuple[int, ...] | None = None) -> "Eagle3Head":
        """A fresh head shaped like the target, initialised from it where that helps:
        the layer from the target's last layer (its attention reading the hidden half of x),
        fc passing h_high through, norm and lm_head (rows d2t) from the target's."""
        tc = target.cfg
        cfg = dataclasses.replace(tc, num_hidden_layers=1, draft_vocab_size=None if d2t is None else len(d2t),
                                  tie_word_embeddings=False)
        head = cls(cfg, target, aux_layers or default_aux_layers(tc.num_hidden_layers))
        H, last = tc.hidden_size, target.layers[-1]
        head.layer.copy_from(last, column=H)
        with torch.no_grad():
            head.hidden_norm.weight.copy_(last["attn_norm"])
            head.fc.weight.zero_()
            head.fc.weight[:, -H:] = torch.eye(H)
            head.norm.weight.copy_(target.final_norm)
            rows = target.lm_head.weight
            head.lm_head.weight.copy_(rows if d2t is None else rows[d2t])
        head.d2t = d2t
        return head

    def checkpoint_names(self) -> dict[str, str]:
        return _LAYER_NAMES

    def checkpoint_state(self) -> dict[str, torch.Tensor]:
        """vLLM's EAGLE-3 tensors, with d2t (as offsets) and t2d for a reduced vocabulary."""
        state = super().checkpoint_state()
        if self.d2t is not None:
            state["d2t"] = (self.d2t - torch.arange(len(self.d2t))).long()
            t2d = torch.zeros(self.cfg.vocab_size, dtype=torch.bool)
            t2d[self.d2t] = True
            state["t2d"] = t2d
        return state

    def _d2t(self, state: dict[str, torch.Tensor], source: str) -> torch.Tensor | None:
        """The checked draft-to-target id map of a reduced vocabulary (stored as offsets), else None."""
        cfg = self.cfg
        if not cfg.draft_vocab_size or cfg.draft_vocab_size == cfg.vocab_size:
            return None
        if "d2t" not in state:
            raise ValueError(f"{source}: draft_vocab_size {cfg.draft_vocab_size} needs a 'd2t' tensor")
        offsets = state["d2t"]
        if offsets.is_floating_point() or offsets.dim() != 1 or offsets.numel() != cfg.draft_vocab_size:
            raise ValueError(f"{source}: d2t must be {cfg.draft_vocab_size} integer offsets, got "
                             f"{offsets.dtype} of shape {tuple(offsets.shape)}")
        return check_d2t(offsets.long() + torch.arange(cfg.draft_vocab_size), cfg.draft_vocab_size,
                         cfg.vocab_size, source)

    def check_checkpoint_state(self, state: dict[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
        self._d2t(state, source)
        return super().check_checkpoint_state(state, source)

    def load_checkpoint_state(self, state: dict[str, torch.Tensor], source: str) -> None:
        super().load_checkpoint_state(state, source)
        self.d2t = self._d2t(state, source)

    def save(self, out_dir: Path, dtype: torch.dtype = torch.float32) -> None:
        """config.json + model.safetensors in vLLM's EAGLE-3 layout (weights stored as `dtype`)."""
        c = self.cfg
        self.write(out_dir, self.checkpoint_state(), {
            "architectures": [ARCHITECTURE], "draft_vocab_size": c.output_vocab_size,
            "target_hidden_size": c.hidden_size, "tie_word_embeddings": False,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(self.aux_layers), "use_aux_hidden_state": True},
        }, dtype)

    @classmethod
    def load(cls, head_dir: Path, raw: dict, target: LlamaModel) -> "Eagle3Head":
        cfg = parse_config(raw, Path(head_dir) / "config.json")
        aux = tuple((raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
                    or default_aux_layers(target.cfg.num_hidden_layers))
        bad = [j for j in aux if not 1 <= j <= target.cfg.num_hidden_layers]
        if bad:
            raise ValueError(f"{head_dir}: eagle_aux_hidden_state_layer_ids {list(aux)} must lie in "
                             f"1..{target.cfg.num_hidden_layers} for this target (layer 0, the embeddings, is not supported)")
        head = cls(cfg, target, aux)
        head.load_checkpoint_state(load_state_dict(Path(head_dir)), str(head_dir))
        return head


PLUGIN = ProposerKind(
    "eagle3", "an EAGLE-3 head on the target's low, middle and high hidden states",
    lambda s: HeadProposer(Eagle3Head.load_checked(s.checkpoint, s.target)), checkpoint="eagle3",
    vllm=lambda v: {"method": "eagle3", "model": str(v.checkpoint)},  # specrl saves EAGLE-3 heads in vLLM's layout
    training="head", head=Eagle3Head)
