"""One run on many processes: ``torch.distributed`` for ``vitqs run`` under ``torchrun``.

``torchrun --nproc-per-node K -m vitqs run config.yaml`` starts K copies of the command; each
becomes one rank of a process group (NCCL between GPUs, gloo on CPU), with its own share of
the Metropolis chains and one GPU of its node (``LOCAL_RANK``). The physics needs nothing
more than the collectives in `vitqs.vmc.estimators` (sums, maxima and gathered rows over ranks):
every rank measures the energy of all samples and applies rank 0's update, so the parameters
stay equal everywhere. What is left is the shell's business, here: the process group, which
GPU a rank drives, parameters that start equal, and the decisions that must be taken once
(stop on a signal or a spent budget). Rank 0 alone writes files and prints.
"""

from __future__ import annotations

import contextlib
import datetime
import os

import torch
import torch.distributed as dist

from vitqs.config import ConfigError
from vitqs.errors import first_line
from vitqs.vmc.estimators import broadcast_from_root, rank, reduce_max, world_size

DEFAULT_TIMEOUT = 600.0  # seconds; the config key distributed.timeout sets it per run


def launched() -> bool:
    """Returns whether ``torchrun`` (or an equivalent launcher) started more than one rank."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


class CollectiveFailed(RuntimeError):
    """A collective did not complete: another rank died, or waited longer than the timeout."""


def is_collective_failure(err: BaseException) -> bool:
    """Returns whether ``err`` is a collective that failed: torch's DistError (NCCL, store
    timeouts), or the plain RuntimeError gloo raises for a closed peer or a timeout."""
    if isinstance(err, dist.DistError):
        return True
    text = str(err)
    return isinstance(err, RuntimeError) and ("gloo" in text or "NCCL" in text)


@contextlib.contextmanager
def process_group(device: torch.device, timeout: float = DEFAULT_TIMEOUT):
    """Joins the process group that ``torchrun``'s environment describes, for the block.

    NCCL when the ranks drive CUDA devices, gloo otherwise. A collective that waits longer
    than ``timeout`` seconds for the other ranks (one died, or hangs) fails, and so does one
    whose peer's connection closed: both raise `CollectiveFailed` out of the block instead of
    leaving the live ranks waiting (torch's default is 30 minutes). Outside ``torchrun`` (or
    with one rank, or a group already set up by the caller) it does nothing.
    """
    if not launched() or dist.is_initialized():
        yield
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(local_device(device))
    # env:// rendezvous: MASTER_ADDR, RANK, WORLD_SIZE
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))
    failed = False
    try:
        yield
    except RuntimeError as err:
        if not is_collective_failure(err):
            raise
        failed = True
        raise CollectiveFailed(
            f"rank {rank()}: a collective with the other ranks failed ({first_line(err, 200)}); "
            f"another "
            f"rank stopped, or none answered within distributed.timeout={timeout:g} s"
        ) from None
    finally:
        if not failed:  # a group whose peer is gone cannot be torn down collectively
            with contextlib.suppress(RuntimeError):
                dist.destroy_process_group()


def on_root(decide):
    """Returns ``decide()`` computed on rank 0 alone and shared with every rank.

    For decisions about the file system (does the results file exist, can its folder be
    written, is a sweep's point finished): on a cluster each node may see the shared disk a
    moment apart, and ranks that decided differently would part ways and hang in the next
    collective. A ConfigError raised by ``decide`` on rank 0 is raised on every rank.
    """
    if world_size() == 1:
        return decide()
    outcome = [None, None]
    if is_root():
        try:
            outcome[0] = decide()
        except ConfigError as err:
            outcome[1] = str(err)
    dist.broadcast_object_list(outcome, src=0)
    if outcome[1] is not None:
        raise ConfigError(outcome[1])
    return outcome[0]


def agree_on_config(data: dict) -> None:
    """Raises ConfigError on every rank unless every rank holds the same config ``data``.

    Ranks read their config files on their own; one that read another learning rate would
    split the parameters silently, another ``checkpoint_every`` would hang the collectives.
    """
    if world_size() == 1:
        return
    every = [None] * world_size()
    dist.all_gather_object(every, data)
    differ = [r for r, other in enumerate(every) if other != every[0]]
    if not differ:
        return
    keys = sorted(_differing_keys(every[0], every[differ[0]]))
    shown = ", ".join(keys[:5]) + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")
    raise ConfigError(
        f"under torchrun every rank must read the same config, but rank {differ[0]}'s differs "
        f"from rank 0's ({shown or 'the files differ'}); give every rank the same files"
    )


def _differing_keys(first, second, prefix: str = "") -> list[str]:
    if not (isinstance(first, dict) and isinstance(second, dict)):
        return [prefix.rstrip(".") or "config"] if first != second else []
    keys = []
    for key in sorted(set(first) | set(second), key=str):
        keys += _differing_keys(first.get(key), second.get(key), f"{prefix}{key}.")
    return keys


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
