"""specrl <-> vLLM types: sampling parameters in, completions out.

    specrl SamplingParams         vLLM SamplingParams
    n, temperature, top_p         same
    top_k (0 = all tokens)        top_k (0 = disabled in vLLM 0.32; older builds used -1)
    max_tokens, seed, ignore_eos  same
    stop, stop_token_ids          same (as lists)
    (always)                      logprobs=0: the sampled token's own logprob, no alternatives

The engine runs with logprobs_mode="processed_logprobs", so a sampled token's logprob
is taken under the distribution it was drawn from (after temperature, top-k, top-p),
as the embedded engine records it; a greedy token's logprob is under the unscaled
model distribution, also as there.
"""
from __future__ import annotations

from specrl.engine.engine import Completion
from specrl.engine.sampling import SamplingParams


def to_vllm_sampling(params: SamplingParams):
    """The vLLM SamplingParams that sample as `params` does."""
    import vllm

    return vllm.SamplingParams(
        n=params.n, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
        max_tokens=params.max_tokens, stop=list(params.stop) or None,
        stop_token_ids=list(params.stop_token_ids) or None, seed=params.seed,
        ignore_eos=params.ignore_eos, logprobs=0,
    )


def encode_prompts(prompts: list, tokenizer, vocab_size: int) -> list[list[int]]:
    """Token ids for each prompt (text is encoded without special tokens, as the embedded engine does)."""
    encoded = []
    for i, prompt in enumerate(prompts):
        ids = tokenizer.encode(prompt, add_special_tokens=False) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise ValueError(f"prompt {i} is empty")
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"prompt {i} has token ids outside the vocabulary (size {vocab_size}): {bad[:5]}")
        encoded.append(ids)
    return encoded


def response_text(tokenizer, tokens: list[int], stop: tuple[str, ...]) -> str:
    """The response as the embedded engine writes it: special tokens skipped (a stop token's own
    text kept, where vLLM drops it), cut before the first stop string."""
    text = tokenizer.decode(tokens, skip_special_tokens=True)
    if stop:
        raw = tokenizer.decode(tokens, skip_special_tokens=False)
        hits = [raw.find(s) for s in stop if s in raw]
        if hits:
            text = raw[:min(hits)]
    return text


def to_completions(outputs: list, version: int, tokenizer, stop: tuple[str, ...] = ()) -> list[Completion]:
    """Prompt-major completions from vLLM RequestOutputs (one per prompt, each with n outputs)."""
    completions = []
    for prompt_index, request in enumerate(outputs):
        for sample in sorted(request.outputs, key=lambda o: o.index):
            tokens = list(sample.token_ids)
            logprobs = [step[token].logprob for token, step in zip(tokens, sample.logprobs)]
            completions.append(Completion(
                prompt_index=prompt_index, sample_index=sample.index, token_ids=tokens, logprobs=logprobs,
                versions=[version] * len(tokens), finish_reason=finish_reason(sample.finish_reason),
                text=response_text(tokenizer, tokens, stop),
            ))
    return completions


def finish_reason(reason: str | None) -> str:
    """vLLM's finish reason in specrl's terms: "stop" (EOS, stop token or string) or "length"."""
    if reason in ("stop", "length"):
        return reason
    raise RuntimeError(f"vLLM ended a request with finish reason {reason!r} (expected stop or length)")
