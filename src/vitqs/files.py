"""Files written whole or not at all, through the descriptor that created them.

Every file vitqs writes (results, tables, figures, ED cache entries) is built under a fresh
temporary name beside its target and renamed over it: a crash, a SIGKILL or a full disk
leaves the previous file or the new one, never half of one. Each step goes through the
descriptor `mkstemp` returned — write, ``fchmod``, ``fsync`` — never through the name again,
so a link swapped in under the temporary name meanwhile redirects nothing; the folder is
synced after the rename, so the new name survives a power cut. A target that is a symbolic
link is refused: vitqs does not write where a link planted in an output folder points.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: str | Path, data: bytes, *, mode: int = 0o666) -> Path:
    """Writes ``data`` to ``path`` whole or not at all; returns the path.

    ``mode`` is applied through the descriptor, less the umask (``mkstemp`` makes 0600; a
    results file is for sharing). Creates the parent folder. Raises OSError with the
    system's reason when the disk refuses (the target keeps its content), and
    IsADirectoryError / `LinkRefused` for a target that is a folder or a symbolic link.
    """
    path = Path(path)
    refuse_link(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(descriptor, "wb") as stream:
            os.fchmod(stream.fileno(), mode & ~_umask())
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())  # on disk before the rename makes it visible
        replace_durably(name, path)
    except BaseException:  # also KeyboardInterrupt: never leave a half file behind
        Path(name).unlink(missing_ok=True)
        raise
    return path


class LinkRefused(OSError):
    """The target of a write is a symbolic link."""


def refuse_link(path: Path) -> None:
    """Raises `LinkRefused` when ``path`` is a symbolic link (dangling or not)."""
    if path.is_symlink():
        raise LinkRefused(
            f"'{path}' is a symbolic link; vitqs writes no file through a link (remove it)"
        )


def replace_durably(source: str | Path, target: str | Path) -> None:
    """Renames ``source`` over ``target`` (atomic on one file system) and syncs the folder,
    so the rename itself is on disk."""
    os.replace(source, target)
    sync_folder(Path(target).parent)


def sync_folder(folder: Path) -> None:
    """Flushes ``folder``'s entries to disk (a no-op where folders cannot be opened)."""
    try:
        descriptor = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:  # some file systems refuse fsync on a folder: nothing more to do
        pass
    finally:
        os.close(descriptor)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
