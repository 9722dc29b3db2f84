"""The planner: prices each speculation option of a step and picks the one that pays most.

Its users choose through `best_option`: the engine (`Planner.choose_step`: K, 0 = plain, and chain or tree
width per step, a `StepPlan` with its reason from `REASONS`), the hybrid (`HybridProposer.choose`: which
draft source) and the simulator (`sim.speculation.PlannedK`). The rules, each with its test in
tests/test_planner.py (the measurements behind them: docs/log.md, "the planner's rules"):

 1. Rate of an option: tau(k, w) / T(B, k, w), tau(k) = 1 + sum_{i<k} P(the first i+1 drafts kept) g^(i+1),
    g the chance a kept token is not its row's last (`ResponseLengths`).
    `test_expected_tokens_matches_the_iid_closed_form`, `test_tokens_past_a_rows_stop_are_not_counted`
 2. Never lose: plain decoding unless the best rate beats plain's by `min_gain`.
    `test_a_predicted_gain_below_min_gain_keeps_speculation_off`
 3. P per position given the positions before, per sampling setting and tree width, from the prior.
    `test_acceptance_is_estimated_per_position_given_the_positions_before`, `..._kept_apart_per_sampling_setting`
 4. T from least-squares fits with forgetting (`step_time`); plain decoding, where plain steps ran at this B,
    at their mean there, each older one keeping `plain_decay` of its weight per step at this B (plain or not),
    between two such sizes interpolated between the nearest; a plain step's time leaves out the planner's choice
    in it (plain decoding that stands runs unpriced: rule 10), a speculative step's keeps it (each is priced).
    Each k's own verify offset is held towards the fit's line with `offset_prior` steps' weight. A step measured
    at under a quarter of its price shows that the steps behind the price stalled: the fit (or the size's plain
    mean) keeps 0.01% of their weight (`StepTimeModel.STALL_RATIO`).
    `test_plain_decoding_is_priced_where_it_was_measured_not_by_a_line_...`,
    `test_plain_decoding_between_two_sizes_measured_is_priced_between_them`,
    `test_a_plain_step_is_priced_without_the_choice_made_in_it`,
    `test_a_k_priced_by_one_slow_step_returns_to_the_line_as_that_step_is_forgotten`,
    `test_a_stall_over_the_first_steps_does_not_keep_speculation_off`,
    `test_a_stall_over_the_first_plain_steps_does_not_keep_a_losing_draft_on`
 5. Not fitted: the first speculative step in each power-of-two range of B, the step after a prefill, a plain
    step after a speculative one. `test_the_first_speculative_step_is_not_fitted`,
    `test_the_first_speculative_step_in_each_batch_range_is_not_fitted`,
    `test_the_first_step_after_a_prefill_is_not_fitted`
 6. An option not yet run in a power-of-two range of B: its verify priced as a plain step over as many tokens;
    where no draft ran in the range, its drafts at the nearest size's cost, in proportion to the rows below it.
    `test_a_batch_range_measured_only_plainly_is_priced_by_physics_not_extrapolation`,
    `test_a_draft_dearer_per_row_at_more_rows_is_measured_in_the_tail_where_it_pays`
 7. Explore k = 0 `min_samples` times, then k = 1, each other option once and max_k `min_samples` times, only
    what could pay if every draft were kept, its drafts at most at the cheapest pass measured in the batch range
    past a call's first speculative step, a bar resting on `min_samples` such passes (`_could_pay`). An option
    whose explores ran right after a prefill as often as it needs steps (not fitted: rule 5; `tiny`'s 8 drafts
    end a call of 16 rows in one step) explores again only once the probes' debt is paid off (rule 8): explored
    at every call there, it lost 13-25%. `test_explores_never_fitted_cost_at_most_the_probes_share`
    `test_a_draft_that_could_not_pay_even_if_always_accepted_is_not_explored_and_measured_in_a_new_range`,
    `test_one_slow_draft_pass_bars_neither_explores_nor_refreshes`,
    `test_a_calls_first_draft_which_leaves_out_the_catching_up_does_not_open_every_explore`,
    `test_one_stalled_pass_past_a_calls_first_step_does_not_bar_the_explores`
 8. Refresh: after `refresh_wait` plain steps one short speculative step; the wait doubles after each refresh
    that leaves speculation off, up to `refresh_max`. `test_refreshes_of_a_draft_that_never_pays_grow_rarer`
    Refreshes cost at most `probe_share` of the plain decoding time: each refresh and explore adds to a debt
    what it cost over plain decoding of the tokens it emitted, its proposer's one-off setup included (a head
    catching up over a call's prompt); plain steps pay it off at `probe_share` of their time; no refresh runs
    while any is owed. `test_probes_that_cost_many_plain_steps_wait_until_they_are_a_small_share_of_the_time`
    (Refreshes, unlike explores, are not barred by the setup below: they are what re-measures it.)
 8a. Until a call's first speculative step, each speculative option, priced or explored, carries the
    proposer's one-off setup (the mean of what calls' first speculative steps reported, apart for calls after
    a weight load, which rebuild what the proposer made from the weights) spread over the most tokens a row
    may still emit: tau(k) / room of it. `test_a_call_too_short_to_repay_the_proposers_setup_decodes_plainly`,
    `test_setup_after_a_weight_load_is_priced_apart_from_a_calls_own`
 9. While speculating at a batch size, two plain steps per `refresh_every` speculative steps there keep its plain
    price current, none the first step after a prefill (it would not be measured: rule 5; where calls end in
    their first step or two, such steps ran a call's drain plainly again and again, measuring nothing).
    `test_plain_decoding_is_priced_from_plain_steps_and_kept_current`,
    `test_plain_decoding_is_kept_current_at_each_batch_size_apart`,
    `test_no_plain_step_keeps_the_price_current_right_after_a_prefill`
10. Where pricing chose plain, it stands `reprice_every` steps there unpriced; each further pricing there that
    chooses plain doubles the wait, up to `reprice_max`, until pricing chooses speculation there; a speculative
    step ends the hold in its range (what it measured is priced next there; a hold elsewhere runs out within
    `reprice_max` steps), a call of the other kind than the last every hold (after a weight load or not: rule 8a);
    a wait past `reprice_every` ends where a refresh may run (rule 8).
    `test_plain_decoding_at_one_batch_size_is_priced_every_few_steps_not_every_step`,
    `test_where_pricing_keeps_choosing_plain_it_prices_ever_less_often`,
    `test_a_refresh_that_could_never_pay_does_not_cut_a_hold_short`
11. No draft past the room a row has left before max_tokens. `test_no_step_drafts_past_the_room_rows_have_left`
12. Trees only while B (1 + w k) <= `max_tree_rows`. `test_trees_are_chosen_where_they_pay_and_only_at_small_...`
13. Every step says why (`REASONS`). `test_every_choice_says_why_and_the_reasons_follow_the_rules`
14. A call runs as plain decoding from start to end (`plain_call`: the engine starts no proposer and keeps no
    hidden states at its steps) where what pricing expects speculation to save at the batch ranges its drain
    reaches, over as many steps as the last normal call of as many rows ran there (`ran_call`; or a plain call
    since, where it stepped in some range more than twice as often and by `refresh_every` steps), is no more than
    the planner's own time in such calls (before one ran: where pricing chooses plain at every range; on `tiny`
    a drain's last rows saved less than the choices cost), no option allowed and left to explore at its batch
    size could pay, and (where every range prices plain) no refresh could come due in those ranges before it
    ends. Its steps count towards the refresh wait, and a normal call runs after `refresh_max` such steps in a
    row (where some range's speculation saved too little: after `refresh_every`, twice as many each time it is
    found so again). Its steps after the first are plain steps measured (rule 4), and the verdict is found again
    once a plain price it rested on moved by `plain_call_drift` (a size's first calls run cold: a verdict found
    on their prices stood for good).
    `test_a_call_whose_every_batch_range_prices_plain_runs_as_plain_decoding`,
    `test_plain_calls_weigh_the_batch_ranges_calls_of_their_size_stepped_at`,
    `test_a_call_whose_drain_saves_less_than_the_planner_costs_runs_as_plain_decoding`,
    `test_a_plain_calls_drain_through_batch_ranges_the_last_normal_call_never_reached_is_weighed`
"""
from __future__ import annotations

