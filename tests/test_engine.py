"""The embedded engine: parity and exactness.

Chain of invariants:
    the engine's model         == transformers' logits (Llama, Qwen2, Qwen3), with a KV cache;
    greedy engine              == transformers greedy `generate`, token for token;
    speculation on             == off at temperature 0, for every proposer;
    speculation on             == off at temperature 1 with `drafter_invariant`, for every proposer and truncation;
    speculative samples        ~  the exact joint distribution computed from transformers (chi-square);
    the rollout's logprobs     == transformers' log_softmax(logits / T) for the same tokens (<= 1e-4).
Each holds on the fast path (specrl's small-row kernel, the default) and eager (`fast_path=False`);
the chi-square suite runs every proposer on the fast path and two on eager.
"""
from __future__ import annotations

import itertools

import pytest
import torch
from scipy.stats import chisquare

from helpers import save_random_checkpoint
from specrl.speculation.planner import Planner, StepPlan
from specrl.engine.engine import EngineConfig, RolloutEngine
from specrl.models.checkpoint import load_state_dict
from specrl.models.kv_cache import KVCache, retired_rows_order
from specrl.models.llama import LlamaModel
from specrl.sampling import SamplingParams
from specrl.speculation.draft_model import DraftModelProposer
from specrl.speculation.eagle3 import Eagle3Head
from specrl.speculation.head_proposer import HeadProposer
from specrl.speculation.hybrid import HybridProposer
from specrl.speculation.int8_draft import Int8DraftProposer
from specrl.speculation.mtp import MTPHead
from specrl.speculation.ngram import NgramProposer
from specrl.speculation.proposer import ProposalContext
from specrl.speculation.proposer_registry import PROPOSER_NAMES
from specrl.speculation.suffix import SuffixProposer

PROMPTS = [[1, 2, 3, 4, 5, 1, 2], [7, 8], [9]]


