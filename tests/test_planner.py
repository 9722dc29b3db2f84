"""The planner on synthetic step times."""
import numpy as np

from specrl.speculation.planner import Planner, StepPlan
from specrl.speculation.step_time import StepTimeModel
from specrl.speculation.acceptance import expected_tokens


def run_planner(step_seconds, acceptance: float, batches: list[int], max_k: int = 3) -> list[int]:
    """Drive a planner with a synthetic cost model; returns the K it chose per step."""
    planner = Planner(max_k=max_k)
    chosen = []
    for batch in batches:
        k = planner.choose(batch)
        chosen.append(k)
        accepted = [round(batch * acceptance ** (i + 1)) for i in range(k)]
        planner.observe(batch, k, step_seconds(batch, k), accepted)
    return chosen


def test_expected_tokens_matches_the_iid_closed_form():
    a = 0.6
    assert abs(expected_tokens(3, [a, a**2, a**3]) - (1 - a**4) / (1 - a)) < 1e-12


def test_step_time_model_predicts_unseen_batch_sizes_and_k():
    model = StepTimeModel()
    cost = lambda b, k: 0.01 + 0.002 * b * (k + 1) + k * (0.003 + 0.0001 * b)  # noqa: E731
    for batch, k in [(64, 0), (48, 0), (32, 3), (16, 0), (64, 2), (8, 1), (20, 3)]:
        model.add(batch, k, cost(batch, k))
    assert abs(model.predict(4, 3) - cost(4, 3)) < 1e-6
    assert abs(model.predict(100, 1) - cost(100, 1)) < 1e-6


def test_two_parameter_fits_solved_in_closed_form_match_least_squares():
    """The plain and draft fits are solved in closed form; the result is the decayed, ridged least squares."""
    from specrl.speculation.step_time import draft_features, plain_features
    rng = np.random.default_rng(0)
    for features in (plain_features, draft_features):
        model, rows, times = StepTimeModel(decay=0.9, features=features), [], []
        for step in range(30):
            batch, k = int(rng.integers(1, 65)), int(rng.integers(1, 9))
            seconds = 0.001 + 0.0002 * batch * k + rng.normal(0, 1e-5)
            model.add(batch, k, seconds)
            rows.append(features(batch, k))
            times.append(seconds)
        weights = 0.9 ** np.arange(len(rows))[::-1]
        x, y = np.array(rows), np.array(times)
        xtx = (x * weights[:, None]).T @ x
        expected = np.linalg.solve(xtx + 1e-9 * np.trace(xtx) * np.eye(2), (x * weights[:, None]).T @ y)
        assert np.allclose(model.coef, expected, rtol=1e-9, atol=1e-15)
    empty = StepTimeModel(features=plain_features)
    assert empty.coef == [0.0, 0.0] and empty.predict(8, 0) == 0.0


def test_steps_noted_between_fits_weigh_as_if_each_had_been_added_alone():
    """`add` only notes a step; the noted steps join the sums when a fit is next needed, or every FOLD_AT
    steps. Whenever the fits are read, the sums are the decayed ones of the steps one by one."""
    rng = np.random.default_rng(1)
    model, rows, times = StepTimeModel(decay=0.95), [], []
    for step in range(200):  # past FOLD_AT without a read, then reads at uneven gaps
        batch, k = int(rng.integers(1, 65)), int(rng.integers(0, 9))
        seconds = 0.002 + 0.0003 * batch * (k + 1) + rng.normal(0, 1e-5)
        model.add(batch, k, seconds)
        rows.append(model.features(batch, k))
        times.append(seconds)
        if step > 150 and step % 7 == 0 or step == 199:
            weights = 0.95 ** np.arange(len(rows))[::-1]
            x = np.array(rows)
            assert model.fitted and model.coef is not None
            assert np.allclose(model.xtx, (x * weights[:, None]).T @ x, rtol=1e-10)
            assert np.allclose(model.xty, (x * weights[:, None]).T @ np.array(times), rtol=1e-10)
    assert not StepTimeModel().fitted


def test_a_step_far_cheaper_than_the_fit_predicts_makes_it_forget_the_stalled_steps_before():
    """Three plain steps at 100 ms (a thread descheduled), then the usual 1 ms: forgetting alone keeps the fit near
    the stalled steps until many usual ones ran. A step under 1 / STALL_RATIO of the prediction keeps STALL_KEEP of
    the weight before it; one merely cheaper (half the prediction) only joins the fit as any step does."""
    from specrl.speculation.step_time import plain_features
    stalled, usual = 0.1, 0.001
    for first, expected_below in ((stalled, 2 * usual), (2 * usual, 1.9 * usual)):
        model = StepTimeModel(decay=0.9, features=plain_features)
        for batch in (1, 2, 1):
            model.add(batch, 0, first)
        model.predict(1, 0)  # the planner prices (solves the fit) before each step
        model.add(1, 0, usual)
        model.predict(2, 0)
        model.add(2, 0, usual)
        assert model.predict(1, 0) < expected_below and model.predict(2, 0) < expected_below
        if first == stalled:
            assert model.predict(1, 0) > usual * 0.9
        else:  # not a stall: the steps before still weigh
            assert model.predict(1, 0) > 1.3 * usual


def test_a_batch_range_measured_only_plainly_is_priced_by_physics_not_extrapolation():
    """As on `tiny`, whose forward is all overhead: every pass costs ~1 ms whatever its rows, so speculation
    pays at any batch. After speculating at batch 1 only, the verify and draft models could not tell their
    slopes in B, and extrapolated to batch 8 they priced k = 3 at 3x its cost, so batch 8 decoded plainly
    (0.86x of the plain engine in `bench drafters`). Priced as the bound prices it until a speculative step
    runs there (the verify pass as a plain pass over the same tokens, the drafts at their batch-1 cost scaled
    as a plain step's), batch 8 speculates."""
    planner = Planner(max_k=3, prior_acceptance=0.9)
    cost = lambda b, k: 0.001 * (1 + b / 256) * (1 + 0.5 * k)  # noqa: E731  a draft pass: half a plain step
    chosen = {1: [], 8: []}
    for batch in [1] * 200 + [8] * 200:
        k = planner.choose(batch)
        chosen[batch].append(k)
        draft = 0.0005 * (1 + batch / 256) * k
        planner.observe(batch, k, cost(batch, k), [round(batch * 0.9 ** (i + 1)) for i in range(k)],
                        draft_seconds=draft)
    assert chosen[1][-100:].count(3) >= 90  # but for the plain steps that keep the plain fit current
    assert chosen[8][-100:].count(3) >= 90


def test_a_drain_learned_at_large_batches_speculates_in_its_tail():
    """GRPO's rollouts start at 32 rows, where verifying is compute-bound and speculation loses, and drain to
    1, where it pays ~1.6x. Explored at ~20 rows first, the draft fit knows its cost there only; priced at the
    tail by that cost scaled as a plain step's (not as flat in B, which kept every drain's tail plain), the
    tail speculates."""
    planner = Planner(max_k=8, prior_acceptance=0.95)
    plain = lambda b: 0.018 + 0.002 * b  # noqa: E731
    draft_pass = lambda b: 0.006 + 0.0012 * b  # noqa: E731
    tail = []
    for call in range(6):
        planner.prefilled()
        for batch in [32] * 4 + list(range(32, 0, -1)) + [1] * 8:
            k = planner.choose(batch)
            if call == 5 and batch <= 2:
                tail.append(k)
            draft = k * draft_pass(batch)
            planner.observe(batch, k, plain(batch * (1 + k)) + draft, [round(batch * 0.95 ** (i + 1)) for i in range(k)],
                            draft_seconds=draft)
    assert sum(k >= 3 for k in tail) >= len(tail) - 2, tail


def test_a_draft_dearer_per_row_at_more_rows_is_measured_in_the_tail_where_it_pays():
    """The int8 self-draft on AVX2 at 1 thread (`bench rollout --batch 4`): its pass is bound by memory at one row
    (0.37 of a plain step) and by integer multiply-adds from two (0.85 at four rows), so it loses at 4 rows and
    pays ~1.8x at one. Measured at 4 rows only and scaled down to one as a plain step's cost scales, the drafts
    were priced at 2.3x their cost there and the tail never drafted (0.98x). Scaled in proportion to the rows
    (the least a pass can cost), the tail's first step speculates and measures the draft there; and each k not
    yet run in a range is priced as the bound prices it, not by the verify fit's extrapolation from other k."""
    planner = Planner(max_k=8, refresh_every=10_000)  # no refresh: pricing alone must find the tail
    plain = lambda b: max(0.038 + 0.0024 * b, 0.010 + 0.0081 * b)  # noqa: E731  memory-, then compute-bound
    draft_pass = lambda b: 0.0065 + 0.0085 * b  # noqa: E731
    drain = [4] * 40 + [3] * 20 + [2] * 20 + [1] * 30
    for call in range(3):
        planner.prefilled()
        tail, spent, kept = [], 0.0, 0
        for batch in drain:
            k = planner.choose(batch)
            draft = k * draft_pass(batch)
            accepted = [round(batch * 0.95 ** (i + 1)) for i in range(k)]
            seconds = plain(batch * (1 + k)) + draft
            planner.observe(batch, k, seconds, accepted, draft_seconds=draft)
            if batch == 1:
                tail.append(k)
                spent, kept = spent + seconds, kept + 1 + sum(accepted)
    assert tail.count(4) >= len(tail) - 2, tail  # k = 4 pays most at one row: 1.83x
    assert kept / spent > 1.7 / plain(1)


