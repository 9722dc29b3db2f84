"""Training that survives interruption: `fit` with `Saving` keeps weights, optimiser, data position and RNG on
disk, and a run killed mid-way and started again ends bit for bit where the uninterrupted run ends.

Chain of checks:
    resume     a fit killed at step 17 of 30 (the exception a kill or Ctrl-C raises) and started again with the
               same folder ends with the same weights, exactly, as one never stopped; its loss draws random
               noise, so the RNG must come back too, and its batches follow the step, so must the data position;
    sittings   `sitting_seconds` ends a sitting with the state saved and `finished` False; the next sitting
               continues from it;
    indexed    the batch of a step is the same whether the steps before it ran in this process or not.
"""
from __future__ import annotations

import pytest
import torch

from specrl.training.loop import Saving, fit, indexed, shuffled_batches


def run(folder, stop_at: int | None = None, sitting_seconds: float = float("inf"), steps: int = 30):
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    data, target = torch.randn(64, 8), torch.randn(64, 4)
    batch_at = indexed(shuffled_batches(64, 8, seed=3))

    def loss_fn(step: int) -> torch.Tensor:
        if step == stop_at:
            raise KeyboardInterrupt
        idx = batch_at(step)
        noise = 0.01 * torch.randn(len(idx), 4)  # draws from the RNG: a resume must restore it
        return ((module(data[idx]) - target[idx] - noise) ** 2).mean()

    saving = None if folder is None else Saving(folder, module, every_seconds=0.0, sitting_seconds=sitting_seconds)
    result = fit(list(module.parameters()), loss_fn, steps, 1e-2, 5, "test", saving=saving)
    return module, result


def test_a_fit_killed_and_started_again_ends_bit_for_bit_where_the_unstopped_fit_ends(tmp_path):
    whole, done = run(None)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "state", stop_at=17)
    resumed, again = run(tmp_path / "state")
    assert done.steps == again.steps == 30 and done.finished and again.finished
    for name, tensor in whole.state_dict().items():
        assert torch.equal(tensor, resumed.state_dict()[name]), name
    assert done.loss == again.loss
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == \
        ["model.safetensors", "optimizer.safetensors", "rng.safetensors", "state.json"]  # no pickle


def test_a_sitting_ends_early_with_its_state_saved_and_the_next_one_finishes(tmp_path):
    _, first = run(tmp_path / "state", sitting_seconds=0.0)
    assert not first.finished and first.steps == 0
    _, part = run(tmp_path / "state", stop_at=None, steps=12)
    assert part.finished and part.steps == 12
    whole, _ = run(None, steps=12)
    resumed, _ = run(tmp_path / "state", steps=12)  # nothing left to do: loads and stops
    for name, tensor in whole.state_dict().items():
        assert torch.equal(tensor, resumed.state_dict()[name]), name


def test_indexed_batches_follow_the_step_not_the_calls():
    fresh = indexed(shuffled_batches(40, 6, seed=1))
    seen = [fresh(step) for step in range(9)]
    jumped = indexed(shuffled_batches(40, 6, seed=1))
    assert jumped(8) == seen[8] and jumped(8) == seen[8]
    with pytest.raises(ValueError, match="behind the data position"):
        jumped(3)
