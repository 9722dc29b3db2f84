"""The optimisation loop's schedule: warm-up, then a cosine over whichever budget (steps or time) ends first."""
import math
import time

import torch

from specrl.training import loop
from specrl.training.loop import fit, learning_rate


def test_schedule_by_hand():
    assert math.isclose(learning_rate(0, 1.0, 10, 110), 0.1)  # warm-up: (step + 1) / warmup
    assert math.isclose(learning_rate(10, 1.0, 10, 110), 1.0)  # peak after warm-up
    assert math.isclose(learning_rate(60, 1.0, 10, 110), 0.55)  # half way: 0.1 + 0.9 / 2
    assert math.isclose(learning_rate(110, 1.0, 10, 110), 0.1)  # floor lr / 10


def test_time_budget_drives_the_cosine_when_it_ends_first():
    assert math.isclose(learning_rate(11, 1.0, 10, 10**6, time_fraction=0.5), 0.55)
    assert math.isclose(learning_rate(11, 1.0, 10, 10**6, time_fraction=1.0), 0.1)
    assert math.isclose(learning_rate(60, 1.0, 10, 110, time_fraction=0.1), 0.55)  # steps ahead of time: steps rule


def test_fit_anneals_over_its_time_budget(monkeypatch):
    rates = []

    def recording(step, lr, warmup, steps, time_fraction=0.0):
        rates.append(learning_rate(step, lr, warmup, steps, time_fraction))
        return rates[-1]

    monkeypatch.setattr(loop, "learning_rate", recording)
    w = torch.zeros(1, requires_grad=True)

    def loss_fn(step):
        time.sleep(0.01)
        return (w - 1).pow(2).sum()

    _, steps = fit([w], loss_fn, steps=10**6, lr=1.0, warmup=2, desc="t", seconds=0.5)
    assert steps < 10**6  # time ended the run
    assert rates[-1] < 0.2 and min(rates[2:]) == rates[-1]  # annealed towards lr / 10, never back up


def test_length_pools_keep_every_sequence_once_a_pass_and_cut_the_padding():
    lengths = torch.randint(10, 200, (1000,), generator=torch.Generator().manual_seed(0)).tolist()
    micro_batch, per_pass = 8, 125  # 1000 / 8 micro-batches a pass

    def padding(batches):  # padded positions per real one
        return sum(len(b) * max(lengths[i] for i in b) for b in batches) / sum(lengths)

    for pools in (None, lengths):
        batches = loop.shuffled_batches(len(lengths), micro_batch, seed=1, lengths=pools, pool=16)
        for _ in range(2):  # two passes
            one_pass = [next(batches) for _ in range(per_pass)]
            assert sorted(i for b in one_pass for i in b) == list(range(1000))
            if pools is None:
                random_padding = padding(one_pass)
            else:
                assert padding(one_pass) < 1.1 < 1.3 < random_padding
                first_sizes = [max(lengths[i] for i in b) for b in one_pass[:20]]
                assert first_sizes != sorted(first_sizes)  # the pass's micro-batches are shuffled, not in length order
