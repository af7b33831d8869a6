"""The results file a run writes: which path, and the lock that makes the run its only writer.

A new run writes ``<output.dir>/<name>.h5``; an ``--overwrite`` run writes
``.<name>.h5.pending`` beside it until it finishes, so that the finished run it replaces is
lost only when the new one has landed. Rank 0 alone decides and writes.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path

from vitqs import distributed
from vitqs.errors import ConfigError


def pending_path(target: Path) -> Path:
    """Returns where an ``--overwrite`` run writes until it finishes: the finished run it
    replaces stays in ``target`` meanwhile, so an interrupted replacement loses nothing."""
    return target.with_name(f".{target.name}.pending")


def working_path(target: Path, *, resume: bool, overwrite: bool) -> Path:
    """Returns the file this run writes, or raises ConfigError (rank 0 decides); a results
    file or pending replacement that is a symbolic link is refused before anything runs."""
    pending = pending_path(target)
    for path in (target, pending):
        if path.is_symlink():
            raise ConfigError(
                f"'{path}' is a symbolic link; vitqs neither writes nor resumes through a "
                "link in its output folder (remove it, or set output.dir to the folder it "
                "points into)"
            )
    if resume:
        if pending.exists():  # an --overwrite run that was interrupted
            return pending
        if not target.exists():
            raise ConfigError(f"--resume: there is no results file '{target}' to resume")
        return target
    if overwrite:
        pending.unlink(missing_ok=True)  # an earlier replacement, abandoned: start anew
        return pending if target.exists() else target
    refuse_existing(target)
    return target


def refuse_existing(target: Path) -> None:
    """Raises ConfigError when a new run (neither ``--resume`` nor ``--overwrite``) would
    meet a results file, or an interrupted replacement of one, at ``target``."""
    pending = pending_path(target)
    if target.exists():
        raise ConfigError(
            f"results file '{target}' exists; "
            "pass --resume to continue it or --overwrite to replace it"
        )
    if pending.exists():
        raise ConfigError(
            f"an --overwrite run of '{target}' was interrupted ('{pending}'); pass --resume to "
            "continue it or --overwrite to start the replacement again"
        )


def check_output_dir(output_dir) -> None:
    """Raises ConfigError unless ``output.dir`` is, or can be made, a writable folder: found
    before ED and the steps, not when the first file is due. Creates nothing (a refused
    config leaves no trace)."""
    existing = Path(output_dir).absolute()
    while not existing.exists():  # the nearest existing ancestor decides
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"output.dir='{output_dir}': '{existing}' is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"output.dir='{output_dir}': '{existing}' is not writable")


@contextlib.contextmanager
def sole_writer(path: Path):
    """Holds an exclusive lock on ``.<name>.h5.lock`` beside the results file (rank 0), from
    the run's first write or its resume to its end, so that a second ``vitqs run`` on the same
    file, a ``--resume`` or an ``--overwrite``, is refused instead of writing over a run in
    progress. The kernel drops the lock when the process ends, however it ends; a clean end
    also removes the file."""
    if not distributed.is_root():
        yield
        return
    lock = path.with_name(f".{path.name}.lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:  # O_NOFOLLOW: a symbolic link planted under the lock's name is refused, not followed
        descriptor = os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as err:
        raise ConfigError(f"cannot create the lock file '{lock}': {err.strerror}") from None
    with os.fdopen(descriptor, "w") as handle:
        if not _hold(handle, lock):
            raise ConfigError(
                f"'{path}' is being written by another vitqs process; "
                "let it finish or stop it (Ctrl-C / SIGTERM checkpoints it) first"
            )
        _remove_stale_temporaries(path)
        try:
            yield
        finally:
            lock.unlink(missing_ok=True)  # still held: a later run locks a new file


# `is_being_written` holds the lock shared for a moment: a run starting just then tries again
_LOCK_TRIES, _LOCK_WAIT = 5, 0.05


def _hold(handle, lock: Path) -> bool:
    """Returns whether this process now holds ``lock`` alone; True also on a file system
    without locks (run unguarded rather than not at all)."""
    for attempt in range(_LOCK_TRIES):
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if attempt == _LOCK_TRIES - 1:
                return False
            time.sleep(_LOCK_WAIT)
        except OSError:
            return True
    try:
        # a lock on a file that another run removed in between guards nothing
        return os.fstat(handle.fileno()).st_ino == os.stat(lock).st_ino
    except FileNotFoundError:
        return False


def _remove_stale_temporaries(path: Path) -> None:
    """Removes the temporary files a killed writer of ``path`` (or of its pending
    replacement) left beside it: only the lock's holder writes them, and it holds it now."""
    for name in (path.name, pending_path(path).name):
        for stale in path.parent.glob(f".{glob_escape(name)}.*.tmp"):
            with contextlib.suppress(OSError):
                if not stale.is_symlink() and stale.is_file():
                    stale.unlink()


def glob_escape(name: str) -> str:
    """Returns ``name`` with the characters glob reads as patterns taken literally."""
    return "".join(f"[{ch}]" if ch in "*?[" else ch for ch in name)


def is_being_written(path: str | Path) -> bool:
    """Returns whether a live process holds the lock of the results file ``path``: a file
    that says ``running`` without one was left by a process that died (SIGKILL, out of
    memory, a node lost) and resumes with ``--resume``. True where it cannot tell (a file
    system without locks, a lock it may not read): it never calls a live run dead."""
    path = Path(path)
    lock = path.with_name(f".{path.name}.lock")
    try:
        descriptor = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return False  # a clean end removes it; a writer holds it from its start to its end
    except OSError:
        return True
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return True
    finally:
        os.close(descriptor)  # closing drops the shared lock, if taken
    return False
