"""One run per workdir: a lock file that names the process holding it.

Two runs in one workdir would interleave their checkpoints and metrics, and leave one
run's config.json beside the other's model. `hold_workdir(workdir)` creates
`workdir/.jlearngene.lock` (O_CREAT | O_EXCL) holding the holder's pid, host, command
and start time, and removes it when the block ends, however it ends. A second process is
refused at once with a `WorkdirInUseError` naming the holder. A lock whose process no
longer runs on this host is stale: it is taken over, with a warning. One process may hold
its workdir several times (`jlearngene train` runs a study that takes it again); only
process 0 of a multi-process run takes it (its processes share the workdir). A
`RunCheckpointer` takes its directory's lock the same way at its first save, so two
processes never write one run's checkpoints (orbax's writers of a step that two processes
write at once wait minutes for each other's signals).
"""
from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Iterator

from jlearngene import distributed
from jlearngene.train.files import pid_alive

log = logging.getLogger(__name__)

LOCK_FILE = '.jlearngene.lock'

_HELD: dict[str, int] = {}   # lock path -> how many times this process holds it
_MADE: set[str] = set()       # folders made to hold a lock: removed with it when left empty


class WorkdirInUseError(OSError):
    """Another process holds the workdir; the message names it."""


def host() -> str:
    """This machine's name, as lock files record it.

    Returns:
        `socket.gethostname()`.
    """
    return socket.gethostname()


def _read(path: str) -> dict | None:
    """The holder a lock file names; None when it is unreadable or half-written."""
    try:
        with open(path, encoding='utf-8') as f:
            holder = json.load(f)
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) and isinstance(holder.get('pid'), int) else None


def _describe(holder: dict) -> str:
    where = '' if holder.get('host') == host() else f" on {holder.get('host', '?')}"
    return (f"process {holder['pid']}{where} ({holder.get('command', '?')}, started "
            f"{holder.get('started', '?')})")


def _create(path: str) -> bool:
    """Create the lock file naming this process; False when it exists."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else 'python'
    prog = 'jlearngene' if prog in ('jlearngene', '__main__.py') else prog
    holder = {'pid': os.getpid(), 'host': host(), 'command': ' '.join([prog, *sys.argv[1:]]),
              'started': datetime.datetime.now().isoformat(timespec='seconds')}
    with os.fdopen(fd, 'w', encoding='utf-8') as f:
        json.dump(holder, f)
    return True


def acquire(workdir: str, what: str = 'workdir') -> str:
    """Take `workdir`'s lock, creating the folder where it does not exist.

    A folder made here is removed again by `release` if it is then empty (one that another
    process made at the same moment is only used, never removed). A lock this
    process already holds is taken once more (counted); a stale lock (its process no longer
    runs on this host) is taken over, with a warning.

    Args:
        workdir: the folder to lock.
        what: what the folder is, for the messages (e.g. 'workdir', 'checkpoint directory').

    Returns:
        The lock file's absolute path, to pass to `release`.

    Raises:
        WorkdirInUseError: a live process (or one on another host) holds the lock, the lock
          file names no process, or another process took over a stale lock first.
        FileExistsError: `workdir` exists and is not a folder.
    """
    workdir = os.path.abspath(workdir)
    path = os.path.join(workdir, LOCK_FILE)
    if path in _HELD:
        _HELD[path] += 1
        return path
    if not os.path.isdir(workdir):
        try:
            os.makedirs(workdir)
        except FileExistsError:   # another process made it first: not ours to remove
            if not os.path.isdir(workdir):
                raise
        else:
            _MADE.add(workdir)
    for _ in range(3):   # a stale lock is removed and the create tried again
        if _create(path):
            _HELD[path] = 1
            return path
        holder = _read(path)
        if holder is None:   # being written: read it again once
            time.sleep(0.2)
            holder = _read(path)
        if holder is None:   # garbage: refuse rather than guess
            raise WorkdirInUseError(f'{what} {workdir!r} is locked ({path} exists but names no '
                                    'process); if no run uses it, delete that file')
        if holder.get('host') != host() or pid_alive(holder['pid']):
            raise WorkdirInUseError(f'{what} {workdir!r} is in use by {_describe(holder)}; wait '
                                    f'for it to end or give another workdir (if it is gone, delete {path})')
        log.warning('%s %s: taking over the stale lock of %s, which no longer runs',
                    what, workdir, _describe(holder))
        if _read(path) == holder:   # not replaced by another process taking it over meanwhile
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
    raise WorkdirInUseError(f'{what} {workdir!r}: another process took over its stale lock ({path})')


def release(path: str) -> None:
    """Give back a lock `acquire` returned (the file goes when the last hold ends).

    When the last hold ends, a folder that `acquire` made is removed too if it is empty.

    Args:
        path: the lock file's path, as `acquire` returned it; this process must hold it
          (else `KeyError`).
    """
    _HELD[path] -= 1
    if _HELD[path] == 0:
        del _HELD[path]
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
        folder = os.path.dirname(path)
        if folder in _MADE:   # a run refused before it wrote anything leaves no folder
            _MADE.discard(folder)
            with contextlib.suppress(OSError):
                os.rmdir(folder)


def release_all() -> None:
    """Remove every lock this process holds (before it ends at once, e.g. on a signal)."""
    for path in list(_HELD):
        _HELD[path] = 1
        release(path)


@contextlib.contextmanager
def hold_workdir(workdir: str) -> Iterator[str | None]:
    """Hold `workdir` for the block (see the module docstring); the lock goes however it ends.

    Args:
        workdir: the folder to lock.

    Yields:
        The lock file's path; `None` on processes other than 0, which take no lock.

    Raises:
        WorkdirInUseError: another process holds the workdir (from `acquire`).
    """
    if not distributed.is_main_process():
        yield None
        return
    path = acquire(workdir)
    try:
        yield path
    finally:
        release(path)
