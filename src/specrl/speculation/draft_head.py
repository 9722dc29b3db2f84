"""Draft heads that read the target's hidden states: the part EAGLE-3 and MTP share.

A head is one decoder layer on top of features f fused from target hidden states (see
`head_layer` for the chain it drafts). It owns no embedding: token embeddings (and, for
MTP, the output head) are the target's, read from the live target model, so they follow
policy weight syncs. Variants differ only in three small maps, written per kind:

    fuse(target hidden)        -> f [.., H]                   which layers, how combined
    layer_input(f or g, emb)   -> (x [.., in], residual [.., H])
    logits(g)                  -> [.., V_out]                 V_out = draft_vocab_size or V

and in how they are saved (`eagle3.py`, `mtp.py`).

Shapes: B rows, T positions, H hidden size, S sequence length when training.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from specrl.models.checkpoint import ModelConfig, check_finite, read_config_json
from specrl.models.kv_cache import KVCache
from specrl.models.llama import LlamaModel, rope_tables
from specrl.speculation.head_layer import DraftDecoderLayer, HeadLinear, chain_rows


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's low/middle/high feature layers, as vLLM numbers them: the residual stream
    *entering* layer j (j = num_layers is the last layer's output). vLLM's default is
    (2, L/2, L-3); models too shallow for it use (1, L/2, L)."""
    if num_layers >= 6:
        return 2, num_layers // 2, num_layers - 3
    return 1, max(1, num_layers // 2), num_layers


def saved_head_kind(raw: dict) -> str | None:
    """The head kind a checkpoint's config.json declares (specrl's `specrl_head`, or vLLM's EAGLE-3
    architecture), or None when it is not a head."""
    return raw.get("specrl_head") or ("eagle3" if "Eagle3" in "".join(raw.get("architectures") or []) else None)


class DraftHead(nn.Module):
    kind = "head"
    reduced_vocabulary = False  # whether a fresh head may draft over a subset of the target's ids (`d2t`)

    def __init__(self, cfg: ModelConfig, target: LlamaModel, in_features: int):
        super().__init__()
        self.cfg = cfg
        self.target = target
        self.layer = DraftDecoderLayer(in_features, cfg.hidden_size, cfg.num_attention_heads,
                                       cfg.num_key_value_heads, cfg.head_dim, cfg.intermediate_size, cfg.rms_norm_eps)
        cos, sin = rope_tables(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.d2t: torch.Tensor | None = None  # [V_out] long: output id -> target id, None when V_out == V
        self.linears: list[HeadLinear] = []  # on the fast path (`use_fast_path`): the layers it packs

    # -- per kind ---------------------------------------------------------------------------
    hidden_layers: tuple[int, ...] = ()  # engine layer indices (see LlamaModel.forward) fed to `fuse`

    def fuse(self, hidden: dict[int, torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def layer_input(self, feature: torch.Tensor, emb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def logits(self, g: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @classmethod
    def load(cls, head_dir: Path, raw: dict, target: LlamaModel) -> "DraftHead":
        raise NotImplementedError

    @classmethod
    def from_target(cls, target: LlamaModel, d2t: torch.Tensor | None = None) -> "DraftHead":
        """A fresh head shaped like `target` (over the ids `d2t` where `reduced_vocabulary`)."""
        raise NotImplementedError

    # -- shared -----------------------------------------------------------------------------
    @classmethod
    def load_checked(cls, head_dir: str | Path, target: LlamaModel) -> "DraftHead":
        """Load a saved head of this class for `target`, in eval mode; another kind, vocabulary or width is an
        error that names it."""
        head_dir = Path(head_dir)
        raw = read_config_json(head_dir)
        saved = saved_head_kind(raw)
        if saved is None:
            raise ValueError(f"{head_dir}: not an EAGLE-3 or MTP head (architectures={raw.get('architectures')})")
        if saved != cls.kind:
            raise ValueError(f"{head_dir}: is a {saved} head, but proposer={cls.kind} was asked for")
        tc = target.cfg
        if raw.get("vocab_size") != tc.vocab_size:
            raise ValueError(f"draft/target vocabulary mismatch: head {head_dir} has vocab_size "
                             f"{raw.get('vocab_size')}, target {target.source} has {tc.vocab_size}")
        if raw.get("hidden_size") != tc.hidden_size:
            raise ValueError(f"{head_dir}: head hidden_size {raw.get('hidden_size')} != target's {tc.hidden_size}")
        head = cls.load(head_dir, raw, target)
        head.eval()
        return head

    @property
    def output_vocab_size(self) -> int:
        return self.cfg.output_vocab_size

    def use_fast_path(self, on: bool) -> None:
        """Draft with specrl's small-row kernel (as the target does when `on`; see HeadLinear)."""
        self.linears = [module for module in self.modules() if isinstance(module, HeadLinear)]
        for module in self.linears:
            module.fast = on

    def repack(self) -> bool:
        """Rebuild now the fast path's packed weights that changed (an optimizer step, a sync), which a pass
        would otherwise rebuild on first use: a proposer times this one-off work apart from drafting.
        Returns whether any was rebuilt."""
        return any([module.repack() for module in self.linears])  # a list: every module rebuilds

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return F.embedding(tokens, self.target.embed)

    def checkpoint_names(self) -> dict[str, str]:
        """Our parameter name -> the checkpoint's tensor name (per kind)."""
        raise NotImplementedError

    def checkpoint_state(self) -> dict[str, torch.Tensor]:
        """The tensors `save` writes, under the checkpoint's names: also what a weight sync sends."""
        own = self.state_dict()
        return {theirs: own[ours].detach().contiguous() for ours, theirs in self.checkpoint_names().items()}

    def check_checkpoint_state(self, state: dict[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
        """Check `state` (checkpoint names, any float dtype) fits this head -> the tensors under our names.
        A missing tensor, a shape that does not fit, or a NaN/inf value is an error naming `source`."""
        names = self.checkpoint_names()
        missing = [theirs for theirs in names.values() if theirs not in state]
        if missing:
            raise ValueError(f"{source}: {self.kind} checkpoint is missing tensors {missing}")
        check_finite({theirs: state[theirs] for theirs in names.values()}, source)
        own = self.state_dict()
        for ours, theirs in names.items():
            if tuple(state[theirs].shape) != tuple(own[ours].shape):
                raise ValueError(f"{source}: {self.kind} tensor '{theirs}' has shape {tuple(state[theirs].shape)}, "
                                 f"the head's config needs {tuple(own[ours].shape)}")
        return {ours: state[theirs] for ours, theirs in names.items()}

    def load_checkpoint_state(self, state: dict[str, torch.Tensor], source: str) -> None:
        """Replace the weights with `state` once `check_checkpoint_state` passes (else nothing is replaced)."""
        checked, own = self.check_checkpoint_state(state, source), self.state_dict()
        with torch.no_grad():
            for name, tensor in checked.items():
                own[name].copy_(tensor)

    def write(self, out_dir: Path, state: dict[str, torch.Tensor], fields: dict,
              dtype: torch.dtype = torch.float32) -> None:
        """model.safetensors with `state` (floating tensors stored as `dtype`; loaders compute in fp32),
        and config.json: a one-layer Llama config of the head's shape plus the kind's own `fields`."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        state = {name: t.to(dtype) if t.is_floating_point() else t for name, t in state.items()}
        save_file(state, str(out_dir / "model.safetensors"))
        c = self.cfg
        config = {
            "model_type": "llama", "specrl_head": self.kind, "hidden_size": c.hidden_size,
            "intermediate_size": c.intermediate_size, "num_attention_heads": c.num_attention_heads,
            "num_key_value_heads": c.num_key_value_heads, "head_dim": c.head_dim, "num_hidden_layers": 1,
            "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta,
            "max_position_embeddings": c.max_position_embeddings, "vocab_size": c.vocab_size, "hidden_act": "silu",
            "torch_dtype": str(dtype).removeprefix("torch."),
            **({"rope_scaling": c.rope_scaling} if c.rope_scaling else {}), **fields,
        }
        (out_dir / "config.json").write_text(json.dumps(config, indent=2))

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        c = self.cfg
        return KVCache.allocate(1, batch, c.num_key_value_heads, max_len, c.head_dim)

    def forward_cached(self, feature: torch.Tensor, next_tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Inference: feature [B, T, H] at positions cache.lens + t, next_tokens [B, T] -> g [B, T, H].

        Writes the head's cache; `cache.lens` is left for the caller to advance.
        """
        positions = cache.lens.unsqueeze(1) + torch.arange(feature.shape[1]).unsqueeze(0)
        if int(positions.max()) >= self.cfg.max_position_embeddings:
            raise ValueError(f"position {int(positions.max())} exceeds the head's context "
                             f"({self.cfg.max_position_embeddings} tokens)")
        cos, sin = self.rope_cos[positions].unsqueeze(1), self.rope_sin[positions].unsqueeze(1)
        x, residual = self.layer_input(feature, self.embed(next_tokens))
        return self.layer.forward_cached(x, residual, cache, cos, sin)

    def forward_train(self, hidden: dict[int, torch.Tensor], ids: torch.Tensor, pad_mask: torch.Tensor,
                      depth: int, first_anchor: int = 0) -> list[torch.Tensor]:
        """Training-time test: the head's output g of chain elements 1..depth at every position.

        hidden {layer: [B, S, H]} target hidden states of `ids` [B, S]; pad_mask [B, S] bool.
        Returns per depth j the features g [B, S, H] (`logits(g)` scores them); row i of depth j
        predicts ids[:, i + 2] for the anchor e = i - j + 1. Depths j >= 2 compute only the rows of
        anchors e >= `first_anchor` (see `head_layer.chain_rows`); their other rows are zeros, as
        are the rows i < j - 1, which have no anchor: the caller masks them.
        """
        B, S = ids.shape
        starts = chain_rows(S, depth, first_anchor)
        next_emb = self.embed(torch.cat([ids[:, 1:], ids[:, -1:]], dim=1))  # [B, S, H]: token i+1 at row i
        feature = self.fuse(hidden)
        past, out = [], []
        for j, a in enumerate(starts):
            if a == S:  # no anchor reaches this deep
                out += [feature.new_zeros(B, S, feature.shape[-1])] * (depth - j)
                break
            if j:  # element j+1 at row i continues the chain whose element j sat at row i - 1
                feature = feature[:, a - 1 - starts[j - 1]:S - 1 - starts[j - 1]]
            x, residual = self.layer_input(feature, next_emb[:, a:])
            cos, sin = self.rope_cos[a:S].view(1, 1, S - a, -1), self.rope_sin[a:S].view(1, 1, S - a, -1)
            feature, kv = self.layer.forward_train(x, residual, past, cos, sin, pad_mask, first_anchor)
            past.append(kv)
            out.append(F.pad(feature, (0, 0, a, 0)))
        return out