def perturbed(head):
    """A head initialised from its target, then jittered: drafts that are often but not always right."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.05 * torch.randn_like(p) * p.std().clamp_min(0.1))
    return head.eval()


PATHS = pytest.mark.parametrize("fast", [True, False], ids=["fast", "eager"])


def make_engine(target_dir, proposer: str = "none", draft_dir=None, k: int = 3, adaptive: bool = False,
                fast: bool = True, tree_width: int = 1, verification: str = "block", prefix_caching: bool = True):
    model = LlamaModel.from_pretrained(target_dir, fast_path=fast)
    assert model.fast_path == fast  # the kernel is built (make) and runs on this CPU
    chosen = {
        "none": lambda: None,
        "ngram": lambda: NgramProposer(),
        "suffix": lambda: SuffixProposer(),
        "draft": lambda: DraftModelProposer(LlamaModel.from_pretrained(draft_dir, fast_path=fast), model.cfg.vocab_size),
        # a reduced output vocabulary (every other id) exercises d2t
        "eagle3": lambda: HeadProposer(perturbed(Eagle3Head.from_target(model, d2t=torch.arange(0, 40, 2)))),
        "mtp": lambda: HeadProposer(perturbed(MTPHead.from_target(model))),
        "hybrid": lambda: HybridProposer(HeadProposer(perturbed(MTPHead.from_target(model))), explore_every=2),
        "int8": lambda: Int8DraftProposer(model),
    }[proposer]()
    return RolloutEngine(model, proposer=chosen, config=EngineConfig(num_speculative_tokens=k, adaptive=adaptive,
                                                                     fixed_tree_width=tree_width,
                                                                     verification=verification,
                                                                     prefix_caching=prefix_caching))


@PATHS
@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_model_logits_match_transformers_with_incremental_cache(tmp_path, arch, fast):
    hf = save_random_checkpoint(tmp_path, arch=arch)
    model = LlamaModel.from_pretrained(tmp_path, fast_path=fast)
    ids = torch.randint(0, 40, (3, 10), generator=torch.Generator().manual_seed(0))
    cache = model.new_cache(3, 16)
    first, _ = model.forward(ids[:, :6], cache)
    cache.lens += 6
    second, _ = model.forward(ids[:, 6:], cache)
    with torch.no_grad():
        ref = hf(ids).logits
    assert torch.allclose(torch.cat([first, second], 1), ref, atol=1e-4)


@PATHS
def test_a_prefill_without_logits_fills_the_same_cache_and_skips_the_head(target_dir, fast):
    model = LlamaModel.from_pretrained(target_dir, fast_path=fast)
    ids = torch.randint(0, 40, (2, 7), generator=torch.Generator().manual_seed(0))
    full, prefill = model.new_cache(2, 8), model.new_cache(2, 8)
    logits, _ = model.forward(ids, full)
    skipped, hidden = model.forward(ids, prefill, hidden_layers=(0, -1), logits=False)
    assert logits.shape == (2, 7, model.cfg.vocab_size) and skipped is None
    assert set(hidden) == {0, -1}  # the final norm still runs where a head reads it
    for a, b in zip(full.keys + full.values, prefill.keys + prefill.values):
        assert torch.equal(a, b)


@PATHS
def test_greedy_engine_matches_transformers_generate(target_dir, fast):
    import transformers

    engine = make_engine(target_dir, fast=fast)
    result = engine.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=16))
    hf = transformers.AutoModelForCausalLM.from_pretrained(target_dir).eval()
    out = hf.generate(torch.tensor(PROMPTS[:1]), max_new_tokens=16, do_sample=False)
    assert result.completions[0].token_ids == out[0, len(PROMPTS[0]):].tolist()


@PATHS
@pytest.mark.parametrize("proposer", ["ngram", "suffix", "draft", "self", "eagle3", "mtp", "hybrid", "int8"])
def test_speculation_on_equals_off_at_temperature_zero(target_dir, draft_dir, proposer, fast):
    params = SamplingParams(temperature=0, max_tokens=24, n=2)
    base = make_engine(target_dir, fast=fast).generate(PROMPTS, params)
    spec_draft = target_dir if proposer == "self" else draft_dir
    spec = make_engine(target_dir, "draft" if proposer == "self" else proposer, spec_draft,
                       fast=fast).generate(PROMPTS, params)
    for a, b in zip(base.completions, spec.completions):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
    assert spec.spec.num_drafts > 0
    if proposer == "self":  # the target drafting for itself is always right
        assert spec.spec.acceptance_rate == 1.0
        assert spec.steps < base.steps


@pytest.mark.parametrize("proposer", ["ngram", "draft", "int8"])
def test_token_by_token_verification_also_equals_plain_decoding_at_temperature_zero(target_dir, draft_dir, proposer):
    """The engine's default chain rule is block verification (every test above); the token rule stays exact."""
    params = SamplingParams(temperature=0, max_tokens=24, n=2)
    base = make_engine(target_dir).generate(PROMPTS, params)
    spec = make_engine(target_dir, proposer, draft_dir, verification="token").generate(PROMPTS, params)
    assert [c.token_ids for c in base.completions] == [c.token_ids for c in spec.completions]
    assert spec.spec.num_drafts > 0


INVARIANT_TRUNCATIONS = [(0, 1.0), (3, 1.0), (0, 0.7)]  # (top_k, top_p)


@pytest.mark.parametrize("top_k, top_p", INVARIANT_TRUNCATIONS,
                         ids=[f"top_k={k}-top_p={p}" for k, p in INVARIANT_TRUNCATIONS])
@pytest.mark.parametrize("proposer, width", [("ngram", 1), ("suffix", 1), ("draft", 1), ("eagle3", 1), ("eagle3", 3),
                                             ("mtp", 2), ("hybrid", 1), ("int8", 1)])
def test_drafter_invariant_speculation_equals_plain_decoding_at_temperature_one(target_dir, draft_dir, proposer, width,
                                                                                top_k, top_p):
    """With `drafter_invariant`, a seeded call samples the same tokens (and logprobs) with any proposer as with
    none, chains and trees, under every truncation; and it speculated, keeping some drafts."""
    params = SamplingParams(temperature=1.0, max_tokens=24, n=2, seed=5, top_k=top_k, top_p=top_p,
                            drafter_invariant=True)
    base = make_engine(target_dir).generate(PROMPTS, params)
    spec = make_engine(target_dir, proposer, draft_dir, tree_width=width).generate(PROMPTS, params)
    for a, b in zip(base.completions, spec.completions):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
    assert spec.spec.num_accepted_tokens > 0 and spec.width_histogram.get(width, 0) > 0


