"""Shared fixtures: tiny random-weight Hugging Face checkpoints built in the test run.

Helpers that tests import live in `helpers.py`; this file only holds fixtures and the
thread setting.
"""
from __future__ import annotations

import pytest
import torch

from helpers import save_random_checkpoint

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def target_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("target")
    save_random_checkpoint(path, layers=2, hidden=64, seed=0)
    return path


@pytest.fixture(scope="session")
def draft_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("draft")
    save_random_checkpoint(path, layers=1, hidden=32, seed=1)
    return path


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                         reason="needs a CUDA device"))])
def device(request) -> torch.device:
    """Where a sampled exactness test runs the sampler under test: the CPU, and the GPU where there is one."""
    return torch.device(request.param)


@pytest.fixture(scope="module")
def one_thread_module():
    """Torch at one thread for a whole module: thousands of tiny ops, or the one-core budget, where a second
    intra-op thread only waits on a busy core."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
