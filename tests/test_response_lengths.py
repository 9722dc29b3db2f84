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


def test_a_position_few_rows_reached_takes_its_neighbours_hazard():
    """`tiny`: answers stop at 9-10 tokens and ~1% run on to 11. A row at 10 is priced by the rows that
    reached 9, which all stopped at 10 (h = 1), not by the pooled rate (~0.1), with prior_rows' weight."""
    lengths = ResponseLengths(decay=1.0, prior_rows=2.0)
    lengths.retire([9] * 30 + [10] * 70, [True] * 100)
    h = lengths.hazard
    assert h[9] == pytest.approx(70 / (70 + 2) + 2 * h[8] / (70 + 2))
    assert h[8] > 0.29 and h[9] > 0.98
    assert lengths.go_on([10], 1)[0] == pytest.approx(1 - h[9])  # past the longest row: the last hazard
    assert lengths.go_on([12], 3)[0] < 0.02


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
    assert lengths.hazard[1] < 1e-12 and lengths.hazard[3] == pytest.approx(1.0, abs=1e-8)
    assert math.isfinite(sum(lengths.ended))


@pytest.mark.parametrize("decay, prior_rows", [(0.0, 1.0), (1.5, 1.0), (0.9, 0.0)])
def test_bad_settings_are_refused(decay, prior_rows):
    with pytest.raises(ValueError, match="decay|prior_rows"):
        ResponseLengths(decay=decay, prior_rows=prior_rows)