def test_drafter_invariant_calls_repeat_by_seed_and_differ_without_one(target_dir):
    """The key is the seed: the same seed samples the same tokens, another seed or none other ones; greedy
    decoding ignores the setting."""
    engine = make_engine(target_dir, "ngram")

    def tokens(**kwargs):
        params = SamplingParams(max_tokens=24, n=2, drafter_invariant=True, **kwargs)
        return [c.token_ids for c in engine.generate(PROMPTS, params).completions]

    assert tokens(seed=1) == tokens(seed=1) != tokens(seed=2)
    assert tokens() != tokens()
    plain_greedy = make_engine(target_dir).generate(PROMPTS, SamplingParams(temperature=0, max_tokens=24, n=2))
    assert tokens(temperature=0) == [c.token_ids for c in plain_greedy.completions]


def exact_two_token_distribution(target_dir, prompt: list[int], temperature: float) -> torch.Tensor:
    """P(t0, t1 | prompt) from transformers, [V*V]."""
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(target_dir).eval()
    with torch.no_grad():
        first = (hf(torch.tensor([prompt])).logits[0, -1] / temperature).softmax(-1)  # [V]
        V = first.shape[0]
        seqs = torch.tensor([prompt + [t] for t in range(V)])
        second = (hf(seqs).logits[:, -1] / temperature).softmax(-1)  # [V, V]
    return (first.unsqueeze(1) * second).flatten().double()


@pytest.mark.slow
def two_token_pvalue(result, exact: torch.Tensor) -> float:
    """Chi-square p-value of the completions' two-token pairs against the exact joint [V*V]; cells
    with small expectation are pooled so the chi-square approximation holds."""
    V = int(exact.numel() ** 0.5)
    pairs = torch.tensor([c.token_ids for c in result.completions])
    observed = torch.bincount(pairs[:, 0] * V + pairs[:, 1], minlength=V * V).double()
    expected = exact * len(pairs)
    big = expected >= 5
    obs = torch.cat([observed[big], observed[~big].sum().view(1)])
    exp = torch.cat([expected[big], expected[~big].sum().view(1)])
    return chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


@pytest.mark.parametrize("proposer, fast", [("draft", True), ("ngram", True), ("suffix", True), ("eagle3", True),
                                            ("mtp", True), ("hybrid", True), ("int8", True), ("draft", False),
                                            ("ngram", False), ("int8", False)],
                         ids=["draft", "ngram", "suffix", "eagle3", "mtp", "hybrid", "int8", "draft-eager",
                              "ngram-eager", "int8-eager"])
def test_speculative_samples_follow_the_exact_target_distribution(target_dir, draft_dir, proposer, fast):
    """Chi-square of 6000 two-token samples against the exact joint; false failure odds 1e-4."""
    prompt, n = [3, 1, 3, 1, 3], 6000
    exact = exact_two_token_distribution(target_dir, prompt, temperature=1.0)
    engine = make_engine(target_dir, proposer, draft_dir, k=3, fast=fast)
    result = engine.generate([prompt], SamplingParams(n=n, temperature=1.0, max_tokens=2, ignore_eos=True, seed=0))
    assert two_token_pvalue(result, exact) > 1e-4
    assert result.spec.num_drafts > 0


