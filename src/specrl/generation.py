"""What every backend's `generate` takes and returns: prompts in, completions out.

Both backends (the embedded engine and vLLM) encode prompts with `encode_prompts`,
write response text with `response_text`, and return a `GenerateResult` of
`Completion`s in prompt-major order (prompt 0's n samples, then prompt 1's, ...).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from specrl.telemetry.spec_stats import SpecStats


@dataclass
class Completion:
    """One sampled response."""

    prompt_index: int
    sample_index: int  # 0..n-1 within its prompt's group
    prompt_ids: list[int]  # the prompt's token ids, as the backend encoded them
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
    width_histogram: dict[int, int] = field(default_factory=dict)  # speculative steps per width (1 = chain, > 1 tree)
    # per engine step: (seconds since the call started, live rows, k, tree width); the drain of the batch
    # (the embedded engine records it; vLLM does not expose it)
    trace: list[tuple[float, int, int, int]] = field(default_factory=list)
    weight_updates: int = 0  # versions adopted mid-call (in-flight weight updates; the embedded engine only)
    weight_update_seconds: float = 0.0  # spent loading them and recomputing the live rows' caches
    cached_prompt_tokens: int = 0  # prompt tokens whose K/V were copied, not prefilled (embedded: from the prefix
    # cache, or from the call's first prompt where all its prompts begin alike)
    # steps per reason the planner gave for its choice (`speculation.planner.REASONS`; the embedded engine only)
    plan_reasons: dict[str, int] = field(default_factory=dict)
    # the decode steps' seconds (after prefill), and the same steps priced as plain decoding: a speculative step's
    # kept tokens at the plain step time its engine measured for that batch size, per token (a plain step as it
    # ran); None where a speculative step ran before any plain step was measured. Their ratio is what speculation
    # saved; the embedded engine only (0.0 and None elsewhere)
    step_seconds: float = 0.0
    plain_equivalent_seconds: float | None = None

    @property
    def num_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.completions)


def encode_prompts(prompts: list, tokenizer, vocab_size: int) -> list[list[int]]:
    """Token ids for each prompt: text is encoded without special tokens, ids are checked.

    An empty prompt list, an empty prompt, text without a tokenizer, anything but text or a list of integer ids, or an
    id outside 0..vocab_size-1 is an error that names the prompt.
    """
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, (list, tuple)):
        raise ValueError(f"prompts must be a list of prompts (text or token ids), got {type(prompts).__name__}")
    if not prompts:
        raise ValueError("the prompt list is empty: give generate() at least one prompt")
    encoded = []
    for i, prompt in enumerate(prompts):
        if isinstance(prompt, str):
            if tokenizer is None:
                raise ValueError("string prompts need a tokenizer; pass token ids or give the engine a tokenizer")
            ids = tokenizer.encode(prompt, add_special_tokens=False)
        elif isinstance(prompt, (list, tuple)):
            ids = list(prompt)
            if any(isinstance(t, bool) or not isinstance(t, int) for t in ids):
                raise ValueError(f"prompt {i} must be text or a list of integer token ids, got {prompt[:5]!r}")
        else:
            raise ValueError(f"prompt {i} must be text or a list of integer token ids, got {type(prompt).__name__}")
        if not ids:
            raise ValueError(f"prompt {i} is empty")
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"prompt {i} has token ids outside the vocabulary (size {vocab_size}): {bad[:5]}")
        encoded.append(ids)
    return encoded


def stop_string_at(tokenizer, tokens: list[int], stop: tuple[str, ...]) -> int | None:
    """Character index of the first stop string in the decoded response (special tokens kept), if any."""
    text = tokenizer.decode(tokens, skip_special_tokens=False)
    hits = [text.find(s) for s in stop if s in text]
    return min(hits) if hits else None


def response_text(tokenizer, tokens: list[int], stop: tuple[str, ...]) -> str:
    """The response's text: special tokens skipped, cut before the first stop string (where
    the text is taken with special tokens kept, so a stop token's own text stays)."""
    if stop:
        cut = stop_string_at(tokenizer, tokens, stop)
        if cut is not None:
            return tokenizer.decode(tokens, skip_special_tokens=False)[:cut]
    return tokenizer.decode(tokens, skip_special_tokens=True)
