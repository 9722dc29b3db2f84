"""The engine's speculative samples against the exact target, across proposers and truncations (tiny model).

`test_exactness_properties.py` proves the verifiers exact on small random cases; this file checks the
engine end to end: proposers, the engine's own truncation of p and q, tree attention and the K/V moves.

Chain of invariants (prompt [3, 1, 3, 1, 3], temperature 1, seeded):
    reference   p from transformers' logits under the call's top-k / top-p (`sampling_distribution`, float64)
                keeps the same tokens as the engine's own model, so the expected support is well posed;
    matrix      trees (MTP and EAGLE-3 heads, fixed width 3, k = 1 and 2) and chains (draft model and
                n-gram, k = 2, block and token verification; an EAGLE-3 tree and a draft-model chain under
                drafter-invariant sampling), for top_k in {0, 2} x top_p in {1, 0.5}: the joint of the first two
                sampled tokens ~ p(t0) p(t1 | t0) by chi-square, and no token outside p's support;
    reproduction the reviewed bug (MTP head, top_k = 2, K = 1, width 3; 2000 one-token samples): the head's
                top-2 misses the target's, so every tree holds a padded candidate of zero draft mass inside
                p's support (checked), and the first token ~ p. The pre-fix acceptance rule (q = 0 -> accept
                iff p > 0) emitted that padded token every time.
Each chi-square pools cells expected below 5 and fails a correct sampler with probability 1e-4 (the p-value
threshold), at most 41 * 1e-4 = 4.1e-3 for the file; seeded, so an outcome is reproducible.
"""
from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from helpers import make_head
from specrl.engine.engine import EngineConfig, RolloutEngine
from specrl.models.llama import LlamaModel
from specrl.sampling import SamplingParams, sampling_distribution
from specrl.speculation.draft_model import DraftModelProposer
from specrl.speculation.head_proposer import HeadProposer
from specrl.speculation.ngram import NgramProposer

PROMPT = [3, 1, 3, 1, 3]
pytestmark = pytest.mark.usefixtures("one_thread_module")  # the budget is one core
P_VALUE = 1e-4
TRUNCATIONS = [(0, 1.0), (2, 1.0), (0, 0.5), (2, 0.5)]  # (top_k, top_p)
# (proposer, k, width, chain verification): trees verify stage by stage whatever the chain rule; "invariant" is
# drafter-invariant sampling (`SamplingParams.drafter_invariant`), for chains and trees alike
SPECULATION = [("mtp", 1, 3, "block"), ("mtp", 2, 3, "block"), ("eagle3", 1, 3, "block"), ("eagle3", 2, 3, "block"),
               ("draft", 2, 1, "block"), ("draft", 2, 1, "token"), ("ngram", 2, 1, "block"), ("ngram", 2, 1, "token"),
               ("eagle3", 2, 3, "invariant"), ("draft", 2, 1, "invariant")]


@pytest.fixture(scope="module")
def target(target_dir):
    return LlamaModel.from_pretrained(target_dir)


@pytest.fixture(scope="module")
def draft(draft_dir):
    return LlamaModel.from_pretrained(draft_dir)


@pytest.fixture(scope="module")
def reference_logits(target_dir):
    """[1 + V, V] float64 transformers logits: row 0 after PROMPT, row 1 + t after PROMPT + [t]."""
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(target_dir).eval()
    V = hf.config.vocab_size
    with torch.no_grad():
        first = hf(torch.tensor([PROMPT])).logits[0, -1]
        second = hf(torch.tensor([PROMPT + [t] for t in range(V)])).logits[:, -1]
    return torch.cat([first.unsqueeze(0), second]).double()