import bisect
import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import NamedTuple

from specrl.speculation.acceptance import AcceptanceEstimate
from specrl.speculation.response_lengths import ResponseLengths
from specrl.speculation.step_time import StepTimeModel, draft_features, plain_features, step_features, verify_features


def best_option(tokens, seconds, min_gain: float = 1.0, plain: int | None = None) -> int:
    """The index of the option with the most expected tokens per second (`tokens[i] / seconds[i]`; the first on a
    tie). With `plain` (the index of plain decoding): that option unless the best rate beats its rate by
    `min_gain`, so a speculative option is taken only where it is predicted to pay."""
    rate = [t / max(float(s), 1e-9) for t, s in zip(tokens, seconds)]  # a few options: plain Python is cheaper
    best = rate.index(max(rate))
    if plain is not None and rate[best] < min_gain * rate[plain]:
        return plain
    return best


class StepPlan(NamedTuple):
    """One step's decision: k drafts (0 = plain decoding), the tree width (1 = a chain) and why (`REASONS`)."""

    k: int
    width: int
    reason: str


PLAIN_CALL = StepPlan(0, 1, "plain-call")  # every step of a call `Planner.plain_call` let run plainly


REASONS = {  # why `choose_step` chose a step; the engine counts them per call (`GenerateResult.plan_reasons`)
    "off": "no proposer: every step decodes plainly",
    "fixed": "adaptive K is off: every step runs max_k drafts (as a tree of fixed_width)",
    "no-room": "no live row may emit a token past the next one before max_tokens, so no draft could be kept",
    "held": "plain decoding was priced best at this batch size lately and stands, unpriced, for reprice_every steps "
            "(twice as many after each further such pricing, up to reprice_max)",
    "refresh": "a short speculative step after refresh_wait plain ones re-measures the draft's acceptance and setup",
    "explore": "an option not yet measured at this batch size runs so that it can be priced",
    "plain-fit": "a plain step among speculative ones at this batch size keeps its plain price current",
    "priced-plain": "priced: no option beats plain decoding's expected tokens per second by min_gain",
    "priced": "priced: this option's expected tokens per second beat plain decoding's by min_gain",
    "plain-call": "pricing expected speculation at the call's batch sizes to save no more than the planner's own time "
                  "in such a call, and no explore or refresh was due: the call runs as plain decoding, its proposer not "
                  "started",
}


