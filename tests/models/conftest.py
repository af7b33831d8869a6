"""Fixtures of the model tests: one thread and a fixed seed for each."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed_and_one_thread(single_thread):
    # the models here are tiny: one intra-op thread (see single_thread)
    torch.manual_seed(1234)