def exact_p(reference_logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """[1 + V, V] float64: p after PROMPT, then after PROMPT + [t], under `params`' truncation."""
    return sampling_distribution(reference_logits, params)[0]


def make_engine(target, draft, proposer: str, k: int, width: int, verification: str = "block") -> RolloutEngine:
    chosen = {
        "mtp": lambda: HeadProposer(make_head("mtp", target)),
        "eagle3": lambda: HeadProposer(make_head("eagle3", target)),  # a reduced vocabulary: every other id
        "draft": lambda: DraftModelProposer(draft, target.cfg.vocab_size),
        "ngram": lambda: NgramProposer(),
    }[proposer]()
    return RolloutEngine(target, proposer=chosen,
                         config=EngineConfig(num_speculative_tokens=k, adaptive=False, fixed_tree_width=width,
                                             verification=verification))


def chi_square_pvalue(cells: torch.Tensor, probs: torch.Tensor) -> float:
    """Samples' cell ids [n] against cell probabilities [C]: no sample may land on a zero-probability cell;
    cells expected below 5 are pooled so the chi-square approximation holds. One cell of mass (a truncation
    that leaves a single path, as top_k = 2 with top_p = 0.5 does here) has nothing left to test: 1.0."""
    observed = torch.bincount(cells, minlength=probs.numel()).double()
    assert observed[probs == 0].sum() == 0, f"sampled cells the target gives probability 0: " \
                                            f"{(observed * (probs == 0)).nonzero().flatten().tolist()}"
    expected = probs * cells.numel()
    big, small = expected >= 5, (expected > 0) & (expected < 5)
    pooled = [observed[small].sum().view(1), expected[small].sum().view(1)] if small.any() else [observed[:0]] * 2
    obs, exp = torch.cat([observed[big], pooled[0]]), torch.cat([expected[big], pooled[1]])
    if obs.numel() < 2:
        return 1.0
    return chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


def test_the_reference_truncation_keeps_the_same_tokens_as_the_engines_model(target, reference_logits):
    """The expected supports are well posed: transformers' and the engine's logits agree on every truncation."""
    V = target.cfg.vocab_size
    seqs = torch.tensor([PROMPT + [0]] + [PROMPT + [t] for t in range(V)])
    logits, _ = target.forward(seqs, target.new_cache(seqs.shape[0], seqs.shape[1]))
    ours = torch.cat([logits[:1, -2], logits[1:, -1]]).double()  # after PROMPT, then after PROMPT + [t]
    assert (ours - reference_logits).abs().max() < 1e-4
    for top_k, top_p in TRUNCATIONS:
        params = SamplingParams(top_k=top_k, top_p=top_p)
        assert torch.equal(exact_p(ours, params) > 0, exact_p(reference_logits, params) > 0), (top_k, top_p)


@pytest.mark.slow
@pytest.mark.parametrize("top_k, top_p", TRUNCATIONS, ids=[f"top_k={k}-top_p={p}" for k, p in TRUNCATIONS])
@pytest.mark.parametrize("proposer, k, width, verification", SPECULATION,
                         ids=[f"{n}-k={k}-w={w}-{v}" for n, k, w, v in SPECULATION])
def test_speculative_two_token_samples_follow_the_truncated_target(target, draft, reference_logits, proposer, k,
                                                                   width, verification, top_k, top_p):
    """6000 two-token samples; chi-square against p(t0) p(t1 | t0), false failure odds 1e-4."""
    n = 6000
    invariant = verification == "invariant"
    params = SamplingParams(n=n, temperature=1.0, top_k=top_k, top_p=top_p, max_tokens=2, ignore_eos=True, seed=0,
                            drafter_invariant=invariant)
    result = make_engine(target, draft, proposer, k, width, "block" if invariant else verification).generate([PROMPT],
                                                                                                          params)
    p = exact_p(reference_logits, params)
    V = p.shape[1]
    joint = (p[0].unsqueeze(1) * p[1:]).flatten()  # [V * V]: (t0, t1) -> t0 * V + t1
    pairs = torch.tensor([c.token_ids for c in result.completions])  # [n, 2]
    assert chi_square_pvalue(pairs[:, 0] * V + pairs[:, 1], joint) > P_VALUE
    assert result.spec.num_drafts > 0 and result.width_histogram.get(width, 0) > 0  # it speculated, at this width


def test_the_reviewed_narrow_draft_tree_samples_the_first_token_from_the_target(target, draft, reference_logits):
    """The review's reproduction: MTP head, T = 1, top_k = 2, K = 1, fixed width 3, 2000 one-token samples.

    The head's top-2 differs from the target's, so the third candidate is padding of zero draft mass. The
    proposer pads with the lowest ids left, outside p's support here; the review's case had the padding inside it
    (where the pre-fix rule accepted it, emitting it in every sample), so the padding is swapped for p's most
    likely token (any padding of zero draft mass is the proposer's to choose: `speculation.tree`), and the test
    checks that it is there. Chi-square of the first token against p; false failure odds 1e-4.
    """
    n = 2000
    params = SamplingParams(n=n, temperature=1.0, top_k=2, max_tokens=1, ignore_eos=True, seed=0)
    p = exact_p(reference_logits, params)[0]  # [V]
    engine = make_engine(target, draft, "mtp", k=1, width=3)
    proposals = []
    propose_tree = engine.proposer.propose_tree

    def padded_inside_p(context, k, width):
        proposal = propose_tree(context, k, width)
        padding = proposal.q_first.gather(1, proposal.candidates) == 0
        proposal.candidates = torch.where(padding, p.argmax(), proposal.candidates)
        proposals.append(proposal)
        return proposal

    engine.proposer.propose_tree = padded_inside_p
    result = engine.generate([PROMPT], params)
    first = proposals[0]
    padding = first.q_first.gather(1, first.candidates) == 0  # [n, 3]
    assert (padding & (p[first.candidates] > 0)).any(1).all(), "no padded candidate inside p's support: " \
                                                               "this no longer reproduces the reviewed case"
    tokens = torch.tensor([c.token_ids[0] for c in result.completions])
    assert chi_square_pvalue(tokens, p) > P_VALUE


@pytest.mark.parametrize("proposer", ["eagle3", "mtp"])
def test_tree_candidates_follow_the_first_draft_distribution_the_proposer_reports(target, draft, proposer):
    """`HeadProposer.propose_tree` at T = 1, width 3, on 4000 rows of one prompt: every row reports the same
    q_first; the first candidates ~ q_first, the second ~ its law after one draw without replacement,
    sum_y q(y) q(x) / (1 - q(y)) over y != x (chi-square each, false failure odds 1e-4). The tiny-mass end of
    the same law is `test_exactness_properties`' (the sampler, `draw_without_replacement`)."""
    n = 4000
    engine = make_engine(target, draft, proposer, k=1, width=3)
    proposals = []
    propose_tree = engine.proposer.propose_tree

    def recorded(context, k, width):
        proposals.append(propose_tree(context, k, width))
        return proposals[-1]

    engine.proposer.propose_tree = recorded
    engine.generate([PROMPT], SamplingParams(n=n, temperature=1.0, max_tokens=1, ignore_eos=True, seed=3))
    first = proposals[0]
    q = first.q_first[0].double()
    assert torch.equal(first.q_first, first.q_first[:1].expand_as(first.q_first))
    second = q * ((q / (1 - q)).sum() - q / (1 - q))  # x: sum over y != x of q(y) q(x) / (1 - q(y))
    assert chi_square_pvalue(first.candidates[:, 0], q) > P_VALUE
    assert chi_square_pvalue(first.candidates[:, 1], second / second.sum()) > P_VALUE