@dataclass
class Planner:
    """One engine's per-step choices of K and tree width (the rules: module docstring); fields are their knobs."""
    max_k: int  # largest K tried
    adaptive: bool = True  # False: always max_k (as a chain)
    smoothing: float = 0.1  # each step forgets this share of the acceptance counts before adding its own
    prior_acceptance: float = 0.7  # per-position acceptance assumed before any draft is verified
    prior_rows: float = 10.0  # the prior weighs as much as this many observed rows (1 / smoothing: all at batch 1)
    min_samples: int = 2  # steps with k = 0 and k = max_k (over the planner's life) before the fits are trusted
    refresh_every: int = 32  # after this many k = 0 steps in a row, speculate once to re-measure acceptance
    refresh_max: int = 1024  # the wait doubles after each refresh that leaves speculation off, up to this
    plain_decay: float = 0.9  # the plain-step fit keeps this share of its weight per plain step (two parameters),
    # a batch size's plain mean per step there
    stop_decay: float = 0.99  # each step keeps this share of the stop and kept-token counts
    length_decay: float = 0.98  # each retired row keeps this share of the older rows' weight (`ResponseLengths`)
    refresh_weight: float = 0.5  # weight of a refresh step in the acceptance moving averages
    refresh_k: int = 3  # a refresh drafts min(max_k, refresh_k): the first positions tell if the draft got better
    probe_share: float = 0.02  # refreshes (with the explores before them) cost at most this share of plain time
    max_width: int = 1  # most candidate first tokens of a tree (1 = chains only)
    fixed_width: int = 1  # adaptive=False: every step is a tree of this width (1 = a chain) with max_k
    max_tree_rows: int = 16  # trees only while B * (1 + w k) stays within this many tokens
    reprice_every: int = 8  # with plain decoding chosen at a batch size, it stands there this many steps unpriced
    reprice_max: int = 64  # ... doubling with each further pricing there that chooses plain, up to this many
    min_gain: float = 1.05  # speculate only where the predicted rate beats plain decoding's by this factor
    plain_call_drift: float = 0.1  # `plain_call`'s verdict is found again once a plain price it rested on moved
    # by this share
    offset_prior: float = 0.25  # steps' weight holding each k's verify offset at 0: a k run once is priced 80% at its
    # step and, as that step is forgotten, at the line the recent steps draw (one noisy step's price would stand)

    def __post_init__(self):
        self.options = [(k, 1) for k in range(self.max_k + 1)] + \
            [(k, w) for w in range(2, self.max_width + 1) for k in range(1, self.max_k + 1)]
        extras = sorted({w * k for k, w in self.options} - {0, self.max_k})
        self.plain_times = StepTimeModel(decay=self.plain_decay, features=plain_features)
        self._plain_at: dict[int, list[float]] = {}  # batch -> [decayed mean, weight] of the plain steps measured there
        self._plain_sizes: list[int] = []  # its batch sizes, sorted
        self._speculated_at: Counter = Counter()  # batch -> speculative steps there since its last plain step measured
        self.verify_times = StepTimeModel(features=verify_features(extras),
                                          prior=(0.0,) * len(step_features(1, 1)) + (self.offset_prior,) * len(extras))
        self.draft_times = StepTimeModel(features=draft_features)
        self.samples = defaultdict(Counter)  # per (k, w): steps per batch range
        self._plain_holds: dict[int, int] = {}  # batch range -> steps there that plain decoding stands unpriced
        # rows -> (the call runs plain, a refresh could pay in some range, the plain prices it rested on, the plain
        # calls' steps before a normal one), until the next observed step or sampling setting (`plain_call`)
        self._plain_calls: dict[int, tuple[bool, bool, list[tuple[int, float]], int]] = {}
        self._plain_call_waits: dict[int, int] = {}  # rows -> the plain calls' steps before a normal one, the next
        # time a drain's speculation is found to save less than the planner costs
        self._plain_call_steps = 0  # steps run in plain calls since the last observed step
        self._call_steps: Counter = Counter()  # batch range -> the normal call's steps there so far, each counted as
        # the tokens a row kept (a plain step's 1)
        # rows -> (the last normal call of as many rows: its steps per batch range, as `_call_steps` counts them;
        # the planner's seconds such calls cost, each later call weighing half), `ran_call`
        self._call_shapes: dict[int, tuple[dict[int, float], float]] = {}
        self._plain_waits: dict[int, int] = {}  # batch range -> the wait its last pricing that chose plain set
        self.acceptance_by_sampling: dict[object, dict[int, AcceptanceEstimate]] = {}
        self.acceptance: dict[int, AcceptanceEstimate] | None = None  # the current setting's (`use_sampling`)
        self.use_sampling(None)
        self.off_streak = 0  # consecutive steps run with k = 0
        self._last_k = 0  # the last step's k
        self._after_prefill = False  # the next step is the first after a prefill (`prefilled`)
        self._speculated_in: set[int] = set()  # batch ranges a speculative step ran in (the first there is not
        # fitted: `observe`)
        self._drafted_at: set[int] = set()  # batch sizes of the speculative steps fitted
        self._drafted_ranges: set[int] = set()  # their power-of-two ranges (`int.bit_length`)
        self._cheapest_pass: dict[int, float] = {}  # batch range -> the cheapest draft pass measured there, past
        # a call's first speculative step
        self._passes_measured: Counter = Counter()  # batch range -> the speculative steps that measured one (past
        # a call's first)
        self.kept_tokens = self.stopped_rows = 0.0  # decayed counts: tokens rows kept, rows a stop ended
        self.lengths = ResponseLengths(decay=self.length_decay)  # where the retired rows ended
        self.refresh_wait = self.refresh_every  # k = 0 steps in a row before the next refresh
        self.probe_debt = 0.0  # seconds refreshes and explores cost over plain decoding, not yet paid off (rule 8)
        # weights changed or not -> mean of the setups calls' first speculative steps reported, each later one
        # weighing half (rule 8a)
        self.setup_seconds: dict[bool, float] = {}
        self._set_up = False  # a speculative step ran since the last prefill: the proposer's setup is paid
        self._weights_changed = False  # the last prefill was the first after a weight load
        self.last = StepPlan(0, 1, "off")  # the step just chosen (`observe` reads its reason)
        self._option_rows: dict[tuple[int, int | None], list] = {}  # (batch, room) -> `_allowed_options`
        self._explored: set[tuple[int, int]] = set()  # options that have run the steps `_unexplored` asks for
        self._cold_explores: Counter = Counter()  # option -> its explores run right after a prefill (`_explore_due`)

    def use_sampling(self, setting) -> None:
        """Estimate acceptance apart for this sampling setting (any hashable, e.g. (temperature, top_p,
        top_k)) from here on; a setting not seen before starts at the prior."""
        if setting not in self.acceptance_by_sampling:
            self.acceptance_by_sampling[setting] = {
                w: AcceptanceEstimate(self.max_k, self.prior_acceptance, self.smoothing, self.prior_rows)
                for w in range(1, self.widest + 1)}
        if self.acceptance is not self.acceptance_by_sampling[setting]:
            self._plain_holds.clear()  # chosen under the last setting's acceptance
            self._plain_waits.clear()
            self._plain_calls.clear()
        self.acceptance = self.acceptance_by_sampling[setting]  # per tree width (1: chains)

    def prefilled(self, weights_changed: bool = False) -> None:
        """A prefill (a call's prompts, or the live rows' cache after an in-flight weight update) just ran, the
        first after a weight load or not: the next step is not fitted, and the next speculative step pays the
        proposer's setup (module docstring)."""
        self._after_prefill = True
        if weights_changed != self._weights_changed:  # the setup priced changes (rule 8a): price again
            self._plain_holds.clear()
        self._set_up, self._weights_changed = False, weights_changed

    def retired(self, lengths: list[int], stopped: list[bool]) -> None:
        """Rows left the batch: the tokens each generated and whether a stop token or string ended it."""
        self.lengths.retire(lengths, stopped)

    @property
    def widest(self) -> int:
        """The widest tree a step may draft (1: chains only)."""
        return max(self.max_width, self.fixed_width)

    def _unexplored(self, option: tuple[int, int], batch: int) -> bool:
        """An option is explored until it has run `needed` steps in all (min_samples for k = 0 and
        k = max_k, one for the others): the fitted models carry its cost to other batch ranges, and every
        step run there corrects them. k = 0 also runs once in each new power-of-two range of the drain
        (a plain step costs no more than plain decoding, and it anchors the range's cost)."""
        seen = self.samples[option]
        if option not in self._explored:
            if sum(seen.values()) < self._needed(option):
                return True
            self._explored.add(option)  # counts only grow: explored for good
        return option == (0, 1) and not seen[batch.bit_length()]

    def _needed(self, option: tuple[int, int]) -> int:
        """The steps an option runs before it is explored: min_samples for k = 0 and k = max_k, one for the others."""
        return self.min_samples if option in ((0, 1), (self.max_k, 1)) else 1

    def _explore_due(self, option: tuple[int, int], batch: int, room: int | None = None) -> bool:
        """Whether `option` is explored at a step over `batch` rows (rule 7): not yet explored and, but for k = 0,
        able to pay; one that has run as many explores right after a prefill as it needs steps (none fitted: rule
        5), only with the probes' debt paid off, as a refresh (rule 8)."""
        if not self._unexplored(option, batch):
            return False
        if option == (0, 1):
            return True
        if self.probe_debt and self._cold_explores[option] >= self._needed(option):
            return False
        return self._could_pay(option, batch, room)

    def _could_pay(self, option: tuple[int, int], batch: int, room: int | None = None) -> bool:
        """Whether a speculative option could beat plain decoding here by `min_gain` if every draft were
        accepted, priced from what was measured directly (`_unfitted_seconds`), not by the verify fit's
        extrapolation to an option not yet run, its drafts at most at the cheapest pass measured in this batch
        range past a call's first speculative step (whose draft leaves out the catching up later steps pay).
        True until plain steps were fitted, and where one such step but fewer than `min_samples` measured a
        pass in this range: one slow pass (a thread descheduled in it) would otherwise bar every explore and
        refresh, which are what would measure it again, for good. With `room`, the call's setup not yet paid is
        priced in (`_setup_per_token`)."""
        if not self.plain_times.fitted or 0 < self._passes_measured[batch.bit_length()] < self.min_samples:
            return True
        k, width = option
        seconds = self._unfitted_seconds(batch, [option])[0]
        cheapest = self._cheapest_pass.get(batch.bit_length())
        if cheapest is not None:
            seconds = min(seconds, self._unfitted_seconds(batch, [option], drafts=False)[0] + k * width * cheapest)
        go_on = 1.0 - self.stop_rate
        best_tokens = sum(go_on ** j for j in range(k + 1))
        seconds += best_tokens * self._setup_per_token(room)
        return best_tokens / max(seconds, 1e-9) >= self.min_gain / max(self.plain_seconds(batch), 1e-9)

    def _setup_per_token(self, room: int | None) -> float:
        """The proposer's setup, where this call has not paid it yet, spread over the most tokens a row may
        still emit (`room`): a step keeping tau tokens a row is priced tau times this (module docstring)."""
        if self._set_up or room is None:
            return 0.0
        return self.setup_seconds.get(self._weights_changed, 0.0) / room

    def _unfitted_seconds(self, batch: int, options: list[tuple[int, int]], drafts: bool = True) -> list[float]:
        """Speculative options' step times from what was measured directly, where the fitted models' slopes
        in B would be extrapolated (module docstring):
            verify  a plain step over as many tokens, B (1 + w k) rows, once plain steps in two batch
                    ranges pin the plain fit's slope; before that one plain step over B, which it costs
                    at least;
            drafts  the draft fit's price where a speculative step was fitted in this batch's range;
                    elsewhere its price at the nearest batch size fitted, scaled down to fewer rows in
                    proportion to the rows (a pass costs no less per row over fewer rows: the least it
                    can cost, so the first step there speculates where it could pay and measures it),
                    and up to more rows as a plain step's cost scales (a draft pass is a forward pass
                    over as many rows); left out with drafts=False."""
        pinned = len(self.samples[0, 1]) > 1
        verify = [self.plain_seconds(batch * (1 + width * k) if pinned else batch) for k, width in options]
        if not drafts:
            return verify
        near, scale = batch, 1.0
        if self._drafted_at and batch.bit_length() not in self._drafted_ranges:
            near = min(self._drafted_at, key=lambda b: abs(math.log(b / batch)))
            scale = batch / near if near > batch else self.plain_seconds(batch) / max(self.plain_seconds(near), 1e-9)
        return [seconds + scale * self.draft_times.predict(near, k, width) for seconds, (k, width) in zip(verify, options)]

    def plain_seconds(self, batch: int) -> float:
        """A plain step over `batch` rows: the decayed mean of those measured at this size; between two sizes
        measured, interpolated between the nearest on either side; else the fitted line (module docstring)."""
        seen = self._plain_at.get(batch)
        if seen is not None:
            return seen[0]
        above = bisect.bisect(self._plain_sizes, batch)
        if 0 < above < len(self._plain_sizes):
            low, high = self._plain_sizes[above - 1], self._plain_sizes[above]
            share = (batch - low) / (high - low)
            return (1 - share) * self._plain_at[low][0] + share * self._plain_at[high][0]
        return self.plain_times.predict(batch, 0)

    def _measured_plain(self, batch: int, seconds: float, fit: bool = True) -> None:
        """A plain step measured at `batch` rows, on caches as plain decoding leaves them: into the plain fit (not
        for a step held unpriced: `fit` False) and that size's mean, the older ones keeping `plain_decay` of their
        weight per step run there since (a size's first calls run cold, and while speculating there its plain steps
        are few: their price would stand for good)."""
        if fit:
            self.plain_times.add(batch, 0, seconds)
        seen = self._plain_at.get(batch)
        if seen is None:
            seen = self._plain_at[batch] = [seconds, 0.0]
            bisect.insort(self._plain_sizes, batch)
        keep = self.plain_decay ** (1 + self._speculated_at.pop(batch, 0))
        if seconds * StepTimeModel.STALL_RATIO < seen[0]:  # the steps behind the mean stalled (`StepTimeModel`)
            keep *= StepTimeModel.STALL_KEEP
        seen[1] = keep * seen[1] + 1.0
        seen[0] += (seconds - seen[0]) / seen[1]

    def _allowed(self, option: tuple[int, int], batch: int) -> bool:
        k, w = option
        return w == 1 or batch * (1 + w * k) <= self.max_tree_rows

    def choose_step(self, batch: int, room: int | None = None, generated=None) -> StepPlan:
        """(k, width) for a step over `batch` rows; width 1 is a chain, k = 0 plain decoding. `room`: the
        most tokens any live row may still emit (max_tokens less what it has); no step drafts past it.
        `generated`: the tokens each live row has generated (a tensor or list; read only where the step is
        priced), so that each row's chance to stop is its own (module docstring); without it, the one rate.
        The plan is also kept as `last`, which `observe` reads."""
        self.last = self._choose(batch, room, generated)
        return self.last

    def plain_call(self, rows: int, max_tokens: int) -> bool:
        """Whether a call of `rows` rows, each emitting at most `max_tokens`, runs as plain decoding from start to
        end (rule 14): what pricing expects speculation to save at `rows` and in each batch range the last normal
        call of as many rows stepped at (every power of two below `rows` before one ran: a drain's ranges), over as
        many steps as that call ran there (or a plain call since: `ran_plain_call`), is no more than the planner's
        own time in such calls (nothing before one ran); no option allowed at `rows` and left to explore there
        could pay (the drain's smaller ranges explore in the calls that run normally: a drain reaches them with
        little room); and, where every range priced plain, no refresh could come due within the call in those
        ranges. False once such calls ran `refresh_max` steps since the last observed step, or, where some range's
        speculation paid too little, `_plain_call_waits` steps. Found again once a plain price it rested on moved
        by `plain_call_drift` (`ran_plain_call` measures them)."""
        if not (self.adaptive and self.max_k and self.plain_times.fitted):
            return False
        verdict = self._plain_calls.get(rows)
        if verdict is None or any(abs(self.plain_seconds(size) - seconds) > self.plain_call_drift * seconds
                                  for size, seconds in verdict[2]):
            steps, planner_seconds = self._call_shapes.get(rows, ({}, 0.0))
            ranges = steps or range(1, rows.bit_length() + 1)
            sizes = sorted({rows} | {1 << (here - 1) for here in ranges if here < rows.bit_length()})
            explore = any(self._explore_due(option, rows) for option in self._allowed_options(rows, None)[1:])
            saving = 0.0 if explore else sum(steps.get(size.bit_length(), 1.0) * self._saving(size) for size in sizes)
            plain = not explore and saving <= planner_seconds
            refresh = plain and not saving and any(self._could_pay(self._refresh_option(), size)
                                                   for size in sizes)
            limit = self.refresh_max
            if plain and saving:  # a normal call measures the drain again after as many steps, twice as many each
                limit = self._plain_call_waits.get(rows, self.refresh_every)  # time it is found to pay too little
                self._plain_call_waits[rows] = min(2 * limit, self.refresh_max)
            elif not plain:
                self._plain_call_waits.pop(rows, None)
            self._plain_calls[rows] = plain, refresh, [(size, self.plain_seconds(size)) for size in sizes], limit
        plain, refresh, _, limit = self._plain_calls[rows]
        paid_off = self.probe_debt <= self.probe_share * max_tokens * self.plain_seconds(rows)  # within the call
        return plain and self._plain_call_steps < limit and \
            not (refresh and paid_off and self.off_streak + max_tokens >= self.refresh_wait)

    def ran_call(self, rows: int, planner_seconds: float) -> None:
        """A call of `rows` rows ran normally, `planner_seconds` of it in this planner (its choices and `observe`):
        the next calls of as many rows weigh the batch ranges it stepped at (`plain_call`: a drain's, or only their
        own where every row ends together), over as many steps, against that time."""
        _, last = self._call_shapes.get(rows, (None, planner_seconds))
        # (its observed steps cleared what `plain_call` had found)
        self._call_shapes[rows] = dict(self._call_steps), (last + planner_seconds) / 2
        self._call_steps.clear()

    def _saving(self, batch: int) -> float:
        """What pricing at `batch` rows, with no call setup to pay, expects its choice to save per step of plain
        decoding there: 0 where it chooses plain decoding."""
        allowed, seconds, curves = self._priced(batch, None)
        best = self._best(allowed, seconds, curves)
        k, width = allowed[best]
        return seconds[0] - seconds[best] / curves[width - 1][k]

    def ran_plain_call(self, rows: int, seconds: float, measured: list[tuple[int, float]]) -> None:
        """A call of `rows` rows that `plain_call` allowed ran plain steps for `seconds` (none observed): they count
        towards a refresh, and pay off the probes' debt as observed plain steps do (rule 8). `measured`: (live
        rows, seconds) of each step after its first (which runs on caches the prefill left cold), plain steps
        measured as observed ones are, here at the call's end (fed between its steps, on caches the model's pass had
        just filled, they cost ~1% of a `tiny` step). Where its drain stepped more than twice as often in some batch
        range as the call its verdict rested on, and by more than `refresh_every` steps (a long tail that call
        never reached, say; a normal call, too, speculates again after that many plain steps), the next call of as
        many rows weighs this one's steps (rule 14)."""
        shape = Counter({rows.bit_length(): 1.0})  # its first step
        for batch, step_seconds in measured:
            self._measured_plain(batch, step_seconds)
            shape[batch.bit_length()] += 1.0
        last, planner_seconds = self._call_shapes.get(rows, ({}, 0.0))
        if any(count > 2 * last.get(here, 0.0) + self.refresh_every for here, count in shape.items()):
            self._call_shapes[rows] = dict(shape), planner_seconds
            self._plain_calls.pop(rows, None)
        steps = len(measured) + 1  # and its first
        self._plain_call_steps += steps
        self.off_streak += steps
        self.probe_debt = max(self.probe_debt - self.probe_share * seconds, 0.0)

    def held(self, batch: int) -> StepPlan | None:
        """The step's plan where plain decoding stands unpriced at this batch size (rule 10), kept as `last`; None
        where `choose_step` decides, with the rows' room and lengths (which held steps need not be told)."""
        here = batch.bit_length()
        if not (self.adaptive and self.max_k and self._plain_holds.get(here)):
            return None
        self._plain_holds[here] -= 1
        self.last = StepPlan(0, 1, "held")
        return self.last

    def _choose(self, batch: int, room: int | None, generated) -> StepPlan:
        if self.max_k == 0:
            return StepPlan(0, 1, "off")
        if not self.adaptive:
            return StepPlan(self.max_k, self.fixed_width, "fixed")
        if self.held(batch):  # priced in this range lately, and plain decoding chosen
            return self.last
        if room is not None and room <= 1:  # no draft could be kept
            return StepPlan(0, 1, "no-room")
        refresh = self._refresh_option()
        if self.off_streak >= self.refresh_wait and (room is None or refresh[0] < room) \
                and not self.probe_debt \
                and self._could_pay(refresh, batch):
            self.refresh_wait = min(2 * self.refresh_wait, self.refresh_max)
            return StepPlan(*refresh, "refresh")
        if len(self._explored) < len(self.options) or not self.samples[0, 1][batch.bit_length()]:
            allowed = self._allowed_options(batch, room)
            firsts = [o for o in ((0, 1), (1, 1)) if o in allowed]  # plain, then the cheapest draft: the fits
            # they start price every other option's bound (`_could_pay`) before it runs
            for option in firsts + [o for o in allowed if o not in firsts]:
                if self._explore_due(option, batch, room):
                    return StepPlan(*option, "explore")
        if self._speculated_at.get(batch, 0) >= self.refresh_every and not self._after_prefill:  # plain steps now
            return StepPlan(0, 1, "plain-fit")  # and then keep this size's price current: two, as the first after a
            # speculative step is not measured (`observe`), nor one after a prefill
        allowed, seconds, curves = self._priced(batch, room)
        best = self._best(allowed, seconds, curves)
        if not best:  # plain wherever the rows are: it stands
            self._hold_plain(batch)
            return StepPlan(*allowed[0], "priced-plain")
        if generated is not None:
            curves = self._expected_curves(self._go_on(generated))
            best = self._best(allowed, seconds, curves)
        if best:
            self.refresh_wait = self.refresh_every
        return StepPlan(*allowed[best], "priced" if best else "priced-plain")

    def _priced(self, batch: int, room: int | None) -> tuple[list[tuple[int, int]], list[float], list[list[float]]]:
        """What pricing weighs at `batch` rows: the options allowed (plain first), their step seconds (the call's
        setup in, where not yet paid: rule 8a) and tau by the one stop rate (an upper bound on the rows' own)."""
        allowed = self._allowed_options(batch, room)
        here = batch.bit_length()  # an option not run in this range: the fits would extrapolate (module docstring)
        unfitted = [option for option in allowed[1:] if not self.samples[option][here]]
        unfitted = dict(zip(unfitted, self._unfitted_seconds(batch, unfitted))) if unfitted else {}
        speculative = [unfitted[k, w] if (k, w) in unfitted
                       else self.verify_times.predict(batch, k, w) + self.draft_times.predict(batch, k, w)
                       for k, w in allowed[1:]]
        curves = self._expected_curves()
        setup = self._setup_per_token(room)
        if setup:
            speculative = [seconds + setup * curves[w - 1][k] for seconds, (k, w) in zip(speculative, allowed[1:])]
        return allowed, [self.plain_seconds(batch)] + speculative, curves

    def _best(self, allowed: list[tuple[int, int]], seconds: list[float], curves: list[list[float]]) -> int:
        """The index in `allowed` of the option pricing chooses (0, plain decoding, unless one beats it by
        `min_gain`: rule 2)."""
        return best_option([curves[w - 1][k] for k, w in allowed], seconds, self.min_gain, plain=0)

    def _hold_plain(self, batch: int) -> None:
        """Pricing chose plain decoding at this batch size: it stands unpriced there for `reprice_every` steps,
        twice as long as last time if the last pricing there chose plain too, up to `reprice_max`; a hold past
        `reprice_every` ends where a refresh may run (its wait passed, the probe debt paid off, and it could pay:
        rule 8)."""
        here = batch.bit_length()
        wait = self._plain_waits.get(here)
        wait = self._plain_waits[here] = min(2 * wait, self.reprice_max) if wait else self.reprice_every
        if self._could_pay(self._refresh_option(), batch):  # else no refresh could run
            paying = self.probe_debt / max(self.probe_share * self.plain_seconds(batch), 1e-12)  # steps to pay it
            wait = min(wait, max(self.refresh_wait - self.off_streak, paying))
        self._plain_holds[here] = int(max(wait, self.reprice_every)) - 1

    def _refresh_option(self) -> tuple[int, int]:
        """A refresh's (k, width): a chain of min(max_k, refresh_k) drafts (rule 8)."""
        return min(self.max_k, self.refresh_k), 1

    def _allowed_options(self, batch: int, room: int | None) -> list[tuple[int, int]]:
        """The options allowed at this batch size and room, plain decoding first, listed once per size and
        room (a drain revisits each)."""
        room = None if room is None or room > self.max_k else room  # the last steps of a call: only k < room
        if (batch, room) not in self._option_rows:
            self._option_rows[batch, room] = [o for o in self.options
                                              if self._allowed(o, batch) and (room is None or o[0] < room)]
        return self._option_rows[batch, room]

    def _go_on(self, generated) -> list[float]:
        """The live rows' chances g_0, ..., g_{max_k - 1} of keeping draft 1, ..., max_k if accepted: their own
        (`ResponseLengths`), capped by the one stop rate's (1 - rate)^(i+1), so that where rows are tells only
        where a draft would be thrown away (uncapped, rows early in their answers made deep drafts look cheap)."""
        rows = generated.tolist() if hasattr(generated, "tolist") else list(generated)
        one_rate = 1.0 - self.stop_rate
        return [min(own, one_rate ** (i + 1)) for i, own in enumerate(self.lengths.go_on(rows, self.max_k))]

    def _expected_curves(self, go_on: list[float] | None = None) -> list[list[float]]:
        """tau(0), ..., tau(max_k) for each width 1, ..., widest (module docstring), given the live rows'
        chances g_0, ..., g_{max_k - 1} of keeping draft 1, ..., max_k if accepted; by default from the one
        stop rate, g_i = g^(i+1). Plain Python: at these sizes numpy's per-call cost is most of the work."""
        if go_on is None:
            go_on = [(1.0 - self.stop_rate) ** (i + 1) for i in range(self.max_k)]
        curves = []
        for width in range(1, self.widest + 1):
            curve = [1.0]
            for accepted, kept in zip(self.acceptance[width].prefix, go_on):
                curve.append(curve[-1] + accepted * kept)
            curves.append(curve)
        return curves

    def choose(self, batch: int) -> int:
        """The chain K for a step over `batch` rows (a planner without trees)."""
        return self.choose_step(batch)[0]

    def expected(self, k: int, width: int = 1) -> float:
        """tau(k): the tokens a row keeps from a step with k drafts (module docstring)."""
        return self._expected_curves()[width - 1][k]

    @property
    def stop_rate(self) -> float:
        """Stop tokens (and strings) per kept token, over the recent steps."""
        return self.stopped_rows / self.kept_tokens if self.kept_tokens else 0.0

    def observe(self, batch: int, k: int, seconds: float, accepted_per_pos: list[int],
                draft_seconds: float = 0.0, width: int = 1, kept_tokens: int = 0, stopped_rows: int = 0,
                setup_seconds: float = 0.0, choice_seconds: float = 0.0) -> None:
        """Record one step: its wall time (of which `draft_seconds` inside the proposer), per draft
        position along the accepted path how many rows accepted it, the tokens its rows kept and how
        many rows a stop token or string ended; `setup_seconds`: the proposer's one-off work in the step,
        left out of `seconds` (not what the option costs a step, but what a call pays to start: rules 8, 8a);
        `choice_seconds`: this planner's choice of the step, in `seconds` (left out of a plain step's: rule 4)."""
        if not k:
            seconds -= choice_seconds
        if self._plain_calls:  # what `plain_call` found rests on the fits this step may change
            self._plain_calls.clear()
        self._plain_call_steps = 0
        self._call_steps[batch.bit_length()] += max(kept_tokens / batch, 1.0)
        if not k:
            self.probe_debt = max(self.probe_debt - self.probe_share * seconds, 0.0)
        elif self.last.reason in ("refresh", "explore") and self.plain_times.fitted:
            emitted = batch + sum(accepted_per_pos)  # each row's token after its accepted drafts
            extra = seconds + setup_seconds - emitted / batch * self.plain_seconds(batch)
            self.probe_debt = max(self.probe_debt + extra, 0.0)
        call_first = k and not self._set_up  # the call's first speculative step: its setup reported apart
        if call_first:
            self._set_up = True
            last = self.setup_seconds.get(self._weights_changed, setup_seconds)
            self.setup_seconds[self._weights_changed] = (last + setup_seconds) / 2
        if kept_tokens:
            self.kept_tokens = self.stop_decay * self.kept_tokens + kept_tokens
            self.stopped_rows = self.stop_decay * self.stopped_rows + stopped_rows
        self.off_streak = self.off_streak + 1 if k == 0 else 0
        first, self._after_prefill = self._after_prefill, False
        if first and k and self.last.reason == "explore":
            self._cold_explores[k, width] += 1
        if k and batch.bit_length() not in self._speculated_in:  # the first speculative step in a batch range pays
            first = True  # one-time costs (module docstring)
            self._speculated_in.add(batch.bit_length())
        if self.last.reason == "held":  # plain decoding chosen unpriced is not fitted either (`reprice_every`), but
            if not first and not self._last_k:  # it is a plain step at this size (`plain_seconds`)
                self._measured_plain(batch, seconds, fit=False)
            self._last_k = 0
            return
        after_speculation, self._last_k = self._last_k > 0, k
        if k:  # what it measured is priced at its range's next step; the wait there starts again if speculation won
            self._plain_holds.pop(batch.bit_length(), None)
            if self.last.reason == "priced":
                self._plain_waits.pop(batch.bit_length(), None)
            self._speculated_at[batch] += 1
        if not first:  # the first step after a prefill runs on caches it left cold (module docstring)
            self.verify_times.add(batch, k, seconds - draft_seconds, width)
            if k:
                self.draft_times.add(batch, k, draft_seconds, width)
                self._drafted_at.add(batch)
                self._drafted_ranges.add(batch.bit_length())
            elif not after_speculation:  # not right after a draft's pass (module docstring)
                self._measured_plain(batch, seconds)
            if k or not after_speculation:
                self.samples[(k, width)][batch.bit_length()] += 1
        if k:
            here = batch.bit_length()
            if not call_first:  # (a head's later steps catch up over the tokens kept: a pass costs that too)
                self._cheapest_pass[here] = min(self._cheapest_pass.get(here, math.inf), draft_seconds / (k * width))
                self._passes_measured[here] += 1
            self.acceptance[width].observe_accepted_prefix(batch, accepted_per_pos,
                                                           self.refresh_weight if self.last.reason == "refresh" else None)