def test_plain_decoding_is_priced_where_it_was_measured_not_by_a_line_through_the_drain():
    """A plain step is DRAM-bound, flat, up to ~6 rows (SmolLM2 at 2 threads: ~20 ms from 1 to 6 rows) and
    compute-bound past it. A line through a drain's plain steps, most at 16-32 rows, priced one at 4 rows at
    18 ms against 20 measured, so a GRPO drain decoded plainly at 4-7 rows where k = 3 paid. Priced by the
    plain steps measured at each size, the drain speculates at 2-4 rows (priced by the line: plainly down to 2)."""
    planner = Planner(max_k=3, prior_acceptance=0.95)
    plain = lambda b: max(0.020, 0.0025 * b)  # noqa: E731  flat to 8 rows, then compute-bound
    draft_pass = 0.005
    middle = []
    for call in range(8):
        planner.prefilled()
        for batch in [b for b in range(32, 0, -1) for _ in range(3)]:
            k = planner.choose(batch)
            if call == 7 and 2 <= batch <= 4:
                middle.append(k)
            planner.observe(batch, k, plain(batch * (1 + k)) + k * draft_pass,
                            [round(batch * 0.95 ** (i + 1)) for i in range(k)], draft_seconds=k * draft_pass)
    assert abs(planner.plain_seconds(4) / plain(4) - 1) < 0.01
    assert abs(planner.plain_seconds(24) / plain(24) - 1) < 0.01
    assert sum(k > 0 for k in middle) >= len(middle) - 2, middle  # k = 2 pays 1.42x at 4 rows


def test_plain_decoding_between_two_sizes_measured_is_priced_between_them():
    """A size a drain has not decoded plainly at yet is priced between the nearest sizes it has, not by the line
    through them all: flat to 8 rows and compute-bound past it, the line prices 4 rows at ~18 ms against 20."""
    planner = Planner(max_k=3)
    plain = lambda b: max(0.020, 0.0025 * b)  # noqa: E731
    for _ in range(3):
        for batch in (1, 8, 16, 24, 32):
            planner.observe(batch, 0, plain(batch), [])
    assert planner.plain_times.predict(4, 0) < 0.95 * plain(4)  # the line, the compute-bound steps weighing most
    assert abs(planner.plain_seconds(4) / plain(4) - 1) < 0.01
    assert abs(planner.plain_seconds(12) / ((plain(8) + plain(16)) / 2) - 1) < 0.01
    assert planner.plain_seconds(40) == planner.plain_times.predict(40, 0)  # past the sizes measured: the line


def test_the_first_speculative_step_is_not_fitted():
    """The planner's first speculative step pays one-time costs (on `tiny`, the first in a process: 6.9 ms
    against 1.1, its draft 0.48 against 0.33 ms). With a draft whose bound is near plain decoding's, that one
    measurement fitted priced every option out for good: the engine never speculated."""
    planner = Planner(max_k=3, prior_acceptance=0.95)
    chosen, drafted = [], False
    for _ in range(300):
        k = planner.choose(1)
        chosen.append(k)
        draft = 0.0006 * k * (1 if drafted or not k else 2)  # the first draft costs twice as much
        drafted = drafted or bool(k)
        planner.observe(1, k, 0.001 + draft, [1] * k, draft_seconds=draft)
    assert chosen[-100:].count(3) >= 90


def test_the_first_speculative_step_in_each_batch_range_is_not_fitted():
    """`tiny`'s int8 self-draft (`bench drafters`, batches 1 then 4): a draft's first pass over 4 rows took
    0.33-0.48 ms against 0.20 for the next ones. Where that first step was a k = 1 step, its one pass priced
    every option at 4 rows out (`_could_pay`) and the cell never speculated (0.99x, in 2 of 10 runs). The first
    speculative step in each power-of-two range of B is not fitted: it is measured again."""
    planner = Planner(max_k=8, prior_acceptance=0.95)
    chosen, cold = [], {1, 4}
    for step in range(400):
        batch = 1 if step < 3 else 4  # explores at one row end with k = 1: the first step at 4 rows is k = 1 too
        k = planner.choose(batch)
        chosen.append(k)
        drafts = k * (0.000175 if batch == 1 else 0.0002) + (0.0003 if k and batch in cold else 0.0)
        cold -= {batch} if k else set()
        planner.observe(batch, k, 0.0005 + 0.00001 * batch * (k + 1) + drafts,
                        [round(batch * 0.95 ** (i + 1)) for i in range(k)], draft_seconds=drafts)
    assert chosen[:5] == [0, 0, 1, 0, 0] and chosen[5] == 1
    assert sum(1 for k in chosen[-200:] if k) >= 180


def test_memory_bound_verification_with_good_drafts_uses_the_largest_k():
    # verifying k+1 tokens costs about one token's time; drafts are cheap and often right
    chosen = run_planner(lambda b, k: 0.05 + 0.002 * k, acceptance=0.8, batches=[4] * 30)
    assert chosen[-10:] == [3] * 10


def test_compute_bound_verification_switches_speculation_off():
    # every verified token costs as much as a decoded one: speculation cannot pay at 50% acceptance
    chosen = run_planner(lambda b, k: 0.001 * b * (k + 1), acceptance=0.5, batches=list(range(63, 31, -1)))
    # one power-of-two range: the only speculative steps are the exploratory ones: after k = 0 twice, k = 1
    # (the cheapest draft; twice, as the planner's first speculative step is not fitted), 2, and k = 3 twice
    assert chosen[:7] == [0, 0, 1, 1, 2, 3, 3] and set(chosen[7:37]) == {0}


def test_draining_batch_turns_speculation_on_once_it_pays():
    # per-token cost grows with the batch: speculation pays only at small batches
    cost = lambda b, k: 0.02 + 0.0005 * b * (k + 1)  # noqa: E731
    batches = list(range(128, 0, -1))
    chosen = run_planner(cost, acceptance=0.7, batches=batches)
    assert chosen[:7] == [0, 0, 1, 1, 2, 3, 3]  # exploration, once for the whole drain: k = 0 twice, 1 twice (the
    assert chosen[11] == 0  # first speculative step is not fitted), 2, 3 twice
    # below 12 rows every step speculates with k = 3, but for the plain step that measures each new
    # power-of-two range of the drain (two at 7, 6 and at 3, 2, right after speculative steps; 1 follows a
    # plain step); speculative options are not re-explored
    assert [k for b, k in zip(batches, chosen) if b <= 11] == \
        [0 if b in (7, 6, 3, 2, 1) else 3 for b in range(11, 0, -1)]


