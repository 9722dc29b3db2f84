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

from specrl.generation import Completion, response_text
from specrl.sampling import SamplingParams


def to_vllm_sampling(params: SamplingParams):
    """The vLLM SamplingParams that sample as `params` does."""
    if params.drafter_invariant and not params.greedy:
        raise ValueError("SamplingParams.drafter_invariant is the embedded engine's: vLLM's sampler draws with "
                         "noise its drafts change; use backend=embedded")
    import vllm

    return vllm.SamplingParams(
        n=params.n, temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
        max_tokens=params.max_tokens, stop=list(params.stop) or None,
        stop_token_ids=list(params.stop_token_ids) or None, seed=params.seed,
        ignore_eos=params.ignore_eos, logprobs=0,
    )


def to_completions(outputs: list, prompts: list[list[int]], version: int, tokenizer,
                   stop: tuple[str, ...] = ()) -> list[Completion]:
    """Prompt-major completions from vLLM RequestOutputs (one per prompt, each with n outputs).

    The response text is the embedded engine's (`response_text`): special tokens skipped, but a
    stop token's own text kept where vLLM drops it, and cut before the first stop string."""
    completions = []
    for prompt_index, request in enumerate(outputs):
        for sample in sorted(request.outputs, key=lambda o: o.index):
            tokens = list(sample.token_ids)
            logprobs = [step[token].logprob for token, step in zip(tokens, sample.logprobs)]
            completions.append(Completion(
                prompt_index=prompt_index, sample_index=sample.index, prompt_ids=prompts[prompt_index],
                token_ids=tokens, logprobs=logprobs, versions=[version] * len(tokens),
                finish_reason=finish_reason(sample.finish_reason),
                text=response_text(tokenizer, tokens, stop),
            ))
    return completions


def finish_reason(reason: str | None) -> str:
    """vLLM's finish reason in specrl's terms: "stop" (EOS, stop token or string) or "length"."""
    if reason in ("stop", "length"):
        return reason
    raise RuntimeError(f"vLLM ended a request with finish reason {reason!r} (expected stop or length)")
