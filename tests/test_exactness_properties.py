"""Exactness of speculative verification, as properties of random small cases (hypothesis).

Every case is a target p and a draft q over V = 2..6 tokens, autoregressive (each prefix picks one
of a few random logit rows, which may hold -inf: zeros of q where p > 0 and of p where q > 0), with
the engine's sampling options (temperature 0, 0.7 or 1; top-k 0..V; top-p 0.05..1) applied to both
through `sampling_distribution`, in float64, as the engine does.

Chain of invariants, each computed in closed form from the verifier's own probabilities, summing over
every draft outcome weighted by its probability under q (nothing is sampled):
    chain   `acceptance_probs` / `recovery_probs` on K = 0..4 drafts (drawn from q, one-hot as
            `draft_probs=None`, or one-hot given as a distribution): the step's emitted tokens,
            completed by p, have the joint of the first K + 1 tokens == prod p, to 1e-9;
    tree    `first_token_stages` on w = 1..4 candidates, then the chain above on the accepted
            candidate's branch (depth k = 1..3): the joint of the first k + 1 tokens == prod p, to
            1e-9, for candidates drawn without replacement from q (once q's support is exhausted,
            padded with tokens of zero remaining draft mass; which ones and in what order is drawn
            by hypothesis, repeats of drawn tokens included, since the theorem holds for any padding)
            and for deterministic candidates (any tokens, repeats included);
    greedy  temperature 0 is the same path: p is one-hot, and the joint above is the argmax path.
The pre-fix rule (a token of zero draft mass accepted iff p > 0) fails the tree property: a padded
candidate is then emitted with probability 1 in place of the residual.

Settings: the "exactness" profile below (1000 derandomized examples per property, so CI sees the same
cases every run; a few seconds). `pytest --hypothesis-show-statistics` lists the coverage events.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import pytest
import torch
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from specrl.sampling import SamplingParams, sampling_distribution
from specrl.speculation.block_verify import block_rule
from specrl.speculation.tree import first_token_stages
from specrl.speculation.verify import acceptance_probs, recovery_probs

settings.register_profile("exactness", max_examples=1000, deadline=None, derandomize=True, database=None,
                          print_blob=False)
EXACTNESS = settings.get_profile("exactness")
pytestmark = pytest.mark.usefixtures("one_thread_module")  # tiny float64 ops: 20x slower at 2 threads under load
TOLERANCE = 1e-9
NEG_INF = float("-inf")
MIX = (3, 5, 11, 13, 17, 19)  # prefix -> logit row: (len + sum (token + 1) * MIX[i]) mod rows
DRAFT_KINDS = ("sampled", "one-hot as None", "one-hot as a distribution")


@dataclass(frozen=True)
class Model:
    """An autoregressive distribution over V tokens: the prefix s picks logit row
    (len(s) + sum_i (s_i + 1) * MIX[i]) mod R, then `params` turns it into the sampling distribution."""

    rows: tuple[tuple[float, ...], ...]  # R rows of V logits (-inf allowed, never a whole row)
    params: SamplingParams

    @property
    def V(self) -> int:
        return len(self.rows[0])

    def at(self, prefixes: torch.Tensor) -> torch.Tensor:
        """prefixes [N, L] long -> [N, V] float64: the distribution after each prefix."""
        N, L = prefixes.shape
        mix = torch.tensor(MIX[:L], dtype=torch.long)
        index = (L + ((prefixes + 1) * mix).sum(1)) % len(self.rows)
        logits = torch.tensor(self.rows, dtype=torch.float64)[index]
        return sampling_distribution(logits, self.params)[0]


def all_sequences(V: int, length: int) -> torch.Tensor:
    """[V**length, length] long: every sequence in lexicographic order (row-major index = base-V number)."""
    return torch.tensor(list(itertools.product(range(V), repeat=length)), dtype=torch.long).reshape(V ** length, length)


def with_context(context: tuple[int, ...], seqs: torch.Tensor) -> torch.Tensor:
    return torch.cat([torch.tensor(context, dtype=torch.long).expand(seqs.shape[0], -1), seqs], dim=1)


def target_joint(p: Model, length: int, context: tuple[int, ...] = ()) -> torch.Tensor:
    """[V]*length: prod_i p(x_i | context, x_<i)."""
    V = p.V
    joint = torch.ones([V] * length, dtype=torch.float64)
    for i in range(length):
        conditional = p.at(with_context(context, all_sequences(V, i))).view([V] * (i + 1) + [1] * (length - i - 1))
        joint = joint * conditional
    return joint


def draft_rows(q: Model, kind: str, prefixes: torch.Tensor) -> torch.Tensor:
    """[N, V]: the law a draft token is drawn from after each prefix (one-hot kinds: on q's argmax)."""
    rows = q.at(prefixes)
    if kind == "sampled":
        return rows
    return torch.nn.functional.one_hot(rows.argmax(-1), q.V).to(rows.dtype)


def token_rule(drafts: torch.Tensor, q_arg: torch.Tensor | None, p_rows: torch.Tensor):
    """`verify`'s law -> (stop [N, K+1]: P(exactly m drafts accepted), extra [N, K+1, V]: the token after them):
    P(m) = prod_{i<m} a_i (1 - a_m), no (1 - a_K) factor for the bonus."""
    accept = acceptance_probs(drafts, q_arg, p_rows)  # [N, K]
    one = torch.ones(accept.shape[0], 1, dtype=accept.dtype)
    reach = torch.cat([one, accept], 1).cumprod(1)  # [N, K+1]
    return reach * torch.cat([1 - accept, one], 1), recovery_probs(drafts, q_arg, p_rows)


def block_rule_law(drafts: torch.Tensor, q_arg: torch.Tensor | None, p_rows: torch.Tensor):
    """`block_verify`'s law, as `token_rule`: tau = the last i with eta_i < h_i, so
    P(tau = m) = h_m prod_{l>m} (1 - h_l), with h_0 = 1; the extra token's row normalised."""
    h, extra = block_rule(drafts, q_arg, p_rows)
    one = torch.ones(h.shape[0], 1, dtype=h.dtype)
    h = torch.cat([one, h], 1)  # [N, K+1]
    later = torch.cat([(1 - h[:, 1:]).flip(1).cumprod(1).flip(1), one], 1)  # prod_{l>m} (1 - h_l)
    return h * later, extra / extra.sum(-1, keepdim=True)


RULES = {"token": token_rule, "block": block_rule_law}


def chain_outcomes(p: Model, q: Model, kind: str, K: int, rule: str, context: tuple[int, ...] = ()):
    """Every draft chain d with positive probability under q -> (drafts [N, K], chain_prob [N], stop [N, K+1],
    extra [N, K+1, V]) from the verifier's own probabilities (see `token_rule`)."""
    V = p.V
    drafts = all_sequences(V, K)  # [N, K]
    q_rows = torch.stack([draft_rows(q, kind, with_context(context, drafts[:, :i])) for i in range(K)], 1) \
        if K else torch.zeros(1, 0, V, dtype=torch.float64)  # [N, K, V]
    chain_prob = q_rows.gather(-1, drafts.unsqueeze(-1)).squeeze(-1).prod(1)  # [N]
    keep = chain_prob > 0
    drafts, q_rows, chain_prob = drafts[keep], q_rows[keep], chain_prob[keep]
    p_rows = torch.stack([p.at(with_context(context, drafts[:, :i])) for i in range(K + 1)], 1)  # [N, K+1, V]
    stop, extra = RULES[rule](drafts, None if kind == "one-hot as None" else q_rows, p_rows)
    return drafts, chain_prob, stop, extra


def chain_joint(p: Model, q: Model, kind: str, K: int, context: tuple[int, ...] = (), rule: str = "token") -> torch.Tensor:
    """[V]*(K+1): P(first K + 1 tokens after `context`) when one verified step of K drafts is completed by p.

    Enumerates every draft chain d (probability prod_i q(d_i | context, d_<i)), takes the verifier's
    P(exactly m drafts accepted) and the law of the token emitted after them (`token_rule`, `block_rule_law`),
    and adds P(m, then x) times p's continuation of the remaining tokens.
    """
    V = p.V
    drafts, chain_prob, stop, extra = chain_outcomes(p, q, kind, K, rule, context)
    joint = torch.zeros([V] * (K + 1), dtype=torch.float64)
    for m in range(K + 1):
        emitted = torch.zeros(V ** (m + 1), dtype=torch.float64)  # P(exactly m drafts, then x), by (d_<m, x)
        index = (drafts[:, :m] * V ** torch.arange(m - 1, -1, -1)).sum(1, keepdim=True) * V + torch.arange(V)  # [N, V]
        emitted.index_add_(0, index.flatten(), ((chain_prob * stop[:, m]).unsqueeze(1) * extra[:, m]).flatten())
        completion = torch.ones([V] * (K + 1), dtype=torch.float64)
        for i in range(m + 1, K + 1):  # the tokens after the step: p given everything before
            completion = completion * p.at(with_context(context, all_sequences(V, i))).view(
                [V] * (i + 1) + [1] * (K - i))
        joint += emitted.view([V] * (m + 1) + [1] * (K - m)) * completion
    return joint


def expected_accepted(p: Model, q: Model, kind: str, K: int, rule: str) -> float:
    """E[drafts accepted] of one verified step, in closed form."""
    _, chain_prob, stop, _ = chain_outcomes(p, q, kind, K, rule)
    return float((chain_prob.unsqueeze(1) * stop * torch.arange(K + 1)).sum())


def draws_without_replacement(q_first: torch.Tensor, w: int):
    """Every ordered draw of min(w, |support|) distinct tokens from q_first, with its probability."""
    support = q_first.nonzero().flatten().tolist()
    for combo in itertools.permutations(support, min(w, len(support))):
        prob, rest = 1.0, 1.0
        for c in combo:
            prob *= float(q_first[c]) / rest
            rest -= float(q_first[c])
        yield combo, prob


@dataclass(frozen=True)
class TreeCase:
    p: Model
    q: Model
    width: int
    depth: int
    # "sampled" / "one-hot as a distribution" (drawn without replacement from q / from q one-hot on its argmax,
    # then padded), or "deterministic" (`fixed`, q_first None)
    candidates: str
    branch_drafts: str  # one of DRAFT_KINDS
    pad_order: tuple[int, ...]  # padding without repeats: the first tokens of this permutation not yet drawn
    pad_tokens: tuple[int, ...] | None  # padding with repeats allowed: these tokens, stage by stage
    fixed: tuple[int, ...]  # the deterministic candidates (repeats allowed)


ROOT = torch.zeros(1, 0, dtype=torch.long)  # the empty prefix


def first_draft(case: TreeCase) -> torch.Tensor | None:
    """[V] the law the candidates are drawn from without replacement; None for deterministic candidates."""
    if case.candidates == "deterministic":
        return None
    return draft_rows(case.q, "sampled" if case.candidates == "sampled" else "one-hot", ROOT)[0]


def padded(case: TreeCase, combo: tuple[int, ...]) -> tuple[int, ...]:
    """`combo` padded to the tree's width the way the case says (the proposer pads with distinct tokens of
    zero draft mass in an arbitrary order; repeats of drawn tokens have zero remaining mass too)."""
    if case.pad_tokens is not None:
        return combo + case.pad_tokens[len(combo):case.width]
    return (combo + tuple(t for t in case.pad_order if t not in combo))[:case.width]


def tree_joint(case: TreeCase) -> torch.Tensor:
    """[V]*(k+1): P(first k + 1 tokens) of one verified tree step completed by p, from the verifier's own stage
    acceptances, final residual and chain probabilities, summed over every candidate draw."""
    p, q, V, k = case.p, case.q, case.p.V, case.depth
    p_root, q_first = p.at(ROOT)[0], first_draft(case)
    if q_first is None:
        draws = [(case.fixed, 1.0)]
    else:
        draws = [(padded(case, combo), prob) for combo, prob in draws_without_replacement(q_first, case.width)]
    cands = torch.tensor([c for c, _ in draws], dtype=torch.long)  # [M, w]
    prob = torch.tensor([pr for _, pr in draws], dtype=torch.float64)  # [M]
    M = cands.shape[0]
    accept, final = first_token_stages(cands, None if q_first is None else q_first.expand(M, V), p_root.expand(M, V))
    # below candidate c: the chain of k - 1 branch drafts, completed by p
    below = torch.stack([chain_joint(p, q, case.branch_drafts, k - 1, context=(c,)).flatten() for c in range(V)])
    joint = torch.zeros(V, V ** k, dtype=torch.float64)
    reach = prob
    for j in range(case.width):
        joint.index_add_(0, cands[:, j], (reach * accept[:, j]).unsqueeze(1) * below[cands[:, j]])
        reach = reach * (1 - accept[:, j])
    after = torch.stack([target_joint(p, k, context=(c,)).flatten() for c in range(V)])  # [V, V**k]
    joint += (reach.unsqueeze(1) * final).sum(0).unsqueeze(1) * after  # every candidate rejected
    return joint.view([V] * (k + 1))


# ---- strategies ----

LOGIT = st.one_of(st.floats(-4.0, 4.0, allow_nan=False), st.sampled_from([NEG_INF, NEG_INF, 0.0, 1.0]))


@st.composite
def logit_rows(draw, V: int) -> tuple[tuple[float, ...], ...]:
    rows = []
    for _ in range(draw(st.integers(1, 3))):
        row = draw(st.lists(LOGIT, min_size=V, max_size=V))
        if all(x == NEG_INF for x in row):
            row[draw(st.integers(0, V - 1))] = 0.0
        rows.append(tuple(row))
    return tuple(rows)


@st.composite
def sampling_params(draw, V: int) -> SamplingParams:
    """Temperature 1, 0 (greedy) or 0.7; top-k off about half the time, else 1..V; top-p off, tiny, a half, or any."""
    return SamplingParams(temperature=draw(st.sampled_from([1.0, 0.0, 0.7])),
                          top_k=draw(st.one_of(st.just(0), st.integers(1, V))),
                          top_p=draw(st.one_of(st.just(1.0), st.sampled_from([0.05, 0.5]), st.floats(0.05, 1.0))))


def moved(draw, rows: tuple[tuple[float, ...], ...]) -> tuple[tuple[float, ...], ...]:
    """`rows` with each logit kept, moved a little, or dropped (-inf; never a whole row)."""
    out = []
    for row in rows:
        new = [x + draw(st.sampled_from([0.0, 0.0, 0.3, -0.5, NEG_INF])) for x in row]
        out.append(tuple(new) if any(x > NEG_INF for x in new) else row)
    return tuple(out)


@st.composite
def target_and_draft(draw, V: int) -> tuple[Model, Model]:
    """p and q under the same sampling params: independent, equal, or one the other's logits moved a little with
    some dropped (q's support narrower than p's, or p's narrower than q's)."""
    params = draw(sampling_params(V))
    relation = draw(st.sampled_from(["independent", "equal", "narrower draft", "narrower target"]))
    p_rows = draw(logit_rows(V))
    q_rows = {"independent": lambda: draw(logit_rows(V)), "equal": lambda: p_rows,
              "narrower draft": lambda: moved(draw, p_rows), "narrower target": lambda: p_rows}[relation]()
    if relation == "narrower target":
        p_rows = moved(draw, q_rows)
    return Model(p_rows, params), Model(q_rows, params)


@st.composite
def chain_cases(draw):
    V = draw(st.integers(2, 6))
    K = draw(st.integers(0, 4))
    p, q = draw(target_and_draft(V))
    return p, q, draw(st.sampled_from(DRAFT_KINDS)), K


@st.composite
def tree_cases(draw):
    V = draw(st.integers(2, 6))
    width = draw(st.integers(1, 4))
    p, q = draw(target_and_draft(V))
    repeats = width > V or draw(st.booleans())
    return TreeCase(
        p=p, q=q, width=width, depth=draw(st.integers(1, 3)),
        candidates=draw(st.sampled_from(["sampled", "one-hot as a distribution", "deterministic"])),
        branch_drafts=draw(st.sampled_from(DRAFT_KINDS)),
        pad_order=tuple(draw(st.permutations(range(V)))),
        pad_tokens=tuple(draw(st.lists(st.integers(0, V - 1), min_size=width, max_size=width))) if repeats else None,
        fixed=tuple(draw(st.lists(st.integers(0, V - 1), min_size=width, max_size=width))),
    )


# The bug a review found, in miniature: top-2 of p is {0, 1}, q's is {2, 3}, and the width-3 tree pads with 0.
TOP2 = SamplingParams(temperature=1.0, top_k=2)
NARROW_DRAFT = TreeCase(p=Model(((1.0, 0.5, -1.0, -2.0),), TOP2), q=Model(((-2.0, -1.0, 1.0, 0.5),), TOP2),
                        width=3, depth=1, candidates="sampled", branch_drafts="sampled", pad_order=(0, 1, 2, 3),
                        pad_tokens=None, fixed=(0, 1, 2))


def describe(p: Model, q: Model) -> None:
    """Coverage, in `pytest --hypothesis-show-statistics`: where the first-position supports of p and q differ."""
    p0, q0 = p.at(ROOT)[0] > 0, q.at(ROOT)[0] > 0
    event(f"T = {p.params.temperature}; q = 0 < p: {bool((p0 & ~q0).any())}; p = 0 < q: {bool((q0 & ~p0).any())}")


def assert_same_distribution(got: torch.Tensor, want: torch.Tensor) -> None:
    assert math.isclose(float(got.sum()), 1.0, abs_tol=TOLERANCE), f"total mass {float(got.sum())}"
    worst = float((got - want).abs().max())
    assert worst <= TOLERANCE, f"max |P_spec - P_target| = {worst:.3g}\nspec\n{got}\ntarget\n{want}"


@EXACTNESS
@given(chain_cases())
def test_a_verified_chain_emits_exactly_the_target_joint_for_any_draft_and_truncation(case):
    p, q, kind, K = case
    describe(p, q)
    event(f"chain: V = {p.V}, K = {K}, {kind}")
    assert_same_distribution(chain_joint(p, q, kind, K), target_joint(p, K + 1))


@EXACTNESS
@given(chain_cases())
def test_block_verification_emits_exactly_the_target_joint_for_any_draft_and_truncation(case):
    p, q, kind, K = case
    describe(p, q)
    event(f"block chain: V = {p.V}, K = {K}, {kind}")
    assert_same_distribution(chain_joint(p, q, kind, K, rule="block"), target_joint(p, K + 1))


@EXACTNESS
@given(chain_cases())
def test_block_verification_accepts_at_least_as_many_drafts_as_token_verification_on_average(case):
    p, q, kind, K = case
    block, token = expected_accepted(p, q, kind, K, "block"), expected_accepted(p, q, kind, K, "token")
    event("block accepts more" if block > token + TOLERANCE else "equal")
    assert block >= token - TOLERANCE, f"E[accepted]: block {block}, token {token}"


@EXACTNESS
@given(tree_cases())
@example(NARROW_DRAFT)
def test_a_verified_tree_emits_exactly_the_target_joint_for_any_candidates_and_padding(case):
    describe(case.p, case.q)
    q_first = first_draft(case)
    padding = q_first is not None and int((q_first > 0).sum()) < case.width
    event(f"tree: w = {case.width}, k = {case.depth}, {case.candidates}" + (", padded" if padding else ""))
    assert_same_distribution(tree_joint(case), target_joint(case.p, case.depth + 1))


def test_a_padded_candidate_is_never_accepted_even_where_the_residual_has_mass():
    """The reviewed bug's mechanism: stage 3 of NARROW_DRAFT holds padding token 0 with s_3(0) = 0, r_3(0) > 0."""
    case = NARROW_DRAFT
    q_first, p_root = case.q.at(ROOT), case.p.at(ROOT)
    accept, final = first_token_stages(torch.tensor([[2, 3, 0]]), q_first, p_root)
    assert accept[0, 2].item() == 0.0 and final[0, 0].item() > 0
    torch.testing.assert_close(final, p_root)  # q's candidates had no target mass: the residual is still p


# ---- the samplers: each one's draws against the law it reports ----
#
# The closed forms above take the verifier's probabilities as given; these check the draws themselves, where
# floating point can break them: ids of tiny mass. q puts 1 - 1e-4 on id 0 and 1e-8 on each of 10,000 more ids,
# so a sampler that draws each id with its probability puts Binomial(N, 1e-4) of N draws in that tail: 20 of
# 200,000. One that misses the tail (a 1e-4 deviation in total variation) puts ~0 there, and the binomial test
# rejects it (p < 1e-8); Gumbel top-w keys from float32 uniforms, the tree sampler before float64, drew an id of
# 1e-8 the leader's mass with 1.5% of its probability (~0.3 of the 20). Seeded, so reproducible; a correct sampler
# fails with probability 1e-4 (the p-value threshold).
TAIL_IDS, TAIL_ID_MASS, DRAWS, CHUNK = 10_000, 1e-8, 200_000, 250


def tail_draft() -> torch.Tensor:
    """[1 + TAIL_IDS] float32: q above."""
    q = torch.full((1 + TAIL_IDS,), TAIL_ID_MASS)
    q[0] = 1 - TAIL_IDS * TAIL_ID_MASS
    return q


def assert_tail_law(hits: int, draws: int, tail_mass: float) -> None:
    from scipy.stats import binomtest

    pvalue = binomtest(hits, draws, tail_mass).pvalue
    assert pvalue > 1e-4, f"{hits} of {draws} draws in the tail, {draws * tail_mass:.1f} expected (p = {pvalue:.2g})"


def tail_hits(sample, q: torch.Tensor, seed: int = 0, draws: int = DRAWS) -> list[torch.Tensor]:
    """`sample(rows [CHUNK, V], generator) -> ids [CHUNK, ...]` over `draws` rows of q, in chunks."""
    generator = torch.Generator().manual_seed(seed)
    rows = q.expand(CHUNK, -1).contiguous()
    return [sample(rows, generator) for _ in range(draws // CHUNK)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32-kernel", "float64-torch"])
def test_draw_takes_each_id_with_its_probability_down_to_tiny_masses(dtype):
    """`sampling.draw` (a chain's draft tokens off the kernel, every residual and bonus token); fp32 rows run
    in the kernel, float64 rows in PyTorch, and both agree id for id on random rows at the same uniforms."""
    from specrl.sampling import draw

    q = tail_draft().to(dtype)
    if dtype == torch.float32:
        ids = torch.cat(tail_hits(draw, q))
        assert_tail_law(int((ids > 0).sum()), DRAWS, float(q[1:].double().sum()))
    rows = torch.rand(64, 1000, generator=torch.Generator().manual_seed(1)).pow(8).to(dtype)
    rows[:, ::3] = 0  # ids without mass
    assert torch.equal(draw(rows, torch.Generator().manual_seed(2)),
                       draw(rows.double() if dtype == torch.float32 else rows.float(), torch.Generator().manual_seed(2)))


def test_the_draft_sampler_takes_each_id_with_the_probability_it_reports():
    """`kernels.draft_sampler.sample` (a chain's draft tokens at a temperature, untruncated): the draws against
    the q it returns."""
    from specrl.kernels import draft_sampler

    logits = tail_draft().log()
    reported = []

    def sample(rows, generator):
        ids, q = draft_sampler.sample(rows, 1.0, generator)
        reported.append(q[0, 1:].double().sum())
        return ids

    ids = torch.cat(tail_hits(sample, logits))
    tail_mass = float(reported[0])
    assert math.isclose(tail_mass, 1e-4, rel_tol=1e-4) and all(float(m) == tail_mass for m in reported)
    assert_tail_law(int((ids > 0).sum()), DRAWS, tail_mass)


def test_tree_candidates_are_sequential_draws_without_replacement_down_to_tiny_masses():
    """`sampling.draw_without_replacement`, the tree's candidate first tokens (`HeadProposer.propose_tree`), at
    width 2: the first candidate ~ q, the second ~ q without the first, renormalised. The second is id 0 only
    when a tail id came first: P = sum over tail ids y of q(y) q(0) / (1 - q(y)), ~1e-4 again."""
    from specrl.sampling import draw_without_replacement

    q = tail_draft()
    pairs = torch.cat(tail_hits(lambda rows, g: draw_without_replacement(rows, 2, g), q))
    assert bool((pairs[:, 0] != pairs[:, 1]).all())
    qd = q.double()
    assert_tail_law(int((pairs[:, 0] > 0).sum()), DRAWS, float(qd[1:].sum()))
    second_is_head = float((qd[1:] * qd[0] / (1 - qd[1:])).sum())
    assert_tail_law(int((pairs[:, 1] == 0).sum()), DRAWS, second_is_head)


def test_tree_candidates_pad_with_distinct_ids_of_no_mass_once_the_draft_is_used_up():
    from specrl.sampling import draw_without_replacement

    q = torch.tensor([[0.0, 0.7, 0.0, 0.3, 0.0]]).expand(2000, -1)
    drawn = draw_without_replacement(q, 4, torch.Generator().manual_seed(0))
    assert set(map(tuple, drawn[:, :2].sort(1).values.tolist())) == {(1, 3)}
    assert bool((drawn[:, 2:] == torch.tensor([0, 2])).all())  # padding: the lowest ids left, without mass
    first = torch.bincount(drawn[:, 0], minlength=5).double()
    from scipy.stats import chisquare
    assert chisquare(first[[1, 3]], torch.tensor([0.7, 0.3]) * 2000).pvalue > 1e-4


def test_the_residual_draw_takes_each_id_with_its_probability_down_to_tiny_masses():
    """The token drawn after a rejection: p = 1/2 on id 0, 1/2 - 1e-4 on id 1, 1e-8 on each of 10,000 more; the
    draft proposes id 0 (one-hot), rejected with probability 1/2. The residual norm(max(0, p - q)) puts 2e-4 on
    the tail, 2e-8 an id: the same in `verify` (`recovery_probs`), `block_verify` (`block_rule`) and a width-1
    tree (`first_token_stages`); the draws from it against it."""
    from specrl.sampling import draw
    from specrl.speculation.tree import first_token_stages

    p = torch.full((2 + TAIL_IDS,), TAIL_ID_MASS)
    p[0], p[1] = 0.5, 0.5 - TAIL_IDS * TAIL_ID_MASS
    drafts, target = torch.tensor([[0]]), torch.stack([p, p]).unsqueeze(0)  # K = 1: [1, 2, V]
    residual = recovery_probs(drafts, None, target)[0, 0]
    _, block_rows = block_rule(drafts, None, target)
    _, tree_final = first_token_stages(drafts, None, p.unsqueeze(0))
    for other in (block_rows[0, 0] / block_rows[0, 0].sum(), tree_final[0]):
        torch.testing.assert_close(other, residual, rtol=1e-6, atol=0)
    assert residual[0] == 0 and math.isclose(float(residual[2:].double().sum()), 2e-4, rel_tol=1e-5)
    ids = torch.cat(tail_hits(draw, residual, seed=1, draws=DRAWS // 2))  # 2e-4 of tail: 20 expected again
    assert_tail_law(int((ids > 1).sum()), DRAWS // 2, float(residual[2:].double().sum()))