@PATHS
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_rollout_logprobs_equal_trainer_logprobs(target_dir, draft_dir, temperature, fast):
    import transformers

    engine = make_engine(target_dir, "draft", draft_dir, fast=fast)
    result = engine.generate(PROMPTS, SamplingParams(temperature=temperature, max_tokens=12, seed=1, ignore_eos=True))
    hf = transformers.AutoModelForCausalLM.from_pretrained(target_dir).eval()
    for prompt, completion in zip(PROMPTS, result.completions):
        seq = torch.tensor([prompt + completion.token_ids])
        with torch.no_grad():
            logprobs = (hf(seq).logits[0, len(prompt) - 1:-1] / temperature).log_softmax(-1)
        trainer = logprobs.gather(-1, torch.tensor(completion.token_ids).unsqueeze(1)).squeeze(1)
        assert torch.allclose(torch.tensor(completion.logprobs), trainer, atol=1e-4)
        assert completion.versions == [0] * len(completion.token_ids)


@pytest.mark.parametrize("truncation", [{"top_p": 0.7}, {"top_k": 20}, {"top_k": 5, "top_p": 0.9}])
def test_truncated_rollout_logprobs_equal_the_trainers_under_the_same_truncation(target_dir, draft_dir, truncation):
    """top-k / top-p change the distribution tokens are drawn from; the engine records logprobs under it and
    the trainer's `token_logprobs` with the same settings scores the same tokens identically."""
    import transformers

    from specrl.rl.padded_reference import padded_token_logprobs

    engine = make_engine(target_dir, "draft", draft_dir)
    result = engine.generate(PROMPTS, SamplingParams(max_tokens=12, seed=1, ignore_eos=True, **truncation))
    hf = transformers.AutoModelForCausalLM.from_pretrained(target_dir).eval()
    for prompt, completion in zip(PROMPTS, result.completions):
        seq = torch.tensor([prompt + completion.token_ids])
        with torch.no_grad():
            trainer = padded_token_logprobs(hf(seq).logits, seq, 1.0, **truncation)[0, len(prompt) - 1:-1]
        assert torch.allclose(torch.tensor(completion.logprobs), trainer, atol=1e-4)
        assert torch.isfinite(trainer).all()


def test_n_samples_are_grouped_per_prompt_and_differ(target_dir):
    result = make_engine(target_dir).generate(PROMPTS[:2], SamplingParams(n=4, max_tokens=10, seed=0, ignore_eos=True))
    assert [(c.prompt_index, c.sample_index) for c in result.completions] == list(itertools.product(range(2), range(4)))
    assert len({tuple(c.token_ids) for c in result.completions[:4]}) > 1
    assert all(len(c.token_ids) == 10 and c.finish_reason == "length" for c in result.completions)


def test_stop_token_ends_the_response_and_is_kept(target_dir, draft_dir):
    base = make_engine(target_dir).generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=20))
    stop = base.completions[0].token_ids[5]
    first = base.completions[0].token_ids.index(stop)
    for engine in (make_engine(target_dir), make_engine(target_dir, "draft", target_dir)):
        out = engine.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=20, stop_token_ids=(stop,)))
        c = out.completions[0]
        assert c.token_ids == base.completions[0].token_ids[: first + 1] and c.finish_reason == "stop"


def test_retiring_rows_copies_only_the_rows_that_move_and_keeps_every_rows_cache():
    cache = KVCache.allocate(num_layers=2, batch=6, num_kv_heads=2, max_len=5, head_dim=3)
    for store in (*cache.keys, *cache.values):
        store.copy_(torch.randn(store.shape))
    cache.lens = torch.arange(6)
    before = [s.clone() for s in (*cache.keys, *cache.values)]
    storage = [s.data_ptr() for s in (*cache.keys, *cache.values)]
    rows = retired_rows_order(torch.tensor([False, True, False, False, True, False]))
    assert rows.tolist() == [0, 5, 2, 3]  # row 5 fills row 1's slot; the others stay
    cache.select_rows(rows)
    assert all(torch.equal(s, b[rows]) for s, b in zip((*cache.keys, *cache.values), before))
    assert [s.data_ptr() for s in (*cache.keys, *cache.values)] == storage  # in place, no new tensors
    assert cache.lens.tolist() == [0, 5, 2, 3] and cache.batch == 4
    repeated = torch.tensor([0, 0, 3])  # a GRPO group's repeat: gathered anew
    cache.select_rows(repeated)
    assert all(torch.equal(s, b[rows][repeated]) for s, b in zip((*cache.keys, *cache.values), before))


