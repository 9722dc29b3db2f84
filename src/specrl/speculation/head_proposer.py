"""Drafting with a hidden-state head (EAGLE-3 or MTP) inside the engine's loop.

The head keeps its own one-layer KV cache in step with the target through `observe`,
which the engine calls after every target forward (the prompt prefill included) with the
target's hidden states of the positions it just verified:

    observe(hidden, start, count, tokens)
        hidden {layer: [B, T, H]}, row b valid for t < count[b], at positions start[b] + t.
        Kept pending, not run: steps without speculation (adaptive K = 0) cost the head nothing.
        When rows leave the batch, a pending chunk only records which of its rows are still live, and
        so do the head's cache and anchor state; both are gathered at the catch-up (copying them at
        every retirement is paid where rows retire often, even by calls that never speculate).

    catch-up (before a proposal)
        runs chain element 1 at every pending position (features fused from the hidden
        states, next tokens tokens[b, position + 1]), writing the head's cache; the output at
        each row's last position anchors the proposal. What was pending when the prompt rows
        were repeated n times (the prompt) is caught up on the prompt rows, then repeated with
        the cache: n times cheaper than on the repeated rows, and deferred like the rest, so a
        call that never speculates never runs the head (an eager catch-up would be a fixed cost on
        every call decoded plainly).
        A call's first catch-up (its prompt) is one-off work, as is rebuilding the head's packed weights
        after they changed (`DraftHead.repack`, done before it): the proposal reports their seconds as
        `setup_seconds`, which neither the planner nor the hybrid counts as what a draft costs a step.

    propose(context, k)
        element 1's output is the anchor's; elements 2..k each run the head once more on its
        own output g and the token just drafted. Draft cache entries past the anchor are
        overwritten by the next catch-up, which restarts at the anchor's successor, so
        nothing is rolled back by hand.

Drafts are sampled from q = the head's distribution under the call's sampling params
(argmax at temperature 0, where q is one-hot and omitted).

    propose_tree(context, k, width)
        element 1's distribution q_1 gives `width` candidate first tokens, drawn without replacement
        (`sampling.draw_without_replacement`: one inverse-CDF draw after another from what is left of
        q_1; at temperature 0 the top-w of the head's logits, deterministic); each candidate's branch is
        then drafted like a chain on a copy of the head's cache repeated `width` times, discarded afterwards.
"""
from __future__ import annotations

import time

import torch

from specrl.models.kv_cache import KVCache
from specrl.sampling import SamplingParams, draw_without_replacement, sampling_distribution
from specrl.speculation import drafter_invariant
from specrl.speculation.draft_head import DraftHead
from specrl.speculation.proposer import (CallScopedState, Proposal, ProposalContext, TreeProposal, sample_draft_token,
                                         to_target_vocab)


