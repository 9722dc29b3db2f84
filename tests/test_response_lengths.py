"""Where responses end (`ResponseLengths`): the Kaplan-Meier hazard per generated position, in closed form."""
import math

import pytest

from specrl.speculation.response_lengths import ResponseLengths


def test_hazard_is_kaplan_meier_with_cut_rows_censored():
    """Rows of 3, 3 and 5 tokens ended by a stop, one of 5 cut by max_tokens. At risk: 4 rows at positions
    0-2, 2 at 3-4. The token at position 2 ended 2 of 4 rows; at 4, 1 of 2 (the cut row is not a stop)."""
    lengths = ResponseLengths(decay=1.0, prior_rows=1e-9)
    lengths.retire([3, 3, 5, 5], [True, True, True, False])
    assert lengths.hazard == pytest.approx([0, 0, 0.5, 0, 0.5], abs=1e-8)
    # a row at position 0 keeps draft i+1 if it does not end at 0..i: 1, 1, 1/2, 1/2, 1/4
    assert lengths.go_on([0], 5) == pytest.approx([1, 1, 0.5, 0.5, 0.25], abs=1e-8)
    # averaged over rows: one at 3 (goes on past 3, ends at 4 half the time) and one at 0
    assert lengths.go_on([3, 0], 2) == pytest.approx([(1 + 1) / 2, (0.5 + 1) / 2], abs=1e-8)


def test_a_position_few_rows_reached_leans_on_its_neighbour_and_past_the_rows_returns_to_the_pooled_rate():
    """`tiny`: answers stop at 9-10 tokens. A row at 10 is priced half by the rows that reached 9, which all
    stopped at 10 (h = 1), half by the pooled rate (~0.1), not by the pooled rate alone. Further past the
    longest row the hazard halves its distance to the pooled rate per position: a long last row in a GRPO
    drain is priced as going on again within a few positions, not as stopping at once."""
    lengths = ResponseLengths(decay=1.0, prior_rows=2.0)
    lengths.retire([9] * 30 + [10] * 70, [True] * 100)
    h = lengths.hazard
    pooled = 100 / (100 * 9 + 70)  # stops over all positions at risk
    assert h[9] == pytest.approx((70 + 2 * (h[8] + pooled) / 2) / (70 + 2))
    assert h[8] > 0.29 and h[9] > 0.97
    past = [1 - lengths.go_on([n], 1)[0] for n in range(10, 16)]  # the hazard at 10, 11, ...
    assert past == pytest.approx([pooled + (h[9] - pooled) * 0.5 ** (i + 1) for i in range(6)])
    assert past[0] > 0.5 and past[-1] < pooled + 0.02
    assert lengths.go_on([10], 2)[1] == pytest.approx((1 - past[0]) * (1 - past[1]))


def test_no_rows_retired_means_no_stops():
    assert ResponseLengths().go_on([0, 5], 3) == [1.0, 1.0, 1.0]


def test_older_rows_fade_by_decay():
    """Lengths drift over an RL run: a row retired n rows ago weighs decay^n of the newest."""
    lengths = ResponseLengths(decay=0.5, prior_rows=1e-9)
    lengths.retire([2], [True])  # weight 1 (relative): ends at 2
    lengths.retire([4], [True])  # weight 2: ends at 4
    # position 1: both at risk (3 units), 1 unit ends there
    assert lengths.hazard[1] == pytest.approx(1 / 3, abs=1e-8)
    for _ in range(60):  # weights past 1e12 are rescaled; the hazard is unchanged by it
        lengths.retire([4], [True])
    assert lengths.hazard[1] < 1e-9 and lengths.hazard[3] == pytest.approx(1.0, abs=1e-8)
    assert math.isfinite(sum(lengths.ended))


@pytest.mark.parametrize("decay, prior_rows", [(0.0, 1.0), (1.5, 1.0), (0.9, 0.0)])
def test_bad_settings_are_refused(decay, prior_rows):
    with pytest.raises(ValueError, match="decay|prior_rows"):
        ResponseLengths(decay=decay, prior_rows=prior_rows)