@pytest.mark.parametrize("proposer", ["none", "int8", "draft", "eagle3"])
def test_rows_that_retire_before_the_rows_after_them_leave_every_other_response_as_decoded_alone(
        target_dir, draft_dir, proposer):
    """Retiring rows moves later rows into their slots (`retired_rows_order`): each response must still be the
    one its prompt gives decoded alone, token for token (greedy, the batch-invariant fast path)."""
    prompts = [[1, 2, 3, 4, 5, 1, 2], [7, 8], [9], [3, 1, 4, 1], [2, 7, 1, 8, 2], [6, 5]]
    engine = make_engine(target_dir, proposer, draft_dir)
    free = [engine.generate([p], SamplingParams(temperature=0, max_tokens=12)).completions[0].token_ids
            for p in prompts]
    stop = free[1][1]  # the second prompt stops after 2 tokens (or sooner), while later rows go on
    params = SamplingParams(temperature=0, max_tokens=12, stop_token_ids=(stop,))
    alone = [engine.generate([p], params).completions[0] for p in prompts]
    together = engine.generate(prompts, params).completions
    lengths = [len(c.token_ids) for c in alone]
    assert any(lengths[i] < lengths[j] for i in range(len(prompts)) for j in range(i + 1, len(prompts)))
    for a, b in zip(alone, together):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4


def test_weight_sync_changes_outputs_and_stamps_the_version(target_dir):
    engine = make_engine(target_dir)
    before = engine.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=8)).completions[0]
    other = {k: v * 1.5 if "lm_head" in k or "embed" in k else v for k, v in load_state_dict(target_dir).items()}
    engine.load_weights(other, version=7)
    after = engine.generate(PROMPTS[:1], SamplingParams(temperature=0, max_tokens=8)).completions[0]
    assert after.versions == [7] * len(after.token_ids)
    assert after.logprobs != before.logprobs


def test_the_planner_is_told_which_calls_follow_a_weight_load_and_what_their_first_draft_set_up(target_dir):
    """The int8 copy is rebuilt by the first call that drafts after a weight load: that call's first speculative
    step reports the rebuild as setup, under the calls after a load (planner rule 8a); a call without a load
    sets up nothing."""
    engine = make_engine(target_dir, "int8", k=3, adaptive=True)
    engine.planner.prior_acceptance = 1.0
    engine.planner.plain_call = lambda *_: False  # calls that may draft: on this target no draft pays (rule 14)
    seen = []
    prefilled = engine.planner.prefilled
    engine.planner.prefilled = lambda weights_changed=False: seen.append(weights_changed) or prefilled(weights_changed)
    params = SamplingParams(temperature=1.0, max_tokens=24, seed=0)
    for _ in range(3):
        engine.generate(PROMPTS[:1], params)
    engine.load_weights(load_state_dict(target_dir), version=1)
    engine.generate(PROMPTS[:1], params)
    assert seen == [True, False, False, True]
    assert engine.planner.setup_seconds[True] > 0 and engine.planner.setup_seconds[False] == 0.0


def test_engine_runs_the_k_its_planner_chooses_and_stays_exact(target_dir, draft_dir):
    """The planner's choice (tested on synthetic costs in test_planner.py) drives each step;
    whatever K it picks, step by step, the greedy output is unchanged."""
    schedule = iter([3, 0, 2, 0, 1] * 40)

    class Scripted(Planner):
        def choose_step(self, batch: int, room: int | None = None, generated=None) -> StepPlan:
            self.last = StepPlan(next(schedule), 1, "scripted")
            return self.last

    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    base = make_engine(target_dir).generate(PROMPTS, params)
    engine = make_engine(target_dir, "draft", draft_dir, k=3, adaptive=True)
    engine.planner = Scripted(max_k=3)
    result = engine.generate(PROMPTS, params)
    assert [c.token_ids for c in result.completions] == [c.token_ids for c in base.completions]
    assert set(result.k_histogram) == {0, 1, 2, 3}
    assert sum(result.k_histogram.values()) == result.steps
    spec_steps = sum(v for k, v in result.k_histogram.items() if k)
    assert 0 < result.spec.num_drafts <= 3 * spec_steps  # at most 3 live rows per speculative step


