"""Fixtures shared by the model tests; helpers live in ``helpers.py``."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed_and_one_thread():
    # One intra-op thread: the models here are tiny, and on a busy 2-core machine each
    # OpenMP region (LayerNorm opens one at any size) waits ~10 ms for a second thread.
    n_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(1234)
    yield
    torch.set_num_threads(n_threads)
