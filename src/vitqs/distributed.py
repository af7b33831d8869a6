"""One run on many processes: ``torch.distributed`` for ``vitqs run`` under ``torchrun``.

``torchrun --nproc-per-node K -m vitqs run config.yaml`` starts K copies of the command; each
becomes one rank of a process group (NCCL between GPUs, gloo on CPU), with its own share of
the Metropolis chains and one GPU of its node (``LOCAL_RANK``). The physics needs nothing
more than the collectives in `vitqs.estimators` (sums, maxima and gathered rows over ranks):
every rank measures the energy of all samples and applies rank 0's update, so the parameters
stay equal everywhere. What is left is the shell's business, here: the process group, which
GPU a rank drives, parameters that start equal, and the decisions that must be taken once
(stop on a signal or a spent budget). Rank 0 alone writes files and prints.
"""

from __future__ import annotations

import contextlib
import os

import torch
import torch.distributed as dist

from vitqs.estimators import broadcast_from_root, rank, reduce_max, world_size


def launched() -> bool:
    """Returns whether ``torchrun`` (or an equivalent launcher) started more than one rank."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


@contextlib.contextmanager
def process_group(device: torch.device):
    """Joins the process group that ``torchrun``'s environment describes, for the block.

    NCCL when the ranks drive CUDA devices, gloo otherwise. Outside ``torchrun`` (or with one
    rank, or a group already set up by the caller) it does nothing.
    """
    if not launched() or dist.is_initialized():
        yield
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(local_device(device))
    dist.init_process_group(backend)  # env:// rendezvous: MASTER_ADDR, RANK, WORLD_SIZE
    try:
        yield
    finally:
        dist.destroy_process_group()


def is_root() -> bool:
    """Returns whether this process is rank 0 (the one that writes and prints)."""
    return rank() == 0


def local_device(device: torch.device) -> torch.device:
    """Returns ``device``, made this rank's own GPU (``cuda:LOCAL_RANK``) when it is CUDA
    without an index and ``torchrun`` started several ranks."""
    if device.type != "cuda" or device.index is not None or not launched():
        return device
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))


def barrier() -> None:
    """Waits until every rank gets here (nothing on one process)."""
    if world_size() > 1:
        dist.barrier()


@torch.no_grad()
def share_parameters(model: torch.nn.Module) -> None:
    """Makes every rank's parameters and buffers rank 0's."""
    if world_size() == 1:
        return
    for tensor in [*model.parameters(), *model.buffers()]:
        tensor.copy_(broadcast_from_root(tensor.detach()))


def agree(signal_number: int | None, seconds: float) -> tuple[int | None, float]:
    """Returns one decision for every rank after a step: a signal any rank received (the
    largest number), and the longest time any rank has counted. On one process, the inputs."""
    if world_size() == 1:
        return signal_number, seconds
    values = reduce_max(torch.tensor([float(signal_number or 0), float(seconds)]))
    agreed_signal = int(values[0])
    return (agreed_signal or None), float(values[1])