def test_the_draft_models_prefill_waits_for_a_proposal_and_equals_one_on_the_repeated_rows(target_dir, draft_dir):
    """2 prompts x n = 2 rows, one retiring before any draft: the draft runs nothing until the proposal,
    and then drafts what a draft given the surviving rows from the start drafts."""
    model = LlamaModel.from_pretrained(draft_dir)
    calls = []
    forward = model.forward
    model.forward = lambda *a, **kw: calls.append(1) or forward(*a, **kw)
    L, group, keep = 6, torch.tensor([0, 0, 1, 1]), torch.tensor([0, 2, 3])
    ids = torch.randint(0, 40, (4, L + 3), generator=torch.Generator().manual_seed(5))
    ids[1, :L], ids[3, :L] = ids[0, :L], ids[2, :L]  # rows of a group share their prompt
    params = SamplingParams(temperature=0)
    context = ProposalContext(ids[keep], torch.full((3,), L + 3), params, None, 40, groups=group[keep])
    lazy = DraftModelProposer(model, 40)
    lazy.start(ids[[0, 2]], torch.tensor([L, L]), params)
    lazy.select_rows(group)
    lazy.select_rows(keep)
    assert not calls
    got = lazy.propose(context, 3)
    direct = DraftModelProposer(model, 40)
    direct.start(ids[keep], torch.full((3,), L), params)
    assert torch.equal(got.tokens, direct.propose(context, 3).tokens)


def test_stop_string_cuts_the_text_and_ends_the_response():
    from specrl.backends import BackendConfig, make_backend

    backend = make_backend(BackendConfig(model="tiny", proposer="ngram"))
    prompt = "Q:12+34\nA:"
    plain = backend.generate([prompt], SamplingParams(temperature=0, max_tokens=12)).completions[0]
    assert "+" in plain.text and len(plain.text) > plain.text.index("+") + 1
    cut = backend.generate([prompt], SamplingParams(temperature=0, max_tokens=12, stop=("+",))).completions[0]
    assert cut.finish_reason == "stop"
    assert cut.text == plain.text[: plain.text.index("+")]
    assert cut.token_ids == plain.token_ids[: len(cut.token_ids)]
    assert backend.tokenizer.decode(cut.token_ids).endswith("+")