class HeadProposer(CallScopedState):
    def __init__(self, head: DraftHead, max_width: int = 3):
        self.head = head
        head.use_fast_path(head.target.fast_path)
        self.max_width = max_width
        self.name = head.kind
        self.hidden_layers = head.hidden_layers
        self.cache: KVCache | None = None
        self.feature: torch.Tensor | None = None  # [B, H] g at each row's anchor

    def check_draft_weights(self, state: dict[str, torch.Tensor], source: str) -> None:
        self.head.check_checkpoint_state(state, source)

    def load_draft_weights(self, state: dict[str, torch.Tensor], source: str) -> None:
        self.head.load_checkpoint_state(state, source)

    def start(self, tokens: torch.Tensor, num_tokens: torch.Tensor, params: SamplingParams) -> None:
        self.cache = self.head.new_cache(tokens.shape[0], tokens.shape[1])
        self.feature = torch.zeros(tokens.shape[0], self.head.cfg.hidden_size)
        # (hidden, start, count, rows): an observed chunk and the live rows' rows in it (None: all, in order)
        self.pending: list[tuple[dict[int, torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor | None]] = []
        self.pending_tokens: torch.Tensor | None = None  # [B, S] the engine's tokens at the last observe
        # deferred catch-up on the rows as they were before a repeat: (pending, tokens) then
        self.deferred: tuple[list, torch.Tensor] | None = None
        # each live row's row in the cache and feature, which stay on earlier rows until the next catch-up (None: the
        # live rows): rows retire often and a head that is not drafting runs never
        self.row_base: torch.Tensor | None = None
        self.prompt_caught_up = False

    def select_rows(self, rows: torch.Tensor) -> None:
        if self.row_base is not None:  # the cache still holds earlier rows
            self.row_base = self.row_base.index_select(0, rows)
        elif self.pending and rows.numel() > self.cache.batch:  # prompts about to be repeated: catch up once each, later
            self.deferred, self.row_base, self.pending = (self.pending, self.pending_tokens), rows, []
        else:
            self.row_base = rows
        self.pending = [(hidden, start, count, rows if own is None else own[rows])
                        for hidden, start, count, own in self.pending]
        if self.pending_tokens is not None:
            self.pending_tokens = self.pending_tokens.index_select(0, rows)

    def observe(self, hidden: dict[int, torch.Tensor], start: torch.Tensor, count: torch.Tensor,
                tokens: torch.Tensor) -> None:
        if next(iter(hidden.values())).shape[1]:
            self.pending.append((hidden, start, count, None))
        self.pending_tokens = tokens

    @staticmethod
    def _live(chunk):
        """A pending chunk's (hidden, start, count) on the live rows."""
        hidden, start, count, rows = chunk
        if rows is None:
            return hidden, start, count
        return {layer: h.index_select(0, rows) for layer, h in hidden.items()}, start[rows], count[rows]

    @staticmethod
    def _merge(pending):
        """Pending chunks (on the live rows) -> one: hidden {layer: [B, sum T_i, H]} with each row's valid positions
        packed to the front (chunks of a row are contiguous in position), start [B], count [B].

        Example, one row: chunk 0 valid [a, b, junk], chunk 1 valid [c, junk] -> [a, b, c, junk, junk], count 3.
        """
        if len(pending) == 1:
            return pending[0]
        valid = torch.cat([torch.arange(h[next(iter(h))].shape[1]).unsqueeze(0) < c.unsqueeze(1)
                           for h, _, c in pending], dim=1)  # [B, sum T_i]
        order = torch.argsort((~valid).to(torch.int8), dim=1, stable=True)  # valid columns first, in order
        hidden = {}
        for layer in pending[0][0]:
            stacked = torch.cat([h[layer] for h, _, _ in pending], dim=1)
            hidden[layer] = stacked.gather(1, order.unsqueeze(-1).expand(-1, -1, stacked.shape[-1]))
        return hidden, pending[0][1], sum(c for _, _, c in pending)

    def _prepare(self, tokens: torch.Tensor) -> float:
        """The work before a proposal drafts: the head's packed weights rebuilt if they changed, and the catch-up.
        Returns the seconds of its one-off part (`Proposal.setup_seconds`): the rebuild, and the call's first
        catch-up (its prompt, and any steps decoded plainly before it)."""
        start = time.perf_counter()
        setup = time.perf_counter() - start if self.head.repack() else 0.0
        self._catch_up_all(tokens)
        if not self.prompt_caught_up:
            self.prompt_caught_up = True
            setup = time.perf_counter() - start
        return setup

    def _catch_up_all(self, tokens: torch.Tensor) -> None:
        """The deferred catch-up on the rows before the repeat, the cache and feature then moved to the live rows,
        then what is pending."""
        if self.deferred is not None:
            after, (self.pending, before) = self.pending, self.deferred
            self.catch_up(before)
            self.deferred, self.pending = None, after
        if self.row_base is not None:
            self.cache.select_rows(self.row_base)
            self.feature = self.feature.index_select(0, self.row_base)
            self.row_base = None
        if self.pending:
            self.catch_up(tokens)

    @torch.inference_mode()
    def catch_up(self, tokens: torch.Tensor) -> None:
        hidden, start, count = self._merge([self._live(chunk) for chunk in self.pending])
        self.pending = []
        T = int(count.max())  # past it every row holds only padding
        if T == 0:
            return
        hidden = {layer: h[:, :T] for layer, h in hidden.items()}
        self.cache.grow_to(int((start + T).max()) + 1)
        positions = start.unsqueeze(1) + 1 + torch.arange(T).unsqueeze(0)  # [B, T] of the next tokens
        next_tokens = tokens.gather(1, positions.clamp_max(tokens.shape[1] - 1)).clamp_min(0)  # junk may be PAD (-1)
        self.cache.lens = start.clone()
        g = self.head.forward_cached(self.head.fuse(hidden), next_tokens, self.cache)  # [B, T, H]
        last = (count - 1).clamp_min(0)
        self.feature = torch.where((count > 0).unsqueeze(1), g[torch.arange(g.shape[0]), last], self.feature)
        self.cache.lens = start + count

    @torch.inference_mode()
    def propose(self, context: ProposalContext, k: int) -> Proposal:
        setup = self._prepare(context.tokens)
        params, head = context.params, self.head
        feature, tokens, probs = self.feature, [], []
        self.cache.grow_to(int(self.cache.lens.max()) + k)
        for j in range(k):
            if j:
                feature = head.forward_cached(feature.unsqueeze(1), tokens[-1].unsqueeze(1), self.cache)[:, 0]
                self.cache.lens += 1
            token, q = sample_draft_token(head.logits(feature), head.d2t, context.vocab_size, params, context.generator,
                                          context.keys_at(j))
            tokens.append(token)
            probs.append(q)
        return Proposal(tokens=torch.stack(tokens, 1), probs=None if params.greedy else torch.stack(probs, 1),
                        setup_seconds=setup)

    @torch.inference_mode()
    def propose_tree(self, context: ProposalContext, k: int, width: int) -> TreeProposal:
        setup = self._prepare(context.tokens)
        params, head, V = context.params, self.head, context.vocab_size
        B = self.feature.shape[0]
        logits = head.logits(self.feature)  # [B, V_out]
        if params.greedy:  # deterministic candidates: the head's top-w
            top = logits.topk(width, dim=-1).indices
            candidates, q_first = (top if head.d2t is None else head.d2t[top]), None
        else:  # drawn in the head's V_out ids, then mapped (d2t is one to one: the same law, fewer ids)
            q_out, _ = sampling_distribution(logits, params)  # [B, V_out]
            candidates = draw_without_replacement(q_out, width, context.generator)  # in draw order
            if head.d2t is not None:
                candidates = head.d2t[candidates]
            q_first = to_target_vocab(q_out, head.d2t, V)  # [B, V]
            if context.noise_keys is not None:  # drafter-invariant: the first candidate is the race on q, coupled
                # to the target's token; the others are any distinct ids (the drawn ones other than it)
                first = drafter_invariant.race(q_first, context.noise_keys[:, 0]).unsqueeze(1)  # [B, 1]
                others = candidates.gather(1, (candidates == first).long().argsort(dim=1, stable=True)[:, :width - 1])
                candidates = torch.cat([first, others], 1)
        rows = torch.arange(B).repeat_interleave(width)  # branch copies of each row
        cache = type(self.cache)(keys=[t.index_select(0, rows) for t in self.cache.keys],
                                 values=[t.index_select(0, rows) for t in self.cache.values],
                                 lens=self.cache.lens.index_select(0, rows))
        cache.grow_to(int(cache.lens.max()) + k)
        feature, token = self.feature.index_select(0, rows), candidates.reshape(-1)
        drafts, probs = [], []
        for j in range(1, k):
            feature = head.forward_cached(feature.unsqueeze(1), token.unsqueeze(1), cache)[:, 0]
            cache.lens += 1
            keys = context.keys_at(j)
            token, q = sample_draft_token(head.logits(feature), head.d2t, V, params, context.generator,
                                          None if keys is None else keys.repeat_interleave(width))
            drafts.append(token.view(B, width))
            probs.append(q.view(B, width, V))
        empty = torch.zeros(B, width, 0, dtype=torch.long)
        return TreeProposal(candidates, q_first, torch.stack(drafts, 2) if drafts else empty,
                            None if params.greedy or not probs else torch.stack(probs, 2), setup_seconds=setup)
