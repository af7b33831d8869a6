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
import hashlib
import os

import torch
import torch.distributed as dist

from vitqs.errors import ConfigError, first_line


def world_size() -> int:
    """Returns the number of ``torch.distributed`` ranks (1 without a process group)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


def rank() -> int:
    """Returns this process's ``torch.distributed`` rank (0 without a process group)."""
    return dist.get_rank() if world_size() > 1 else 0


def _as_real(x: torch.Tensor) -> torch.Tensor:
    # collectives move real numbers; a complex tensor travels as (..., 2) reals
    return torch.view_as_real(x) if x.is_complex() else x


def _on_wire(x: torch.Tensor) -> torch.Tensor:
    """Returns a contiguous copy of ``x`` on the device the backend moves: NCCL moves CUDA
    tensors only, gloo CPU ones (a CUDA tensor goes through host memory)."""
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    return x.to(device, copy=True).contiguous()


def reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """Returns the sum of ``x`` over all ranks (a new tensor); ``x`` itself on one process.

    This is the single place where a ``torch.distributed.all_reduce`` goes.
    """
    if world_size() == 1:
        return x
    total = _on_wire(x)
    dist.all_reduce(_as_real(total), op=dist.ReduceOp.SUM)
    return total.to(x.device)


def reduce_max(x: torch.Tensor) -> torch.Tensor:
    """Returns the maximum of real ``x`` over all ranks; ``x`` itself on one process."""
    if world_size() == 1:
        return x
    largest = _on_wire(x)
    dist.all_reduce(largest, op=dist.ReduceOp.MAX)
    return largest.to(x.device)


def total_count(n: int, device=None) -> int:
    """Returns the sum of the per-rank count ``n`` (samples, chains) over all ranks."""
    if world_size() == 1:
        return int(n)
    return int(reduce_sum(torch.tensor(int(n), dtype=torch.int64, device=device)))


def gather_rows(x: torch.Tensor) -> torch.Tensor:
    """Returns the rows ``(n_r, ...)`` of every rank stacked in rank order ``(Σ n_r, ...)``;
    ranks may hold different numbers of rows. ``x`` itself on one process."""
    if world_size() == 1:
        return x
    local = _on_wire(x)
    n_rows = torch.tensor([x.shape[0]], dtype=torch.int64, device=local.device)
    counts = [torch.zeros_like(n_rows) for _ in range(world_size())]
    dist.all_gather(counts, n_rows)
    counts = [int(c) for c in counts]
    padded = torch.zeros((max(counts), *x.shape[1:]), dtype=x.dtype, device=local.device)
    padded[: x.shape[0]] = local  # all_gather needs equal shapes: pad to the longest
    parts = [torch.zeros_like(padded) for _ in counts]
    dist.all_gather([_as_real(p) for p in parts], _as_real(padded))
    return torch.cat([part[:n] for part, n in zip(parts, counts, strict=True)]).to(x.device)


def broadcast_from_root(x: torch.Tensor) -> torch.Tensor:
    """Returns rank 0's ``x`` on every rank (``x`` itself on one process): decisions and
    updates that every rank must apply alike, whatever rounding each rank's own copy saw."""
    if world_size() == 1:
        return x
    out = _on_wire(x)
    dist.broadcast(_as_real(out), src=0)
    return out.to(x.device)


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
    _import_dynamo_first()
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


def _import_dynamo_first() -> None:
    """Imports ``torch._dynamo`` before the process group exists.

    ``torch.func`` (the log-derivatives' ``vmap``/``jacrev``) imports it on first use, and
    imported while a group exists it keeps that group alive after ``destroy_process_group``:
    gloo's worker threads then outlive the block and run into the interpreter's shutdown.
    One of them may still be releasing the last barrier's work, whose tensors need the GIL
    then; the rank aborts ("terminate called without an active exception": 3 of about 240
    two-rank resumes of the tiny test config). Imported first, it holds nothing, and the
    group's threads are joined when the block ends.
    """
    import torch._dynamo  # noqa: F401


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
        f"under torchrun every rank must run the same command on the same config, but rank "
        f"{differ[0]}'s differs from rank 0's ({shown or 'the files differ'}); give every "
        "rank the same files and options"
    )


def agree_on_file(path, what: str) -> None:
    """Raises ConfigError on every rank unless every rank reads the same bytes at ``path``
    (the file ``--resume`` continues, ``model.init_from``'s run): ranks on nodes whose disks
    hold different copies would start from different states, and their parameters split."""
    if world_size() == 1:
        return
    every = [None] * world_size()
    dist.all_gather_object(every, _digest(path))
    differ = [r for r, other in enumerate(every) if other != every[0]]
    if differ:
        raise ConfigError(
            f"under torchrun every rank must read the same {what} file, but rank {differ[0]} "
            f"reads other bytes at '{path}' than rank 0 ({every[differ[0]]} against "
            f"{every[0]}); give every rank the same files"
        )


def _digest(path) -> str:
    """Returns ``sha256:<first 16 hex digits>`` of the file at ``path``, or why there is none."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                digest.update(block)
    except OSError as err:
        return f"unreadable: {err.strerror or type(err).__name__}"
    return f"sha256:{digest.hexdigest()[:16]}"


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


def agree_signal(signal_number: int | None) -> int | None:
    """Returns one decision for every rank after a step: a signal any rank received (the
    largest number), or None. On one process, the input."""
    if world_size() == 1:
        return signal_number
    agreed = int(reduce_max(torch.tensor([float(signal_number or 0)]))[0])
    return agreed or None


def agree_max(seconds: float) -> float:
    """Returns the largest ``seconds`` any rank counted (a wall clock all ranks follow)."""
    if world_size() == 1:
        return seconds
    return float(reduce_max(torch.tensor([float(seconds)])))


def agree_all(holds: bool) -> bool:
    """Returns whether ``holds`` is true on every rank: one decision that every rank then
    follows (the NaN guard's retry: a rank that retried alone would shift its collectives
    against the others' and hang until ``distributed.timeout``). On one process, the input."""
    if world_size() == 1:
        return bool(holds)
    return not int(reduce_max(torch.tensor([0.0 if holds else 1.0]))[0])