class SparseTextTokenizer:
    """Token ids of the 40-token test models: even ids decode to no text at all, odd ids to 'a' or 'b'."""

    eos_token_id = None

    def decode(self, ids, skip_special_tokens=False):
        return "".join("" if i % 2 == 0 else "ab"[(i // 2) % 2] for i in ids)


def test_a_stop_string_spread_over_tokens_without_text_still_ends_the_response(target_dir):
    """Tokens that decode to nothing (a byte of a split character, a special token) must not hide a stop
    string: a tail of a fixed number of tokens can hold fewer characters than the stop string."""
    engine = make_engine(target_dir)
    engine.tokenizer = tokenizer = SparseTextTokenizer()
    stop = ("abba",)
    result = engine.generate(PROMPTS, SamplingParams(n=8, max_tokens=60, seed=0, stop=stop, ignore_eos=True))
    stopped = 0
    for completion in result.completions:
        text = tokenizer.decode(completion.token_ids)
        if completion.finish_reason == "stop":
            stopped += 1
            assert text.endswith("abba") or "abba" in text[-4 - 0:]  # completed by the last kept token
            assert "abba" not in tokenizer.decode(completion.token_ids[:-1])  # and not before it
            assert completion.text == text[:text.index("abba")]
        else:
            assert "abba" not in text
    assert stopped >= 4


class RecordingProposer:
    """Wraps a proposer and keeps every proposal it makes."""

    def __init__(self, inner):
        self.inner, self.name, self.hidden_layers, self.proposals = inner, inner.name, inner.hidden_layers, []

    def start(self, *args):
        self.inner.start(*args)

    def observe(self, *args):
        self.inner.observe(*args)

    def select_rows(self, rows):
        self.inner.select_rows(rows)

    def propose(self, context, k):
        proposal = self.inner.propose(context, k)
        self.proposals.append(proposal)
        return proposal


@pytest.mark.parametrize("proposer", PROPOSER_NAMES)
def test_every_proposers_q_is_a_distribution_over_the_target_vocabulary(target_dir, draft_dir, proposer):
    """q [B, k, V] sums to 1 at every position (or the proposal is one-hot, q None), and every drafted
    token is a target id with q(token) > 0: the premise of the verifier's theorem."""
    engine = make_engine(target_dir, proposer, draft_dir)
    engine.proposer = recorder = RecordingProposer(engine.proposer)
    engine.generate(PROMPTS, SamplingParams(n=2, max_tokens=12, seed=0, ignore_eos=True))
    assert recorder.proposals
    for proposal in recorder.proposals:
        assert ((proposal.tokens >= 0) & (proposal.tokens < 40)).all()
        if proposal.probs is not None:
            torch.testing.assert_close(proposal.probs.sum(-1), torch.ones(proposal.tokens.shape), atol=1e-5, rtol=0)
            assert (proposal.probs.gather(-1, proposal.tokens.unsqueeze(-1)) > 0).all()


TREES = pytest.mark.parametrize("proposer, width", [("eagle3", 2), ("eagle3", 3), ("mtp", 2)])


@TREES
@pytest.mark.parametrize("k", [1, 3])
def test_tree_speculation_on_equals_off_at_temperature_zero(target_dir, proposer, width, k):
    """Every step a tree of `width` candidates with k - 1 drafts each; rows accept different branches
    (or none), and the accepted branch's K/V are moved next to the root: any slip shows in later tokens."""
    params = SamplingParams(temperature=0, max_tokens=24, n=2)
    base = make_engine(target_dir).generate(PROMPTS, params)
    tree = make_engine(target_dir, proposer, k=k, tree_width=width).generate(PROMPTS, params)
    for a, b in zip(base.completions, tree.completions):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
    assert tree.width_histogram == {width: tree.steps}


@TREES
def test_tree_rollout_logprobs_equal_trainer_logprobs(target_dir, proposer, width):
    import transformers

    engine = make_engine(target_dir, proposer, tree_width=width)
    result = engine.generate(PROMPTS, SamplingParams(max_tokens=12, seed=1, ignore_eos=True))
    hf = transformers.AutoModelForCausalLM.from_pretrained(target_dir).eval()
    for prompt, completion in zip(PROMPTS, result.completions):
        seq = torch.tensor([prompt + completion.token_ids])
        with torch.no_grad():
            trainer = hf(seq).logits[0, len(prompt) - 1:-1].log_softmax(-1)
        trainer = trainer.gather(-1, torch.tensor(completion.token_ids).unsqueeze(1)).squeeze(1)
        assert torch.allclose(torch.tensor(completion.logprobs), trainer, atol=1e-4)


@pytest.mark.slow
@TREES
def test_tree_samples_follow_the_exact_target_distribution(target_dir, proposer, width):
    """Chi-square of 6000 two-token samples from the engine drafting trees (k = 2) against the exact
    joint; false failure odds 1e-4."""
    prompt, n = [3, 1, 3, 1, 3], 6000
    exact = exact_two_token_distribution(target_dir, prompt, temperature=1.0)
    engine = make_engine(target_dir, proposer, k=2, tree_width=width)
    result = engine.generate([prompt], SamplingParams(n=n, temperature=1.0, max_tokens=2, ignore_eos=True, seed=0))
    assert two_token_pvalue(result, exact) > 1e-4
    assert result.width_histogram.get(width, 0) > 0 and result.spec.num_drafts > 0


def test_a_tree_width_the_proposer_cannot_draft_is_refused(target_dir):
    with pytest.raises(ValueError, match="fixed_tree_width 2: the ngram proposer drafts trees of width <= 1"):
        make_engine(target_dir, "ngram", tree_width=2)


# -- the prefix cache: a call's prompts that begin like the last call's first prompt copy those positions' K/V --
SHARED = [5, 6, 7, 8, 9, 10, 11, 12]


@PATHS
@pytest.mark.parametrize("proposer", ["none", "int8", "eagle3", "draft"])
def test_a_shared_prefix_is_copied_and_samples_what_a_fresh_prefill_does(target_dir, draft_dir, proposer, fast):
    """The first call's prompts share SHARED among themselves: it runs once, on the first prompt's row, and is
    copied to the other; the second call's prompts share their first 4 tokens with the entry the first kept."""
    on = make_engine(target_dir, proposer, draft_dir, fast=fast)
    off = make_engine(target_dir, proposer, draft_dir, fast=fast, prefix_caching=False)
    params = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=12, n=2, seed=3)
    for prompts, copied in (([SHARED + [1, 2], SHARED + [3]], 8),
                            ([SHARED + [4, 4, 4], SHARED + [2], SHARED[:5]], 4 * 3)):  # the shortest keeps its last
        a, b = (engine.generate(prompts, params) for engine in (on, off))
        assert (a.cached_prompt_tokens, b.cached_prompt_tokens) == (copied, 0)
        assert a.spec.num_drafts == b.spec.num_drafts and a.spec.num_accepted_tokens == b.spec.num_accepted_tokens
        for x, y in zip(a.completions, b.completions):
            assert x.token_ids == y.token_ids
            # the layer kernel is batch-invariant (the same bits); eager, PyTorch's matmuls at other row counts
            assert x.logprobs == y.logprobs if fast else \
                torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5)


def test_a_prompt_the_cache_holds_whole_runs_no_prefill_and_samples_the_same(target_dir):
    on, off = make_engine(target_dir), make_engine(target_dir, prefix_caching=False)
    params = SamplingParams(temperature=1.0, max_tokens=10, seed=5)
    prompt = SHARED + [1, 2]
    results = [engine.generate([prompt], params) for engine in (on, off, on, off)]
    assert [r.cached_prompt_tokens for r in results] == [0, 0, len(prompt) - 1, 0]
    assert results[2].completions[0].token_ids == results[3].completions[0].token_ids
    assert results[2].completions[0].logprobs == results[3].completions[0].logprobs


def test_new_weights_are_never_served_the_old_weights_prefix(target_dir):
    """Through the engine's weight sync and through a load on the model itself."""
    state = load_state_dict(target_dir)
    other = {name: t * 1.25 if t.is_floating_point() else t for name, t in state.items()}
    params = SamplingParams(temperature=1.0, max_tokens=10, seed=2)
    engine, fresh = make_engine(target_dir), make_engine(target_dir)
    fresh.load_weights(other, version=1)
    engine.generate([SHARED + [1]], params)
    engine.load_weights(other, version=1)
    synced = engine.generate([SHARED + [2]], params)
    assert synced.cached_prompt_tokens == 0
    assert synced.completions[0].token_ids == fresh.generate([SHARED + [2]], params).completions[0].token_ids
    engine.model.load_weights(state)
    assert engine.generate([SHARED + [3]], params).cached_prompt_tokens == 0


@pytest.mark.slow
def test_samples_after_a_prefix_cache_hit_follow_the_exact_target_distribution(target_dir):
    """Chi-square of 6000 two-token samples, drafted by the int8 self-draft, from a prompt whose first four
    tokens' K/V come from the prefix cache; false failure odds 1e-4."""
    prompt, n = [3, 1, 3, 1, 3], 6000
    exact = exact_two_token_distribution(target_dir, prompt, temperature=0.8)
    engine = make_engine(target_dir, "int8", k=2)
    engine.generate([prompt[:4] + [9, 9]], SamplingParams(max_tokens=2, seed=1))
    result = engine.generate([prompt], SamplingParams(n=n, temperature=0.8, max_tokens=2, ignore_eos=True, seed=0))
    assert result.cached_prompt_tokens == 4 and result.spec.num_drafts > 0
    assert two_token_pvalue(result, exact) > 1e-4
