"""Shared-prompt packing: a GRPO batch laid out so each group's prompt is computed once.

A GRPO group is one prompt and G responses. The trainer runs its forward and backward on one
packed sequence per micro-batch (batch dimension 1) instead of on G right-padded copies of
`prompt + response`. For a group with prompt p (length P) and responses r1, r2:

    ids        p0 p1 .. p(P-1) | r1_0 r1_1 .. | r2_0 r2_1 ..
    positions  0  1  .. P-1    | P    P+1  .. | P    P+1  ..      each response continues from the prompt
    attends    causal in p     | p, and r1 up to itself | p, and r2 up to itself

so every response token sees exactly the keys and values it sees in its own padded row, at the
same positions, and the prompt's gradient is the sum over the responses that read it (the
"Prefix Grouper" layout, Liu et al. 2025, arXiv:2506.05433). The loss is unchanged: token t of
response i is scored by the logits at the position before it (the prompt's last position for
t = 0), and only those positions reach the LM head (`logit_positions`, in row-major order of
the response tokens: row 0's tokens, then row 1's, ...). Groups follow one another in the same
sequence, each attending only to itself (block-diagonal across groups), so a micro-batch holds
no padding.

Rows form a group when they are consecutive and share their prompt ids (how the pipelines lay
a batch out); any other row is a group of one, which is its padded row without the padding.
`micro_batches` fills micro-batches of at most `budget` tokens with consecutive groups; a group
larger than the budget is split into chunks of whole responses, each with its own copy of the
prompt (exact: the loss is a sum over tokens, and advantages are fixed before the step). A
single `prompt + response` longer than the budget is a micro-batch of its own.

Cost: the attention runs dense over the micro-batch's T x T mask, so a packed micro-batch of T
tokens costs more attention than the same tokens in short rows; the budget bounds it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PackedBatch:
    rows: range  # the batch rows (sequences) it holds, consecutive
    ids: torch.Tensor  # [1, T] long
    positions: torch.Tensor  # [1, T] long: position ids (each response continues from its prompt)
    segments: torch.Tensor  # [T] long: block of each token (a chunk's prompt, or one response)
    prompt_of: torch.Tensor  # [T] long: the block of the prompt each token may also read (itself for a prompt)
    logit_positions: torch.Tensor  # [N] long: the position whose logits predict each response token
    targets: torch.Tensor  # [N] long: the response tokens, row-major
    response_mask: torch.Tensor  # [R, L] bool: True on each row's response tokens (L = longest response)
    unpack_index: torch.Tensor  # [R, W] long: each row's prompt + response as packed positions (`train_batch`'s layout)

    @property
    def tokens(self) -> int:
        return self.ids.shape[1]

    def to(self, device: torch.device) -> "PackedBatch":
        return PackedBatch(self.rows, *(t.to(device) for t in (
            self.ids, self.positions, self.segments, self.prompt_of, self.logit_positions, self.targets,
            self.response_mask, self.unpack_index)))

    def attention_mask(self, implementation: str, dtype: torch.dtype) -> torch.Tensor:
        """[1, 1, T, T]: query q reads key k when k is at or before q and k's block is q's own or q's prompt.
        Boolean (True = read) for `sdpa`; additive (0 or the dtype's minimum) for `eager`."""
        index = torch.arange(self.tokens, device=self.ids.device)
        same = self.segments[:, None] == self.segments[None, :]
        in_prompt = self.prompt_of[:, None] == self.segments[None, :]
        allowed = (same | in_prompt) & (index[None, :] <= index[:, None])
        if implementation == "sdpa":
            return allowed[None, None]
        if implementation == "eager":
            zero = torch.zeros((), dtype=dtype, device=allowed.device)
            return torch.where(allowed, zero, torch.finfo(dtype).min)[None, None]
        raise ValueError(f"the trainer's packed forward supports attention implementations sdpa and eager, "
                         f"not {implementation!r}")

    def scatter(self, values: torch.Tensor) -> torch.Tensor:
        """Per-response-token values [N] -> [R, L] (0 off the response tokens); differentiable."""
        out = values.new_zeros(self.response_mask.shape)
        return out.masked_scatter(self.response_mask, values)


def groups(prompts: list[list[int]]) -> list[range]:
    """Consecutive rows with the same prompt ids, as ranges of row indices."""
    out, start = [], 0
    for i in range(1, len(prompts) + 1):
        if i == len(prompts) or prompts[i] != prompts[start]:
            out.append(range(start, i))
            start = i
    return out


def chunks(prompts: list[list[int]], responses: list[list[int]], budget: int) -> list[range]:
    """Each group split into runs of rows whose prompt + responses fit in `budget` tokens (at least one row each)."""
    out = []
    for group in groups(prompts):
        prompt_len, start, size = len(prompts[group.start]), group.start, len(prompts[group.start])
        for i in group:
            if i > start and size + len(responses[i]) > budget:
                out.append(range(start, i))
                start, size = i, prompt_len
            size += len(responses[i])
        out.append(range(start, group.stop))
    return out


def chunk_tokens(prompts: list[list[int]], responses: list[list[int]], chunk: range) -> int:
    return len(prompts[chunk.start]) + sum(len(responses[i]) for i in chunk)


def micro_batches(prompts: list[list[int]], responses: list[list[int]], budget: int) -> list[range]:
    """The batch's rows split into consecutive micro-batches of at most `budget` packed tokens (a micro-batch
    is whole chunks; see the module docstring)."""
    out: list[range] = []
    size = 0
    for chunk in chunks(prompts, responses, budget):
        tokens = chunk_tokens(prompts, responses, chunk)
        if out and size + tokens <= budget:
            out[-1] = range(out[-1].start, chunk.stop)
            size += tokens
        else:
            out.append(chunk)
            size = tokens
    return out


def pack(prompts: list[list[int]], responses: list[list[int]], rows: range, budget: int) -> PackedBatch:
    """The packed sequence of `rows` (consecutive rows of the batch), chunked as `micro_batches` chunks them."""
    ids, positions, segments, prompt_of = [], [], [], []
    logit_positions, targets = [], []
    longest = max(len(responses[i]) for i in rows)
    unpack = torch.zeros(len(rows), max(len(prompts[i]) + len(responses[i]) for i in rows), dtype=torch.long)
    mask = torch.zeros(len(rows), longest, dtype=torch.bool)
    block = 0
    for chunk in chunks([prompts[i] for i in rows], [responses[i] for i in rows], budget):
        prompt = prompts[rows[chunk.start]]
        prompt_start, prompt_block = len(ids), block
        ids += prompt
        positions += range(len(prompt))
        segments += [block] * len(prompt)
        prompt_of += [block] * len(prompt)
        for local in chunk:
            response = responses[rows[local]]
            block += 1
            start = len(ids)
            ids += response
            positions += range(len(prompt), len(prompt) + len(response))
            segments += [block] * len(response)
            prompt_of += [prompt_block] * len(response)
            before = [prompt_start + len(prompt) - 1] + list(range(start, start + len(response) - 1))
            logit_positions += before[:len(response)]
            targets += response
            mask[local, :len(response)] = True
            unpack[local, :len(prompt)] = torch.arange(prompt_start, prompt_start + len(prompt))
            unpack[local, len(prompt):len(prompt) + len(response)] = torch.arange(start, start + len(response))
        block += 1
    ids, positions, segments, prompt_of, logit_positions, targets = (
        torch.tensor(v, dtype=torch.long) for v in (ids, positions, segments, prompt_of, logit_positions, targets))
    return PackedBatch(rows, ids[None], positions[None], segments, prompt_of, logit_positions, targets, mask, unpack)