def test_a_draft_that_gets_better_is_noticed_while_speculation_is_off():
    planner = Planner(max_k=3)
    cost = lambda b, k: 0.02 + 0.0005 * b * (k + 1)  # noqa: E731
    acceptance = 0.0  # useless at first ...
    chosen = []
    for step in range(200):
        if step == 60:
            acceptance = 0.95  # ... then excellent (e.g. adapted online)
        k = planner.choose(8)
        chosen.append(k)
        planner.observe(8, k, cost(8, k), [round(8 * acceptance ** (i + 1)) for i in range(k)])
    assert set(chosen[20:60]) <= {0, 3} and chosen[20:60].count(3) <= 2  # one refresh after 32 steps off
    # the first refresh after the change (within the doubled wait, 64 steps) turns speculation on for good,
    # but for two plain steps after every 32 speculative ones (they keep the plain-step fit current; the
    # first, right after a speculative step, is not fitted)
    noticed = next(i for i in range(60, 200) if chosen[i])
    assert noticed <= 60 + 65
    assert chosen[noticed:] == ([3] * 32 + [0, 0]) * ((200 - noticed) // 34) + [3] * ((200 - noticed) % 34)


def test_refreshes_of_a_draft_that_never_pays_grow_rarer():
    """Verification is memory-bound, so a good draft would pay, but this one is rarely accepted:
    speculation never pays. After exploration, the refreshes come after 32, 64, 128, ... steps off (at
    most refresh_max), not every 32: 6 speculative steps in 3000 instead of ~90."""
    planner = Planner(max_k=3)
    chosen = []
    for _ in range(3000):
        k = planner.choose(8)
        chosen.append(k)
        planner.observe(8, k, 0.008 + 0.002 * k, [round(8 * 0.1 ** (i + 1)) for i in range(k)])
    refreshes = [i for i, k in enumerate(chosen) if k and i >= 7]  # after exploration
    gaps = [b - a for a, b in zip(refreshes, refreshes[1:])]
    assert gaps == [min(32 * 2 ** i, planner.refresh_max) + 1 for i in range(1, len(gaps) + 1)]
    assert len(refreshes) == 6


def test_probes_that_cost_many_plain_steps_wait_until_they_are_a_small_share_of_the_time():
    """A head proposer's first draft in a call catches up over the prompt (`tiny` at batch 16: a probe took
    ~12 ms against 1.6 ms for a plain step), one-off work the engine reports apart and the option's price leaves
    out. Refreshes after 32, 64, ... plain steps then cost ~7% of 800 steps' time; they wait until plain steps
    have paid off what the probes before them cost over plain decoding, at probe_share of their time."""
    planner = Planner(max_k=3)
    plain, verify, setup = 0.0016, 0.004, 0.010
    plain_paid = probes_paid = 0.0
    reasons = []
    for step in range(800):  # a benchmark's worth of 16-token calls
        if step % 16 == 0:
            planner.prefilled()
        plan = planner.choose_step(16)
        accepted = [round(16 * 0.1 ** (i + 1)) for i in range(plan.k)]
        if plan.k:
            paid = setup if not any(k for k, _ in reasons[step - step % 16:]) else 0.0
            planner.observe(16, plan.k, verify, accepted, draft_seconds=0.001, kept_tokens=16 + sum(accepted),
                            setup_seconds=paid)
            probes_paid += verify + paid - (16 + sum(accepted)) / 16 * plain
        else:
            planner.observe(16, 0, plain, [], kept_tokens=16)
            plain_paid += plain
        reasons.append((plan.k, plan.reason))
    probes = [reason for k, reason in reasons if k]
    assert "refresh" in probes  # refreshes still run
    first = verify + setup - plain  # the first probe's cost is not known before it runs
    assert probes_paid - first <= planner.probe_share * plain_paid


def run_calls(max_tokens: int, calls: int, setup: float, weights_changed: bool = False,
              planner: Planner | None = None) -> tuple[list[int], float, float]:
    """One-row calls of max_tokens on a memory-bound step (a chain of 3 drafts, all accepted, keeps 4 tokens
    for 1.6 plain steps' time) whose proposer pays `setup` seconds at a call's first speculative step.
    Returns per call its speculative steps, and the time the calls took against plain decoding's."""
    planner = planner or Planner(max_k=3)
    plain = 0.010
    spec_steps, took = [], 0.0
    for _ in range(calls):
        planner.prefilled(weights_changed)
        generated, drafted, set_up = 0, 0, False
        while generated < max_tokens:
            k = planner.choose_step(1, room=max_tokens - generated).k
            seconds = plain + 0.002 * k
            paid = setup if k and not set_up else 0.0
            set_up |= k > 0
            planner.observe(1, k, seconds, [1] * k, draft_seconds=0.001 * k, kept_tokens=k + 1,
                            setup_seconds=paid)
            took += seconds + paid
            generated += k + 1
            drafted += k > 0
        spec_steps.append(drafted)
    return spec_steps, took, calls * max_tokens * plain


def test_a_call_too_short_to_repay_the_proposers_setup_decodes_plainly():
    """A head's catch-up over a call's prompt, or a draft model's prefill, is paid by a call's first speculative
    step and left out of the option's price. Where a call is too short to repay it (16 tokens: a 0.1 s setup
    against the 0.096 s speculation could save), it decodes plainly but for probes; a long call (512) speculates."""
    spec_steps, took, plain = run_calls(16, 60, setup=0.1)
    assert sum(1 for n in spec_steps[20:] if n) <= 2 and took < 1.05 * plain
    spec_steps, took, plain = run_calls(512, 4, setup=0.1)
    assert min(spec_steps[1:]) >= 100 and took < 0.7 * plain


def test_setup_after_a_weight_load_is_priced_apart_from_a_calls_own():
    """A weight load makes the next call's proposer rebuild what it made from the weights (the int8 copy,
    ~0.1 s on SmolLM2; a head's repacked weights): a one-off that priced calls after it, without a load,
    out of speculating (the setup they would pay is never re-measured while they decode plainly). Each is
    priced by what the calls like it paid."""
    planner = Planner(max_k=3)
    run_calls(16, 20, setup=0.1, weights_changed=True, planner=planner)  # a rebuild at every call: plain
    spec_steps, took, plain = run_calls(16, 10, setup=0.0, planner=planner)  # no load: nothing to rebuild
    assert min(spec_steps) >= 3 and took < 0.7 * plain


def test_one_slow_draft_pass_bars_neither_explores_nor_refreshes():
    """`tiny` at batch 1: a k = 4 step's drafts took 3.8 ms (1.0 usual) once. Fitted, that priced every option
    out, and the explores and refreshes, priced by the same fit, never ran to correct it. Each prices its drafts
    at most at the cheapest pass measured, so max_k's second explore runs, and speculation goes on."""
    planner = Planner(max_k=4, prior_acceptance=0.95)
    draft = lambda k, slow=False: k * (0.001 if slow else 0.00025)  # noqa: E731
    verify = 0.0006
    chosen, slowed = [], False
    for step in range(300):
        k = planner.choose(1)
        chosen.append(k)
        slow = k == 4 and not slowed  # the first k = 4 step: one slow pass
        slowed |= slow
        planner.observe(1, k, verify + draft(k, slow) if k else 0.0006, [1] * k, draft_seconds=draft(k, slow))
    off = chosen.index(4) + 1
    assert chosen[off:off + 10].count(4) >= 9
    assert sum(1 for k in chosen[-100:] if k) >= 90
    planner = Planner(max_k=4, prior_acceptance=0.95)  # a refresh, where no explore is left: the same bound
    for step in range(40):
        k = planner.choose(1)
        planner.observe(1, k, 0.0006 + (draft(k, step > 20) if k else 0.0), [1] * k, draft_seconds=draft(k, step > 20))
    assert planner._could_pay(planner._refresh_option(), 1)
    planner.draft_times.add(1, 3, 1.0)  # a pass priced at a second by the fit
    assert planner._could_pay(planner._refresh_option(), 1)


def test_a_calls_first_draft_which_leaves_out_the_catching_up_does_not_open_every_explore():
    """`tiny`'s EAGLE-3 head at one row: a call's first speculative step reports the head's catching up over the
    prompt apart (setup), so its drafts cost 0.12-0.15 ms a pass; every later step catches up over the tokens kept
    too, 0.6-0.8 ms a pass. Explores bounded at the cheapest pass counting the first ran every chain and tree
    option, 19 steps that cost more than plain ones (eagle3 at one row read 0.90x in `bench drafters`, from 0.98x);
    past a call's first step, the bound is the pass as later steps pay it."""
    planner = Planner(max_k=3, max_width=3)
    speculative = 0
    for call in range(30):
        planner.prefilled()
        first = True
        for step in range(16):
            plan = planner.choose_step(1, room=16 - step)
            k, width = plan.k, plan.width
            drafts = 0.00015 * k * width + (0.0006 if k and not first else 0.0)
            planner.observe(1, k, 0.00045 + 0.00002 * k * width + drafts, [0] * k, draft_seconds=drafts, width=width,
                            setup_seconds=0.002 if k and first else 0.0)
            first = first and not k
            speculative += bool(k)
    assert speculative == 3  # the bootstrap: k = 1 twice (the first not fitted), k = 2 once (a bar rests on two passes)


def test_one_stalled_pass_past_a_calls_first_step_does_not_bar_the_explores():
    """The demo's payoff under load (`tiny`'s int8 self-draft, batch 1, calls of 24 tokens): the one draft step past
    a call's first that measured a pass stalled (72 ms against 0.2). Its pass alone made the bar: no explore or
    refresh could pay, and the calls ran plain for good. The bar rests on two such passes."""
    planner, speculative, stalled = Planner(max_k=8, prior_acceptance=0.95), [], False
    for call in range(12):
        planner.prefilled()
        first = True
        for step in range(24):
            k = planner.choose_step(1, room=24 - step).k
            drafts = 0.0002 * k
            if k and not first and not stalled:
                drafts, stalled = drafts + 0.072, True
            planner.observe(1, k, 0.0005 + 0.00002 * k + drafts, [1] * k, draft_seconds=drafts)
            first = first and not k
            speculative.append(bool(k))
    assert stalled and sum(speculative[-48:]) >= 36  # the last two calls speculate (0 with the one pass as the bar)


def run_stalled_planner(stalled_steps: int, draft_pass: float, stall) -> list[int]:
    """A planner at batch 1 (max_k 3, plain 1 ms, verify 1 + 0.1 k ms, every draft kept) whose first
    `stalled_steps` steps take `stall(verify, drafts, k)` instead; returns its k per step."""
    planner, chosen = Planner(max_k=3, prior_acceptance=0.95), []
    for step in range(800):
        k = planner.choose(1)
        verify, drafts = 0.001 + 0.0001 * k, draft_pass * k
        if step < stalled_steps:
            verify, drafts = stall(verify, drafts, k)
        planner.observe(1, k, verify + drafts, [1] * k, draft_seconds=drafts)
        chosen.append(k)
    return chosen


def test_a_stall_over_the_first_steps_does_not_keep_speculation_off():
    """A draft that pays (0.2 ms a pass, 4 tokens for 1.9 ms against 1 ms a token) with the first steps stalled:
    every step 100x as long, or 50 ms added to the step (to its drafts where it speculates: the pool waiting for a
    descheduled thread). With 8 or more stalled steps the stalled k's and draft passes priced speculation out for
    good (0 of the last 200 steps speculated, docs/log.md); the first usual step, under a quarter of its price,
    makes the fits forget them."""
    stalls = {"100x": lambda verify, drafts, k: (100 * verify, 100 * drafts),
              "+50 ms": lambda verify, drafts, k: (verify, drafts + 0.05) if k else (verify + 0.05, drafts)}
    for name, stall in stalls.items():
        for stalled_steps in (4, 8, 12, 40):
            chosen = run_stalled_planner(stalled_steps, 0.0002, stall)
            assert sum(1 for k in chosen[-200:] if k == 3) >= 180, (name, stalled_steps)


def test_a_stall_over_the_first_plain_steps_does_not_keep_a_losing_draft_on():
    """A draft that loses (1 ms a pass: 4 tokens for 4.3 ms against 1 ms a token) with the first 2-8 plain steps
    100x as long: the plain price they set made the draft look as if it paid until the plain steps at this size,
    two per refresh_every speculative ones, had outweighed them (96 steps); the first usual plain step, under a
    quarter of the size's mean, makes it forget them."""
    plain_stalled = lambda verify, drafts, k: (verify * (1 if k else 100), drafts)  # noqa: E731
    for stalled_steps in (2, 4, 8):
        chosen = run_stalled_planner(stalled_steps, 0.001, plain_stalled)
        assert sum(1 for k in chosen if k) < 2 * Planner.refresh_every, stalled_steps
        assert not any(chosen[-400:])


def test_a_draft_that_could_not_pay_even_if_always_accepted_is_not_explored_and_measured_in_a_new_range():
    """Each draft token costs more than a plain step (as on `tiny`, whose forward is all overhead): even
    a draft accepted every time, with verification free, loses. After the bootstrap (plain twice, k = 1
    twice, the first not fitted, k = 2 once, as a bar rests on two passes measured, then plain twice, the first of
    them not fitted) no step speculates at one batch size. In a drain down to a lower batch range, the draft's
    cost there is unknown until measured: priced at the least it could cost (its cost at the first size, in
    proportion to the rows), one refresh runs there, then one explore, as a bar there too rests on two passes, and
    from then on it is priced as measured and no step speculates."""
    for batches in ([8] * 3000, [12] * 1500 + [6] * 1500):
        planner = Planner(max_k=3)
        chosen = []
        for batch in batches:
            k = planner.choose(batch)
            chosen.append(k)
            draft = 0.010 * k
            planner.observe(batch, k, 0.008 * (1 + batch / 64) * (k + 1) + draft, [batch] * k, draft_seconds=draft)
        assert chosen[:7] == [0, 0, 1, 1, 2, 0, 0], batches[-1]
        if len(set(batches)) == 1:
            assert not any(chosen[7:])
        else:
            assert not any(chosen[7:1500]) and chosen[1500:1503] == [0, 3, 3] and not any(chosen[1503:])


def test_explores_never_fitted_cost_at_most_the_probes_share():
    """`tiny`'s int8 self-draft at 16-32 rows: 8 drafts end a call in its first step, which is never fitted (rule
    5), so the option stayed unexplored and was explored at every call there, losing 13-25% where it did not pay.
    Once its explores ran as often as it needs steps, one runs only with the probes' debt paid off (rule 8); where
    it pays it adds no debt and runs at every call."""
    def first_steps(k1_seconds):
        planner = Planner(max_k=2, prior_acceptance=0.99)
        seconds = {0: 0.0006, 1: k1_seconds, 2: 0.0012}
        reasons = []
        for call in range(200):  # 3 tokens a row at 16 rows: past the first step the room allows k <= 1
            planner.prefilled()
            tokens = 0
            while tokens < 3:
                plan = planner.choose_step(16, room=3 - tokens)
                if not tokens:
                    reasons.append((plan.k, plan.reason))
                planner.observe(16, plan.k, seconds[plan.k], [16] * plan.k, kept_tokens=16 * (plan.k + 1))
                tokens += plan.k + 1
        return reasons[-150:]

    assert first_steps(0.0008).count((1, "explore")) == 150  # 2 tokens a row for less than 2 plain steps: pays
    assert first_steps(0.0016).count((1, "explore")) <= 5


def test_a_k_cheaper_than_the_line_through_the_extremes_is_found():
    """Verifying 2 rows costs about as much as 1 (small-row matmuls) and 4 rows twice as much:
    a line through k = 0 and k = 3 (even through all four) prices k = 1 at ~57 ms and keeps
    speculation off; its own measured offset shows it pays (tokens/s: k=0 23.3, k=1 27.7)."""
    cost = {0: 0.043, 1: 0.045, 2: 0.080, 3: 0.090}  # seconds per step at one batch size
    chosen = run_planner(lambda b, k: cost[k] + 0.002 * k, acceptance=0.3, batches=[10] * 40)
    assert chosen[-10:].count(1) >= 8 and set(chosen[-10:]) <= {0, 1}  # two plain steps after 32 speculative ones


def test_a_k_priced_by_one_slow_step_returns_to_the_line_as_that_step_is_forgotten():
    """Each k between 0 and max_k runs once when explored; its verify offset then rested on that one step. The
    int8 self-draft at batch 1 (SmolLM2, 2 threads) explored k = 1 at 25.8 ms, where a 2-token pass takes ~16,
    and kept that price, and those of the other k explored once, for the rest of the process (docs/log.md,
    2026-11-29, night). Held towards 0 with a small weight, an offset whose step is forgotten returns to the
    line the recent steps draw."""
    planner = Planner(max_k=8, prior_acceptance=0.95)
    verify = lambda k: 0.016 + 0.002 * k  # noqa: E731
    draft_pass, slow = 0.004, 5
    for step in range(400):
        k = planner.choose(1)
        seconds = verify(k) * (3.0 if k == slow and slow not in planner._explored else 1.0)
        planner.observe(1, k, seconds + k * draft_pass, [round(0.95 ** (i + 1)) for i in range(k)],
                        draft_seconds=k * draft_pass)
        if step == 30:
            assert planner.verify_times.predict(1, slow) > 2 * verify(slow)  # explored, at its one slow step
    assert abs(planner.verify_times.predict(1, slow) / verify(slow) - 1) < 0.1
    assert abs(planner.verify_times.predict(1, 8) / verify(8) - 1) < 0.05


def test_reported_proposer_time_is_modelled_apart_from_verification():
    """Verification is memory-bound (flat in k); the proposer's reported time grows with k and B.
    The planner must pick a k within its `min_gain` margin of the best tokens per second under the
    true costs (k = 2..3 at batch 2; k = 0..1 at batch 32, where drafting barely pays)."""
    verify = lambda b, k: 0.03 + 0.0002 * b * (k + 1)  # noqa: E731
    draft = lambda b, k: k * (0.005 + 0.0004 * b)  # noqa: E731
    acceptance = 0.7
    for batch in (2, 32):
        planner = Planner(max_k=4)
        choices = []  # the priced choices: not refreshes
        for step in range(40):
            k = planner.choose(batch)
            if planner.last.reason != "refresh":
                choices.append(k)
            planner.observe(batch, k, verify(batch, k) + draft(batch, k),
                            [round(batch * acceptance ** (i + 1)) for i in range(k)], draft_seconds=draft(batch, k))
        fed = [round(batch * acceptance ** (i + 1)) / batch for i in range(4)]  # the acceptance the counts carry
        rate = [expected_tokens(k, fed[:k]) / (verify(batch, k) + draft(batch, k)) for k in range(5)]
        assert rate[choices[-1]] >= max(rate) / planner.min_gain
        assert abs(planner.draft_times.predict(batch, 3) - draft(batch, 3)) < 1e-4


def test_trees_are_chosen_where_they_pay_and_only_at_small_batches():
    """Verification costs little per extra token at batch 1 (memory-bound) and the first draft is often
    wrong but a second candidate often right: a width-2 tree beats every chain there. At batch 16 the
    tree would exceed max_tree_rows and is never tried."""
    def accepted(batch, k, width):  # P(first accepted) 0.5 chain, 0.8 with two candidates; then 0.8 per draft
        first = 0.5 if width == 1 else 0.8
        return [round(batch * first * 0.8 ** i) for i in range(k)]
    cost = lambda b, k, w: 0.03 + 0.0005 * b * (1 + w * k)  # noqa: E731
    for batch, want_tree in ((1, True), (16, False)):
        planner = Planner(max_k=3, max_width=2)
        chosen = []
        for _ in range(60):
            k, width, _ = planner.choose_step(batch)
            chosen.append((k, width))
            planner.observe(batch, k, cost(batch, k, width), accepted(batch, k, width), width=width)
        widths = {w for _, w in chosen[-10:]}
        assert widths == ({2} if want_tree else {1}), chosen[-10:]
        if not want_tree:
            assert all(w == 1 for _, w in chosen)


def test_a_predicted_gain_below_min_gain_keeps_speculation_off():
    """k = 1 is predicted 3% faster than plain decoding: within the models' error, so the planner
    decodes plainly (a wrong guess there cost 16% at batch 4 on SmolLM2); at 10% it speculates."""
    for gain, expected in ((1.03, 0), (1.10, 1)):
        acceptance = 0.5  # tau(1) = 1.5
        cost = {0: 0.040, 1: 0.060 / gain}  # rate(1) / rate(0) = 1.5 * 0.040 / (0.060 / gain) = gain
        chosen = run_planner(lambda b, k: cost[k], acceptance=acceptance, batches=[4] * 32, max_k=1)
        assert chosen[-8:] == [expected] * 8  # once the acceptance average has left its prior (0.7)


def test_acceptance_is_estimated_per_position_given_the_positions_before():
    """Conditional acceptance from counts: 8 rows, 6 accept position 0, 3 of those position 1. A later
    step that drafts only position 0 and finds it worse lowers the deeper prefix with it."""
    from specrl.speculation.acceptance import AcceptanceEstimate

    estimate = AcceptanceEstimate(2, prior=0.7, smoothing=0.1)  # no prior weight: replaced by the first step
    estimate.observe_accepted_prefix(8, [6, 3])
    assert estimate.prefix == [0.75, 0.375]
    estimate.observe_accepted_prefix(8, [2])  # k = 1: position 1 is not drafted
    first = (0.9 * 6 + 2) / (0.9 * 8 + 8)
    assert abs(estimate.prefix[0] - first) < 1e-12 and abs(estimate.prefix[1] - first * 0.5) < 1e-12
    estimate.observe_accepted_prefix(4, [4, 0], weight=0.5)  # a refresh weighs half of each position
    assert abs(estimate.prefix[0] - (0.5 * first + 0.5)) < 1e-12


def test_a_position_not_drafted_lately_borrows_the_estimate_of_the_one_before():
    """A draft accepted 0.96 at the positions a K = 3 planner drafts: the positions past 3, never drafted,
    are priced near 0.96 too, not at the fixed prior (0.7), so longer chains get tried; a deeper position that
    is drafted and rejected falls to its counts."""
    from specrl.speculation.acceptance import AcceptanceEstimate

    estimate = AcceptanceEstimate(8, prior=0.7, smoothing=0.1, prior_rows=10)
    for step in range(200):
        estimate.observe_accepted_prefix(1, [1, 1, 1] if step % 25 else [0])  # 0.96 at each position
    conditional = np.array(estimate.prefix[1:]) / np.array(estimate.prefix[:-1])
    assert np.all(conditional[2:] > 0.9) and np.all(conditional[2:] <= conditional[1] + 1e-12)
    for _ in range(50):
        estimate.observe_accepted_prefix(1, [1, 1, 1, 1, 0, 0, 0, 0])  # position 4 drafted, never accepted
    conditional = np.array(estimate.prefix[1:]) / np.array(estimate.prefix[:-1])
    assert conditional[3] < 0.05


def test_acceptance_is_kept_apart_per_sampling_setting():
    """A greedy call's acceptance (every draft taken) does not carry into a temperature-1 call, whose
    drafts are mostly rejected: the planner returns to plain decoding there without waiting for the
    greedy estimate to decay, and finds the greedy estimate intact when greedy calls come back."""
    cost = lambda b, k: 0.040 + 0.012 * k  # noqa: E731  tau(3) = 4 pays at once; 1.2 does not
    planner = Planner(max_k=3)
    saved = {}
    for setting, acceptance in (("greedy", 1.0), ("temperature 1", 0.2), ("greedy", 1.0)):
        planner.use_sampling(setting)
        assert planner.acceptance[1].prefix == saved.get(setting, list(np.cumprod([0.7] * 3)))
        chosen = []
        for _ in range(13):
            k = planner.choose(4)
            chosen.append(k)
            planner.observe(4, k, cost(4, k), [round(4 * acceptance ** (i + 1)) for i in range(k)])
        assert chosen[-6:] == ([3] * 6 if acceptance == 1.0 else [0] * 6), (setting, chosen)
        saved[setting] = planner.acceptance[1].prefix


def test_tokens_past_a_rows_stop_are_not_counted():
    """Rows that stop after ~1 token in 8 keep fewer of a chain's tokens: tau(k) with i.i.d. acceptance a
    and the chance g that a kept token is not the row's last is (1 - (a g)^(k+1)) / (1 - a g)."""
    planner = Planner(max_k=4, prior_rows=0.0)
    a, g = 0.9, 1 - 1 / 8
    planner.observe(8, 4, 0.01, [round(8 * a ** (i + 1)) for i in range(4)])
    for _ in range(200):
        planner.observe(8, 0, 0.001, [], kept_tokens=8, stopped_rows=1)
    prefix = planner.acceptance[1].prefix
    assert abs(planner.expected(4) - (1 + sum(p * g ** (i + 1) for i, p in enumerate(prefix)))) < 1e-9
    acceptance = prefix[0]  # one observation: the estimate is the observed share, i.i.d. within rounding
    assert abs(planner.expected(1) - (1 - (acceptance * g) ** 2) / (1 - acceptance * g)) < 1e-9


def test_a_row_at_its_answers_end_decodes_plainly_and_holds_nothing():
    """Answers of 10 tokens: a row at position 9 keeps only its stop token whatever it drafts, so plain
    decoding wins there, where the one stop rate (1 in 10) would draft; mid-answer it drafts. Plain chosen
    only for where the rows are sets no hold: the next call's rows start at 0."""
    cost = lambda b, k: 0.01 + 0.001 * k  # noqa: E731  (memory-bound: long chains pay)
    planner = Planner(max_k=4, prior_acceptance=0.95)
    for _ in range(40):
        k = planner.choose(1)
        planner.observe(1, k, cost(1, k), [1] * k, kept_tokens=10, stopped_rows=1)
    planner.retired([10] * 50, [True] * 50)
    assert planner.choose_step(1, generated=[0])[0] == 4
    assert planner.choose_step(1)[0] == 4  # the one rate: drafts
    assert planner.choose_step(1, generated=[9])[0] == 0
    assert not planner._plain_holds
    assert planner.choose_step(1, generated=[3])[0] == 4


def test_no_step_drafts_past_the_room_rows_have_left():
    cost = lambda b, k: 0.05 + 0.002 * k  # noqa: E731  (memory-bound: long chains pay)
    planner = Planner(max_k=4)
    for _ in range(30):
        k = planner.choose(2)
        planner.observe(2, k, cost(2, k), [2] * k)
    assert planner.choose_step(2)[0] == 4
    assert [planner.choose_step(2, room)[0] for room in (5, 4, 3, 2, 1)] == [4, 3, 2, 1, 0]


def test_plain_decoding_is_priced_from_plain_steps_and_kept_current():
    """A first plain step slowed by a cold start (3x) made plain decoding look dear, so k = 1, in truth
    slower, looked faster. Plain steps are fitted apart, and a plain step after every 32 speculative ones
    corrects the fit: speculation turns off."""
    planner = Planner(max_k=2, prior_acceptance=0.95)
    plain = lambda b: 0.001 * (1 + b / 64)  # noqa: E731
    cost = lambda b, k: plain(b) * (1 + 1.3 * k) if k else plain(b)  # noqa: E731  tau(1) <= 2 < 2.3
    chosen = []
    for step in range(300):
        k = planner.choose(32)
        seconds = 3 * cost(32, 0) if k == 0 and 0 not in chosen else cost(32, k)
        chosen.append(k)
        planner.observe(32, k, seconds, [32] * k)
    assert chosen.index(0) < 5 and chosen[-100:].count(0) >= 97  # plain, but for the refreshes (after 32, 64 off)


def test_no_plain_step_keeps_the_price_current_right_after_a_prefill():
    """Calls of two steps, every one speculative (`tiny`'s int8 self-draft at 4 rows). A plain step to keep the plain
    price current (rule 9) that ran as a call's first step was not measured (rule 5), so the next call's first
    step ran one again, and that call decoded plainly too. It runs at a later step."""
    planner = Planner(max_k=3, prior_acceptance=0.95)
    cost = lambda k: 0.01 + 0.001 * k  # noqa: E731  (memory-bound: drafts pay)
    reasons = []
    for call in range(200):
        planner.prefilled()
        for step in range(2):
            plan = planner.choose_step(4)
            reasons.append((step, plan.reason))
            planner.observe(4, plan.k, cost(plan.k), [4] * plan.k)
    assert (0, "plain-fit") not in reasons and reasons.count((1, "plain-fit")) >= 4


def test_plain_decoding_is_kept_current_at_each_batch_size_apart():
    """`tiny`'s int8 self-draft at 16 rows: plain steps measured in a size's first call run cold (1.5x), so k = 1,
    in truth slower, looked faster there; each call's drain then measured plain steps at 4 rows, which kept
    plain's fit current only there, and 16 rows speculated for good. Now each batch size's plain price is kept
    current apart, and forgets what was measured many steps ago: speculation at 16 rows turns off."""
    planner = Planner(max_k=2, prior_acceptance=0.95)
    plain = lambda b: 0.001 * (1 + b / 64)  # noqa: E731
    cost = lambda b, k: plain(b) * (1 + (1.3 if b == 16 else 3) * k) if k else plain(b)  # noqa: E731  never pays
    at_16 = []
    for call in range(100):
        planner.prefilled()
        for batch in (16, 16, 16, 16, 4, 4, 4):
            k = planner.choose(batch)
            cold = 1.5 if call == 0 and batch == 16 and not k else 1.0
            planner.observe(batch, k, cost(batch, k) * cold, [batch] * k)
            if batch == 16:
                at_16.append(k)
    assert any(at_16[4:40]) and at_16[-160:].count(0) >= 150  # plain at 16 rows, but for the refreshes


def test_a_plain_step_is_priced_without_the_choice_made_in_it():
    """Pricing a step took ~0.17 ms on `tiny` where it chose plain, against ~0.6 ms for the plain step at 16 rows:
    timed with it, plain decoding looked 30% dearer than it runs once it stands (unpriced), and k = 1, in truth
    slower, looked faster. A speculative step is priced every time: its time keeps the choice. (Every step is
    priced here, none held: what each plain step measures is then timed with a choice.)"""
    planner = Planner(max_k=1, prior_acceptance=0.95, reprice_every=1, reprice_max=1)
    choice = {"priced": 0.6e-3, "priced-plain": 0.6e-3}  # seconds the choice took, by reason
    chosen = []
    for step in range(200):
        plan = planner.choose_step(16)
        spent = choice.get(plan.reason, 0.0)
        seconds = 0.001 * (2.2 if plan.k else 1.0) + spent  # tau(1) <= 1.95 < 2.2: k = 1 never pays
        planner.observe(16, plan.k, seconds, [16] * plan.k, choice_seconds=spent)
        chosen.append(plan.k)
    assert chosen[-100:].count(0) >= 97  # plain, but for the refreshes
    assert abs(planner.plain_seconds(16) - 0.001) < 1e-9


def test_plain_decoding_at_one_batch_size_is_priced_every_few_steps_not_every_step():
    """Pricing costs ~60 us per step with cold caches (after a model pass), ~10% of a plain `tiny` step."""
    planner = Planner(max_k=3)
    cost = lambda b, k: 0.001 * b * (k + 1)  # noqa: E731  compute-bound: speculation never pays
    for _ in range(20):
        k = planner.choose(16)
        planner.observe(16, k, cost(16, k), [8] * k)
    priced = set()  # the steps that predicted any cost
    predict = planner.verify_times.predict
    planner.verify_times.predict = lambda *a: priced.add(len(chosen)) or predict(*a)
    chosen = []
    for _ in range(64):
        chosen.append(planner.choose(16))
        planner.observe(16, chosen[-1], cost(16, chosen[-1]), [8] * chosen[-1])
    assert set(chosen) <= {0, 3} and chosen.count(3) <= 1  # plain, but for a refresh
    assert len(priced) <= 64 // planner.reprice_every + 1


def test_where_pricing_keeps_choosing_plain_it_prices_ever_less_often():
    """A priced step costs ~0.25 ms on `tiny` against ~1.7 ms for its plain step: where plain decoding keeps
    winning, the wait between pricings doubles (8, 16, 32, 64, 64, ...), each batch range apart; a refresh
    ends the hold (what it measured is priced next) and the wait starts again once pricing chose speculation."""
    planner = Planner(max_k=3, refresh_every=10 ** 6)  # no refreshes: only pricing decides
    cost = lambda b, k: 0.001 * b * (k + 1)  # noqa: E731  compute-bound: speculation never pays

    def priced_at(batch, steps):
        at = []
        for step in range(steps):
            plan = planner.choose_step(batch)
            assert plan.k == 0 or plan.reason == "explore"
            if plan.reason == "priced-plain":
                at.append(step)
            planner.observe(batch, plan.k, cost(batch, plan.k), [batch // 2] * plan.k)
        return at

    at = priced_at(16, 400)
    gaps = [later - earlier for earlier, later in zip(at, at[1:])]
    assert gaps[:5] == [8, 16, 32, 64, 64] and set(gaps[5:]) == {64}
    at = priced_at(2, 40)  # another range: its own wait
    assert at[1] - at[0] == 8
    planner.last = StepPlan(1, 1, "refresh")  # a refresh: priced at once, the wait goes on
    planner.observe(16, 1, cost(16, 1), [8])
    assert priced_at(16, 64) == [0]
    planner.last = StepPlan(1, 1, "priced")  # pricing chose speculation: the wait starts again
    planner.observe(16, 1, cost(16, 1), [8])
    at = priced_at(16, 30)
    assert at[:2] == [0, 8]


def test_a_speculative_step_ends_the_hold_in_its_own_batch_range_only():
    """`tiny`'s calls of 16 rows with the int8 self-draft speculated in their last rows, where the draft pays, and
    each such step ended every range's hold: every call priced plain decoding again at 16, 8-15 and 4-7 rows
    (~0.13 ms a pricing, against ~0.6 ms for a plain step). Now a speculative step ends its own range's hold."""
    planner = Planner(max_k=3, refresh_every=10 ** 6)  # no refreshes: only pricing decides
    cost = lambda b, k: 0.001 * b * (k + 1) if b > 1 else 0.001 * (1 + 0.05 * k)  # noqa: E731  pays at 1 row only
    priced, speculated = [], []
    for call in range(60):  # a few calls of one row first: the draft is fitted there
        planner.prefilled()
        for batch in (1,) * 7 if call < 3 else (16, 16, 16, 16, 1, 1, 1):
            plan = planner.choose_step(batch)
            planner.observe(batch, plan.k, cost(batch, plan.k), [batch] * plan.k)
            if batch == 16 and plan.reason == "priced-plain":
                priced.append(call)
            speculated.append(batch == 1 and plan.k > 0)
    assert sum(speculated[-70:]) >= 25  # each call's last rows speculate
    assert len([call for call in priced if call >= 30]) <= 3  # 16 rows: priced every 64 steps, not every call


def test_a_refresh_that_could_never_pay_does_not_cut_a_hold_short():
    """A hold ends where a refresh may run, but a refresh runs only where it could pay: where even drafts that
    were all kept could not beat plain decoding, the wait between pricings doubles as if refreshes were off."""
    planner = Planner(max_k=3)  # refreshes due every refresh_every plain steps
    drafts = lambda k: 0.016 * k  # noqa: E731  a draft pass costs a plain step at 16 rows, so no draft could pay
    reasons = []
    for _ in range(400):
        plan = planner.choose_step(16)
        reasons.append(plan.reason)
        k = plan.k
        planner.observe(16, k, 0.016 * (1 + k) + drafts(k), [8] * k, draft_seconds=drafts(k))
    at = [step for step, reason in enumerate(reasons) if reason == "priced-plain"]
    gaps = [later - earlier for earlier, later in zip(at, at[1:])]
    assert "refresh" not in reasons and gaps[:5] == [8, 16, 32, 64, 64] and set(gaps[5:]) == {64}


def test_the_first_step_after_a_prefill_is_not_fitted():
    """The first step after a prefill (each call's here) runs on caches the prefill left cold (on `tiny` at
    batch 64, 1.6 against 1.1 ms); fitted, it priced plain decoding dear and turned on a k = 1 that lost."""
    planner = Planner(max_k=2, prior_acceptance=0.95)
    plain = lambda b: 0.001 * (1 + b / 64)  # noqa: E731
    cost = lambda b, k: plain(b) * (1 + 1.3 * k) if k else plain(b)  # noqa: E731  tau(1) <= 2 < 2.3
    chosen = []
    for call in range(30):
        planner.prefilled()
        for step in range(10):
            k = planner.choose(32)
            chosen.append(k)
            planner.observe(32, k, cost(32, k) * (3 if step == 0 else 1), [32] * k)
    assert abs(planner.plain_times.predict(32, 0) / plain(32) - 1) < 0.01
    assert chosen[-200:].count(0) >= 197  # plain, but for the refreshes


def test_every_choice_says_why_and_the_reasons_follow_the_rules():
    """`choose_step` returns (k, width, reason); over a compute-bound drain the reasons run: explore (each
    option once), priced-plain, then held for reprice_every - 1 steps, priced-plain again, and a refresh at the
    first step not held once plain steps paid off what the explores cost. A fixed planner, one without drafts
    and a row with no room say so."""
    from specrl.speculation.planner import REASONS

    planner = Planner(max_k=3)
    cost = lambda b, k: 0.001 * b * (k + 1)  # noqa: E731  compute-bound: speculation never pays
    reasons = []
    for _ in range(400):
        plan = planner.choose_step(16)
        assert plan.reason in REASONS
        assert plan.k == 0 or plan.reason in ("explore", "refresh", "priced")
        reasons.append(plan.reason)
        planner.observe(16, plan.k, cost(16, plan.k), [8] * plan.k)
    first_priced = reasons.index("priced-plain")
    assert set(reasons[:first_priced]) == {"explore"}
    hold = planner.reprice_every - 1
    assert reasons[first_priced + 1:first_priced + 1 + hold] == ["held"] * hold
    assert reasons[first_priced + 1 + hold] == "priced-plain" and "refresh" in reasons
    assert Planner(max_k=3, adaptive=False, fixed_width=1).choose_step(4) == (3, 1, "fixed")
    assert Planner(max_k=0).choose_step(4) == (0, 1, "off")
    assert Planner(max_k=3).choose_step(4, room=1) == (0, 1, "no-room")


def test_a_held_step_is_told_without_the_rows_and_counts_down_the_hold():
    """The engine asks `held` before it reads the rows' room and lengths: None where the step is to be chosen, the
    held plan (kept as `last`) for as many steps as the hold, and none for a planner without drafts or fixed K."""
    planner = Planner(max_k=3)
    assert planner.held(16) is None
    planner._plain_holds[(16).bit_length()] = 2
    assert planner.held(31) == (0, 1, "held") and planner.last == (0, 1, "held")  # 16 and 31 share a range
    assert planner.choose_step(16, room=1) == (0, 1, "held")  # a hold stands before the room is looked at
    assert planner.held(16) is None and planner.choose_step(16, room=1) == (0, 1, "no-room")
    for other in (Planner(max_k=0), Planner(max_k=3, adaptive=False)):
        other._plain_holds[(16).bit_length()] = 2
        assert other.held(16) is None


def test_a_call_whose_every_batch_range_prices_plain_runs_as_plain_decoding():
    """On `tiny` the heads' drafts are rarely kept: pricing holds plain decoding, yet an engine with a head attached
    spent ~5% more per call than a plain one (its hidden states, its start, the planner). A call whose every
    batch range prices plain, with nothing left to explore and no refresh due before it ends, runs as plain
    decoding; its steps count towards the refresh, which a later normal call runs; drafts that pay keep every
    call normal."""
    def plain(b):
        return 0.001 + 0.00002 * b  # overhead-bound, like `tiny`

    drain = [16] * 8 + [8] * 8 + [4] * 8 + [2] * 8 + [1] * 8

    def run_call(planner, kept):
        if planner.plain_call(16, 40):
            report_plain_call(planner, drain, plain)
            return True
        planner.prefilled()
        for rows in drain:
            k = planner.choose_step(rows).k
            drafts = k * plain(rows) / 3  # a draft pass costs a third of a target pass: pays if drafts are kept
            planner.observe(rows, k, plain(rows * (1 + k)) + drafts, [rows * kept] * k, draft_seconds=drafts)
        return False

    planner = Planner(max_k=3)
    assert not planner.plain_call(16, 40)  # nothing measured yet
    plain_calls = [run_call(planner, kept=0) for _ in range(60)]  # no draft is ever kept
    first = plain_calls.index(True)
    assert sum(plain_calls) >= 30 and not all(plain_calls[first:])  # mostly plain calls; normal ones refresh
    assert planner.acceptance[1].prefix[0] < 0.2
    planner.off_streak, planner.probe_debt = planner.refresh_wait, 0.0  # a refresh is due: the call runs normally
    assert not planner.plain_call(16, 40)

    paying = Planner(max_k=3)
    assert not any(run_call(paying, kept=1) for _ in range(20))
    assert not Planner(max_k=0).plain_call(16, 40) and not Planner(max_k=3, adaptive=False).plain_call(16, 40)


def test_a_plain_call_verdict_found_on_cold_plain_prices_is_found_again():
    """`tiny`'s int8 self-draft after a run at 1 row: the first call of 4 rows ran cold (its plain steps 1.5x), so
    plain decoding looked steep in B, a verify over 4 (1 + k) rows dear, and no draft could pay at 4 rows; every
    later call of 4 rows then ran as plain decoding, which measured nothing, for `refresh_max` steps (1.0x where
    the draft pays 1.35x). Now a plain call's steps are measured, and the verdict is found again once the plain
    prices it rested on moved."""
    planner = Planner(max_k=3)
    plain = lambda b: 0.001 * (0.5 + 0.01 * b)  # noqa: E731  overhead-bound, as `tiny`'s steps are

    def normal_call(rows, cold=1.0):
        planner.prefilled()
        drafts = []
        for _ in range(8):
            k = planner.choose(rows)
            draft = 0.0003 * k
            planner.observe(rows, k, plain(rows * (k + 1)) * (1.0 if k else cold) + draft, [rows] * k,
                            draft_seconds=draft)
            drafts.append(k)
        planner.ran_call(rows, 0.0)
        return drafts

    for _ in range(10):
        normal_call(1)
    assert not any(normal_call(4, cold=1.5))
    calls = []
    for _ in range(40):  # as the engine runs them
        if planner.plain_call(4, max_tokens=8):
            planner.ran_plain_call(4, 8 * plain(4), [(4, plain(4))] * 7)  # its first step is not measured
            calls.append("plain")
        else:
            calls.append(sum(k > 0 for k in normal_call(4)))
    assert calls[0] == "plain" and calls[-30:].count("plain") == 0 and min(calls[-30:]) >= 6


def report_plain_call(planner, sizes, plain, rows=16):
    """A call `plain_call` let run plain, reported as the engine reports one: each step after the first (which runs
    on caches the prefill left cold) measured at its live rows, and the call's seconds."""
    planner.ran_plain_call(rows, sum(map(plain, sizes)), [(live, plain(live)) for live in sizes[1:]])


def normal_call_keeping_every_draft(planner, sizes, plain, planner_seconds, rows=16):
    """A normal call through `sizes` live rows whose every draft is kept, a draft pass costing a third of a target
    pass; `planner_seconds` is what the planner cost the call (`ran_call`)."""
    planner.prefilled()
    for live in sizes:
        k = planner.choose_step(live).k
        drafts = k * plain(live) / 3
        planner.observe(live, k, plain(live * (1 + k)) + drafts, [live] * k, draft_seconds=drafts,
                        kept_tokens=live * (1 + k))
    planner.ran_call(rows, planner_seconds)


def test_plain_calls_weigh_the_batch_ranges_calls_of_their_size_stepped_at():
    """On `tiny` a refresh, and a tree, could pay only at one live row. Calls of 16 rows whose rows all end
    together never step there, so their normal calls never ran the refresh or explored the tree: both stayed
    due, and kept every later call of 16 rows from running plain. A call weighs the ranges the last normal call
    of its size stepped at, and only the options allowed at its size; a drain that reaches one row still keeps
    its calls normal while a refresh is due."""
    def plain(b):
        return 0.001 + 0.0005 * b  # compute-bound from a few rows: drafts could pay only at one row

    def run_call(planner, sizes):
        if planner.plain_call(16, 16):
            report_plain_call(planner, sizes, plain)
            return True
        planner.prefilled()
        for rows in sizes:
            k, width = planner.choose_step(rows)[:2]
            drafts = k * width * plain(rows) / 3
            planner.observe(rows, k, plain(rows * (1 + k * width)) + drafts, [0] * k, draft_seconds=drafts,
                            width=width)
        planner.ran_call(16, 0.0)
        return False

    together = Planner(max_k=3, max_width=3)
    for _ in range(8):  # first calls that reach one row: the fits at every range, the one-row options explored
        run_call(together, [16] * 8 + [8] * 4 + [1] * 4)
    assert together._could_pay(together._refresh_option(), 1)
    assert not any(together._could_pay(together._refresh_option(), size) for size in (8, 16))
    calls = [run_call(together, [16] * 16) for _ in range(120)]  # now every row emits its 16 tokens
    assert together.probe_debt == 0.0 and together.off_streak >= together.refresh_wait  # a refresh is due...
    assert sum(calls[-60:]) >= 55  # ... yet calls of 16 rows, which could not run it, run plain
    trees = [option for option in together.options if option[1] > 1]
    assert not any(option in together._allowed_options(16, None) for option in trees)
    could_pay = together._could_pay
    together._could_pay = lambda option, *a, **kw: option in trees or could_pay(option, *a, **kw)
    together._explored.difference_update(trees)
    together.samples.update({option: type(together.samples[option])() for option in trees})
    together._plain_calls.clear()
    assert together.plain_call(16, 16)  # trees no step of 16 rows may draft are not explores the call could run

    drain = Planner(max_k=3, max_width=3)
    for _ in range(8):
        run_call(drain, [16] * 8 + [8] * 4 + [1] * 4)
    drain.off_streak, drain.probe_debt = drain.refresh_wait, 0.0  # a refresh is due, and a drain could run it
    assert not drain.plain_call(16, 16)


def test_a_plain_calls_drain_through_batch_ranges_the_last_normal_call_never_reached_is_weighed():
    """`bench rollout` of SmolLM2's int8 self-draft at 16 rows (1.03x, every call plain): its warm-up call of 32
    tokens, the last normal one, ended with its rows still at 16, where no draft pays, so every later call ran
    plain for `refresh_max` steps, though each drained to one row for ~90 of its 128 steps, where the draft
    pays ~1.9x. A plain call's steps are counted per batch range too; where they stepped more than twice as
    often in a range as the call the verdict rested on, and by more than `refresh_every` steps, the next call
    weighs them; a drain that differs by a few steps (`tiny`'s vary by more than twice call to call) does not."""
    def plain(b):
        return 0.001 + 0.0005 * b  # compute-bound from a few rows: drafts pay only at one or two rows

    planner = Planner(max_k=3)
    for _ in range(8):  # every option explored and fitted in each range the drain passes
        normal_call_keeping_every_draft(planner, [16] * 8 + [8] * 4 + [2] * 4 + [1] * 4, plain, 0.001)
    normal_call_keeping_every_draft(planner, [16] * 32, plain, 0.001)  # a short call: its rows all run to its end
    assert planner._saving(1) > 0 and planner._saving(16) == 0.0
    assert planner.plain_call(16, 128)

    report_plain_call(planner, [16] * 32 + [8] * 3 + [1] * 6, plain)  # a short tail: the verdict stands
    assert 16 in planner._plain_calls and planner.plain_call(16, 128)
    sizes = [16] * 30 + [8] * 4 + [1] * 94  # a plain call whose last row runs on alone
    report_plain_call(planner, sizes, plain)
    assert not planner.plain_call(16, 128)
    normal_call_keeping_every_draft(planner, sizes, plain, 0.001)
    assert planner.plain_call(16, 128) is False  # the normal call's drain pays: calls stay normal


def test_a_call_whose_drain_saves_less_than_the_planner_costs_runs_as_plain_decoding():
    """`tiny`'s int8 self-draft at 16 rows (0.92x of plain decoding): the draft paid only at a drain's last rows,
    for a step or two a call (saving ~0.25 ms), so every call ran normally and paid the planner at each step (~0.36
    ms of a ~8 ms call); with every step held plain the same engine read 0.98-0.99x. A call runs as
    plain decoding where what speculation is expected to save in its drain, over the steps the last such call ran
    there, is no more than the planner's time in such calls; a drain whose tail is long keeps its calls normal."""
    def plain(b):
        return 0.0005 + 0.0001 * b  # drafts pay at 1-2 rows, not at 8 or more

    def run_call(planner, drain, planner_seconds):
        if planner.plain_call(16, 16):
            report_plain_call(planner, drain, plain)
            return True
        normal_call_keeping_every_draft(planner, drain, plain, planner_seconds)
        return False

    short_tail = [16] * 12 + [8] * 2 + [2] + [1]
    planner = Planner(max_k=3)
    for _ in range(12):  # every option explored and fitted in each range, the planner's time not counted
        run_call(planner, short_tail, 0.0)
    assert planner._saving(1) > 0 and planner._saving(2) > 0 and planner._saving(16) == 0.0
    assert not planner.plain_call(16, 16)  # the last rows save time, which nothing offsets
    calls = [run_call(planner, short_tail, planner_seconds=0.005) for _ in range(40)]  # ~0.3 ms a step
    assert sum(calls[5:]) >= 30 and not all(calls[5:])  # normal calls measure the drain again, ever more rarely
    assert calls[-16:].count(False) <= 1

    long_tail = [16] * 4 + [2] * 4 + [1] * 40
    planner = Planner(max_k=3)
    calls = [run_call(planner, long_tail, planner_seconds=0.005) for _ in range(40)]
    assert not any(calls)


def test_a_plain_call_samples_what_plain_decoding_samples_and_starts_no_proposer():
    """Exactness: a plain call is plain decoding, token for token and logprob for logprob against an engine
    without a proposer on the same seeds; the head is not started and reads no hidden states; the planner
    measures its steps but the first (rule 14)."""
    from specrl.backends import BackendConfig, make_backend
    from specrl.sampling import SamplingParams

    prompts = ["Q:12+34\nA:", "Q:7+8\nA:"]
    plain = make_backend(BackendConfig(model="tiny", proposer="none"))
    spec = make_backend(BackendConfig(model="tiny", proposer="eagle3"))
    engine = spec.engine
    engine.planner.min_gain = 1e9  # no option could pay anywhere once plain steps are measured
    starts, observed = [], []
    start, observe = engine.proposer.start, engine.proposer.observe
    engine.proposer.start = lambda *a, **kw: starts.append(1) or start(*a, **kw)
    engine.proposer.observe = lambda *a, **kw: observed.append(1) or observe(*a, **kw)
    for seed in range(6):
        params = SamplingParams(n=2, temperature=1.0, max_tokens=12, seed=seed)
        ours, theirs = spec.generate(prompts, params), plain.generate(prompts, params)
        assert [c.token_ids for c in ours.completions] == [c.token_ids for c in theirs.completions]
        assert [c.logprobs for c in ours.completions] == [c.logprobs for c in theirs.completions]
    assert ours.plan_reasons == {"plain-call": ours.steps}
    starts.clear(), observed.clear()
    measured, ran = [], engine.planner.ran_plain_call
    engine.planner.ran_plain_call = lambda rows, seconds, plain_steps: \
        measured.extend(size for size, _ in plain_steps) or ran(rows, seconds, plain_steps)
    result = spec.generate(prompts, params)
    assert not starts and not observed
    assert result.plan_reasons == {"plain-call": result.steps}
    assert measured == [size for _, size, _, _ in result.trace[1:]]


def test_the_engine_counts_its_steps_by_the_planners_reason():
    from specrl.backends import BackendConfig, make_backend
    from specrl.sampling import SamplingParams
    from specrl.speculation.planner import REASONS

    engine = make_backend(BackendConfig(model="tiny", proposer="ngram"))
    result = engine.generate(["Q:12+34\nA:"] * 4, SamplingParams(n=2, max_tokens=12, seed=0))
    assert sum(result.plan_reasons.values()) == result.steps and set(result.plan_reasons) <= set(REASONS)


def test_the_engine_prices_its_decode_steps_as_plain_decoding_at_the_plain_step_times_it_measured():
    """What speculation saved, within one call: a plain step counts as it ran, a speculative one as its kept
    tokens at the planner's plain step time for its batch size per row; with no plain step measured (fixed K)
    there is no price; without a proposer the price is the time itself."""
    import math

    from specrl.backends import BackendConfig, make_backend
    from specrl.sampling import SamplingParams

    params = SamplingParams(n=2, max_tokens=24, seed=0)
    prompts = ["Q:12+34\nA:"] * 4
    backend = make_backend(BackendConfig(model="tiny", proposer="ngram"))
    planner, times, prices = backend.engine.planner, [], []
    observe = planner.observe

    def recording(batch, k, seconds, accepted_per_pos, **kw):
        observe(batch, k, seconds, accepted_per_pos, **kw)
        times.append(seconds)
        prices.append(seconds if not k else kw["kept_tokens"] / batch * planner.plain_seconds(batch))

    planner.observe = recording
    for _ in range(5):  # until a call speculates
        times.clear()
        prices.clear()
        result = backend.generate(prompts, params)
        if result.k_histogram.get(0, 0) < result.steps:
            break
    assert result.k_histogram.get(0, 0) < result.steps
    assert math.isclose(result.step_seconds, sum(times), rel_tol=1e-9)
    assert math.isclose(result.plain_equivalent_seconds, sum(prices), rel_tol=1e-9)
    plain = make_backend(BackendConfig(model="tiny", proposer="none")).generate(prompts, params)
    assert plain.step_seconds > 0 and plain.plain_equivalent_seconds == plain.step_seconds
    fixed = make_backend(BackendConfig(model="tiny", proposer="ngram", adaptive=False)).generate(prompts, params)
    assert fixed.step_seconds > 0 and fixed.plain_equivalent_seconds is None


def test_every_rule_in_the_planners_docstring_names_a_test_that_exists():
    import re

    from specrl.speculation import planner

    tests = {name for name in globals() if name.startswith("test_")}
    named = re.findall(r"`(\.\.\.)?(test_\w+?|_\w+?)(\.\.\.)?`", planner.__doc__)
    named = [(before, name, after) for before, name, after in named if name.startswith("test_") or before]
    assert len(named) >= 13
    for before, name, after in named:
        matches = [t for t in tests if (t.endswith(name) if before else t.startswith(name) if after else t == name)]
        assert matches, f"the planner's docstring names `{before}{name}{after}`, which no test in this file matches"
