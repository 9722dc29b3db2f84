"""The embedded rollout engine: batched, speculative, exact.

One `generate` call:
    1. prefill each distinct prompt once (all but its last token), then copy its KV
       rows n times (the GRPO group shares one prefill);
    2. loop while rows are live:
         k      = controller.choose(live batch)          (0 = plain decoding)
         drafts = proposer.propose(context, k)            [B, k]
         logits = target.forward([last, drafts])          [B, k+1, V]
         p      = sampling_distribution(logits)           temperature / top-k / top-p
         tokens, num_emitted = verify(drafts, q, p)       exact; k = 0 is plain sampling
         proposer.observe(target hidden states)           heads that read them (EAGLE-3, MTP)
         advance each row's cache by num_emitted, record every emitted token's logprob
         under p and the weight version, apply stop rules, and drop finished rows.
The live batch drains as rows finish, as RL rollouts do, and K adapts to it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from specrl.engine.adaptive import SpeculationController
from specrl.engine.model import LlamaModel
from specrl.engine.sampling import SamplingParams, sampling_distribution
from specrl.spec.proposer import Proposer, ProposalContext
from specrl.spec.verify import verify
from specrl.telemetry.spec_stats import SpecStats


@dataclass(frozen=True)
class EngineConfig:
    """Settings of the embedded engine."""

    num_speculative_tokens: int = 3  # K, the most drafts verified per step (0 = never speculate)
    adaptive: bool = True  # choose K per step from the live batch and measured acceptance / cost
    max_model_len: int | None = None  # prompt + generation cap; None = the model's context

    def __post_init__(self):
        if self.num_speculative_tokens < 0:
            raise ValueError(f"num_speculative_tokens (K) must be >= 0, got {self.num_speculative_tokens}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")


@dataclass
class Completion:
    """One sampled response."""

    prompt_index: int
    sample_index: int  # 0..n-1 within its prompt's group
    token_ids: list[int]
    logprobs: list[float]  # per token, under the distribution it was sampled from
    versions: list[int]  # per token, the policy weight version that produced it
    finish_reason: str  # "stop" (EOS, stop token or stop string) or "length"
    text: str | None = None  # decoded response (cut before a matched stop string), when a tokenizer is set


@dataclass
class GenerateResult:
    completions: list[Completion]  # prompt-major: prompt 0's n samples, then prompt 1's, ...
    spec: SpecStats
    seconds: float
    steps: int  # target forward passes after prefill
    k_histogram: dict[int, int] = field(default_factory=dict)  # steps run with each K
    draft_seconds: float = 0.0  # time spent inside the proposer (start, observe, propose)

    @property
    def num_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.completions)


class RolloutEngine:
    def __init__(self, model: LlamaModel, tokenizer=None, proposer: Proposer | None = None,
                 config: EngineConfig = EngineConfig()):
        self.model = model
        self.tokenizer = tokenizer
        self.proposer = proposer
        self.config = config
        self.version = 0
        max_k = config.num_speculative_tokens if proposer is not None else 0
        self.controller = SpeculationController(max_k=max_k, adaptive=config.adaptive)
        self.max_model_len = min(config.max_model_len or model.cfg.max_position_embeddings,
                                 model.cfg.max_position_embeddings)

    def load_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Weight sync: replace the policy's weights (Hugging Face names) and stamp a new version."""
        self.model.load_weights(state)
        self.version = version

    # -- input handling ---------------------------------------------------------------
    def _encode(self, prompts: list) -> list[list[int]]:
        encoded = []
        for i, prompt in enumerate(prompts):
            if isinstance(prompt, str):
                if self.tokenizer is None:
                    raise ValueError("string prompts need a tokenizer; pass token ids or give the engine a tokenizer")
                prompt = self.tokenizer.encode(prompt, add_special_tokens=False)
            prompt = list(prompt)
            if not prompt:
                raise ValueError(f"prompt {i} is empty")
            bad = [t for t in prompt if not 0 <= t < self.model.cfg.vocab_size]
            if bad:
                raise ValueError(f"prompt {i} has token ids outside the vocabulary (size {self.model.cfg.vocab_size}): {bad[:5]}")
            encoded.append(prompt)
        return encoded

    def _check_context(self, prompts: list[list[int]], params: SamplingParams) -> None:
        for i, prompt in enumerate(prompts):
            need = len(prompt) + params.max_tokens + self.controller.max_k
            if need > self.max_model_len:
                raise ValueError(
                    f"prompt {i} is too long for the context: {len(prompt)} prompt tokens + max_tokens "
                    f"{params.max_tokens} + K {self.controller.max_k} = {need} > max_model_len {self.max_model_len}"
                )

    # -- generation -------------------------------------------------------------------
    @torch.inference_mode()
    def generate(self, prompts: list, params: SamplingParams = SamplingParams()) -> GenerateResult:
        start = time.perf_counter()
        prompts = self._encode(prompts)
        self._check_context(prompts, params)
        generator = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.model.cfg.eos_token_ids))
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None and not params.ignore_eos:
            stop_ids.add(self.tokenizer.eos_token_id)

        P, n = len(prompts), params.n
        lengths = torch.tensor([len(p) for p in prompts])
        width = int(lengths.max()) + params.max_tokens + self.controller.max_k + 1
        tokens = torch.zeros(P, width, dtype=torch.long)  # [P, S]
        for i, p in enumerate(prompts):
            tokens[i, : len(p)] = torch.tensor(p)

        layers = self.proposer.hidden_layers if self.proposer is not None else ()
        cache = self.model.new_cache(P, width)
        hidden = {}
        if int(lengths.max()) > 1:
            _, hidden = self.model.forward(tokens[:, : int(lengths.max()) - 1], cache, hidden_layers=layers)
        cache.lens = lengths - 1
        draft_seconds = 0.0
        if self.proposer is not None:
            draft_start = time.perf_counter()
            self.proposer.start(tokens, lengths, params)
            if hidden:
                self.proposer.observe(hidden, torch.zeros_like(lengths), lengths - 1, tokens)
            draft_seconds += time.perf_counter() - draft_start
        group = torch.arange(P).repeat_interleave(n)  # [B] prompt of each row
        cache.select_rows(group)
        if self.proposer is not None:
            self.proposer.select_rows(group)
        tokens, num_tokens = tokens[group], lengths[group]

        rows = torch.arange(P * n)  # output slot of each live row
        prompt_len = num_tokens.clone()  # [B]
        token_lp = torch.zeros(tokens.shape)  # [B, S] logprob of each generated token, aligned with `tokens`
        stop_tensor = torch.tensor(sorted(stop_ids), dtype=torch.long)
        outputs: list[Completion | None] = [None] * (P * n)
        spec, k_hist, steps = SpecStats(), {}, 0
        verify_seconds = None  # the last step's time outside the proposer

        while rows.numel():
            B = rows.numel()
            step_start = time.perf_counter()
            k = self.controller.choose(B)
            last = tokens[torch.arange(B), num_tokens - 1].unsqueeze(1)  # [B, 1]
            step_draft = 0.0
            if k:
                ctx = ProposalContext(tokens, num_tokens, params, generator, self.model.cfg.vocab_size,
                                      groups=rows // n, verify_seconds=verify_seconds)
                draft_start = time.perf_counter()
                proposal = self.proposer.propose(ctx, k)
                step_draft += time.perf_counter() - draft_start
                feed = torch.cat([last, proposal.tokens], dim=1)  # [B, k+1]
            else:
                feed = last
            logits, hidden = self.model.forward(feed, cache, hidden_layers=layers)
            probs, logprobs = sampling_distribution(logits, params)  # [B, k+1, V]
            drafts = proposal.tokens if k else feed[:, :0]
            emitted, num_emitted = verify(drafts, proposal.probs if k else None, probs, generator)
            cache.lens += num_emitted
            accepted = num_emitted - 1
            per_pos = [int((accepted > i).sum()) for i in range(k)]
            spec.record(B, k, per_pos)
            k_hist[k] = k_hist.get(k, 0) + 1
            steps += 1

            # Append the emitted tokens in one scatter (slots past each row's count hold junk that
            # is never read), then cut each row at its first stop token or at max_tokens.
            emitted_lp = logprobs.gather(-1, emitted.clamp_min(0).unsqueeze(-1)).squeeze(-1)  # [B, k+1]
            slots = num_tokens.unsqueeze(1) + torch.arange(k + 1)  # [B, k+1]
            tokens.scatter_(1, slots, emitted)
            token_lp.scatter_(1, slots, emitted_lp)
            if hidden:  # the target's states at the verified positions: the head catches up on them
                draft_start = time.perf_counter()
                self.proposer.observe(hidden, num_tokens - 1, num_emitted, tokens)
                step_draft += time.perf_counter() - draft_start
            keep_n, stopped = self._tokens_to_keep(emitted, num_emitted, num_tokens - prompt_len, stop_tensor, params)
            if params.stop:
                keep_n, stopped = self._apply_stop_strings(tokens, num_tokens, prompt_len, keep_n, stopped, params)
            num_tokens += keep_n
            done = stopped | (num_tokens - prompt_len >= params.max_tokens)
            step_seconds = time.perf_counter() - step_start
            self.controller.observe(B, k, step_seconds, per_pos, draft_seconds=step_draft)
            draft_seconds += step_draft
            verify_seconds = step_seconds - step_draft
            if done.any():
                for b in done.nonzero().flatten().tolist():
                    slot = int(rows[b])
                    span = slice(int(prompt_len[b]), int(num_tokens[b]))
                    ids = tokens[b, span].tolist()
                    outputs[slot] = Completion(
                        prompt_index=slot // n, sample_index=slot % n, token_ids=ids,
                        logprobs=token_lp[b, span].tolist(), versions=[self.version] * len(ids),
                        finish_reason="stop" if stopped[b] else "length", text=self._text(ids, params))
                keep_t = (~done).nonzero().flatten()
                rows, tokens, num_tokens = rows[keep_t], tokens[keep_t], num_tokens[keep_t]
                prompt_len, token_lp = prompt_len[keep_t], token_lp[keep_t]
                cache.select_rows(keep_t)
                if self.proposer is not None:
                    self.proposer.select_rows(keep_t)
        return GenerateResult(outputs, spec, time.perf_counter() - start, steps, k_hist, draft_seconds)

    @staticmethod
    def _tokens_to_keep(emitted, num_emitted, generated, stop_tensor, params: SamplingParams):
        """Per row: how many of this step's emitted tokens to keep, and whether a stop token ended it.

        Example: emitted [5, 2, 7, -1], num_emitted 3, stop id 2, room for 10 more tokens
            -> keep 2 (the stop token is kept), stopped True.
        """
        width = emitted.shape[1]
        position = torch.arange(width).unsqueeze(0)  # [1, k+1]
        is_stop = torch.isin(emitted, stop_tensor) & (position < num_emitted.unsqueeze(1))
        first_stop = torch.where(is_stop.any(1), is_stop.long().argmax(1), width)  # [B]
        room = params.max_tokens - generated  # [B]
        keep_n = torch.minimum(torch.minimum(num_emitted, first_stop + 1), room)
        return keep_n, first_stop < keep_n

    def _apply_stop_strings(self, tokens, num_tokens, prompt_len, keep_n, stopped, params: SamplingParams):
        """Cut rows whose text now contains a stop string at the token that completed it."""
        window = self._stop_window(params)
        for b in range(tokens.shape[0]):
            base = int(num_tokens[b])
            for j in range(int(keep_n[b])):
                end = base + j + 1
                tail = tokens[b, max(int(prompt_len[b]), end - window): end].tolist()
                if self._stop_string_at(tail, params) is not None:
                    keep_n[b], stopped[b] = j + 1, True
                    break
        return keep_n, stopped

    @staticmethod
    def _stop_window(params: SamplingParams) -> int:
        """Tokens to decode to see a stop string completed by the newest token (each token is >= 1 character)."""
        return max(len(s) for s in params.stop) + 1

    def _stop_string_at(self, out: list[int], params: SamplingParams) -> int | None:
        """Character index of the first stop string in the decoded response, if any."""
        if self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer")
        text = self.tokenizer.decode(out, skip_special_tokens=False)
        hits = [text.find(s) for s in params.stop if s in text]
        return min(hits) if hits else None

    def _text(self, out: list[int], params: SamplingParams) -> str | None:
        if self.tokenizer is None:
            return None
        text = self.tokenizer.decode(out, skip_special_tokens=True)
        if params.stop:
            cut = self._stop_string_at(out, params)
            if cut is not None:
                text = self.tokenizer.decode(out, skip_special_tokens=False)[:cut]
        return text
