"""Writing artefacts so that a full disk or a kill never loses the old one.

Everything is written under a temporary sibling name, `.partial-<pid>.<name>` (hidden, in
the same directory, keeping the name's suffix for writers that go by it), and renamed into
place only once complete: `write_file` for a file (`write_text` for text), `replace_dir`
for a directory that is complete under its temporary name. A failed write removes its
temporary and raises an OSError that names the final path; what a killed process left
(its pid no longer runs) is removed by the next write of the same path (`remove_stale`).
What a writer may replace at all is one rule for every artefact (`check_replaceable`): only
an artefact of the kind it writes, with `overwrite`, and never one of its own inputs.
"""
from __future__ import annotations

import ctypes
import errno
import glob
import logging
import os
import shutil
from collections.abc import Callable, Iterable
from typing import Any

log = logging.getLogger(__name__)

PARTIAL = '.partial-'
_OLD = '.old-'


def partial_path(path: str, tag: str | None = None) -> str:
    """The temporary sibling of `path` that a write fills before it is renamed into place.

    Args:
        path: the final path (made absolute).
        tag: names the writer; `None` (default): this process's pid. A multi-process write,
          whose processes must agree on the name, passes one.

    Returns:
        The absolute path `<folder>/.partial-<tag>.<name>` beside `path`.
    """
    path = os.path.abspath(os.fspath(path))
    folder, name = os.path.split(path)
    return os.path.join(folder, f'{PARTIAL}{tag or os.getpid()}.{name}')


def pid_alive(pid: int) -> bool:
    """Whether process `pid` runs on this host.

    Args:
        pid: a process id.

    Returns:
        True where the process exists (also when it runs as another user); False where it
        does not, or the check fails.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # it runs, as another user
        return True
    except OSError:
        return False
    return True


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


def remove_partial(tmp: str) -> None:
    """Remove a temporary that a write filled, with anything a library put beside it
    (orbax's `<tmp>.orbax-checkpoint-tmp...`).

    Args:
        tmp: the temporary's path (`partial_path`), a file or a directory; a missing one is
          no error.
    """
    for p in [tmp, *glob.glob(glob.escape(tmp) + '.*')]:
        _remove(p)


def remove_stale(path: str) -> list[str]:
    """Remove the temporaries of `path` that a killed process left (their pid no longer
    runs on this host); an old copy set aside by an interrupted `replace_dir` goes back to
    `path` when `path` is missing.

    Args:
        path: the final path whose temporaries to look for.

    Returns:
        The paths removed (a restored old copy is not among them).
    """
    path = os.path.abspath(os.fspath(path))
    folder, name = os.path.split(path)
    removed = []
    for kind in (_OLD, PARTIAL):
        for p in sorted(glob.glob(os.path.join(glob.escape(folder), f'{kind}*.{glob.escape(name)}*'))):
            tag, _, rest = os.path.basename(p)[len(kind):].partition('.')
            mine = rest == name or rest.startswith(name + '.')
            if not tag.isdigit() or not mine or pid_alive(int(tag)):
                continue
            if kind == _OLD and rest == name and not os.path.exists(path):
                os.rename(p, path)   # the swap was killed between its two renames
                log.warning('%s: restored from %s, which an interrupted write left', path, p)
                continue
            _remove(p)
            removed.append(p)
    return removed


def named_error(e: OSError, path: str) -> OSError:
    """`e` as an OSError of the same errno whose message names `path` (the library's message
    names a temporary, or nothing: '[Errno 28] No space left on device').

    Args:
        e: the error a write raised.
        path: the final path that the write was for.

    Returns:
        A new OSError with `e.errno`, whose message is 'cannot write' followed by `path` and
        `e.strerror` (else the message of `e`, else its class name).
    """
    why = e.strerror or str(e) or type(e).__name__
    return OSError(e.errno, f'cannot write {path!r}: {why}')


def write_file(path: str, write: Callable[[str], Any]) -> str:
    """Write a file through a temporary sibling that then replaces `path`.

    A failed write removes the temporary and leaves `path` as it was; temporaries that
    killed processes left beside `path` are removed first (`remove_stale`).

    Args:
        path: where the file goes.
        write: `write(tmp)` writes the file's complete contents to `tmp` (a temporary sibling
          that keeps `path`'s suffix); it is fsynced before the rename.

    Returns:
        `path`.

    Raises:
        OSError: writing, syncing or renaming failed; the error is remade by `named_error`
          to name `path`. Any other exception from `write` propagates unchanged.
    """
    path = os.fspath(path)
    tmp = partial_path(path)
    remove_stale(path)
    try:
        write(tmp)
        with open(tmp, 'rb') as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        remove_partial(tmp)
        if isinstance(e, OSError):
            raise named_error(e, path) from None
        raise
    return path


def write_text(path: str, text: str) -> str:
    """Write `text` (UTF-8) to `path` through `write_file`.

    Args:
        path: where the file goes.
        text: its contents.

    Returns:
        `path`.

    Raises:
        OSError: the write failed (`write_file`); the message names `path`.
    """
    def write(tmp):
        with open(tmp, 'w', encoding='utf-8') as f:
            f.write(text)
    return write_file(path, write)


def _found(path: str) -> str:
    """What is at `path`, for messages: 'a file', 'a symbolic link', 'a folder of 3 entries
    (a, b, c)'."""
    if os.path.islink(path) and not os.path.exists(path):
        return 'a dangling symbolic link'
    if not os.path.isdir(path):
        return 'a file'
    names = sorted(os.listdir(path))
    shown = ', '.join(names[:3]) + (', ...' if len(names) > 3 else '')
    return f"a folder of {len(names)} entr{'y' if len(names) == 1 else 'ies'} ({shown})"


def check_replaceable(path: str | os.PathLike, what: str, is_kind: Callable[[str], bool], *,
                      overwrite: bool, how: str = 'overwrite=True',
                      inputs: Iterable[str | os.PathLike | None] = (),
                      error: Callable[[str], Exception] = FileExistsError) -> None:
    """The one rule of every writer that may replace what is at `path` (a model, a gene, an
    export): it writes only what it would have written itself.

    `path` may be written when nothing is there or an empty folder is; when it holds `what`
    (`is_kind(path)`), only with `overwrite`; never when it holds anything else (a folder
    of the user's files, a training workdir, another kind of artefact), and never when it
    is, or contains, one of `inputs` (what the writer reads: a replaced input would be lost
    before, or while, it is read). `how` names the switch in the message: '--overwrite' on
    the command line, 'overwrite=True' in Python.

    Args:
        path: where the writer would write.
        what: the kind of artefact it writes, in words ('a model'), for the message.
        is_kind: whether what is at a path is `what`.
        overwrite: whether an existing `what` may be replaced.
        how: the switch that sets `overwrite`, in words, for the message.
        inputs: the paths the writer reads; `None` entries are skipped.
        error: the exception class raised, called with a one-line message naming `path`
          (default FileExistsError).

    Raises:
        FileExistsError: (or the class given as `error`) `path` is, or contains, one of
          `inputs`; it exists (not as an empty folder) and is not `what`; or it is `what` and
          `overwrite` is False.
    """
    path = os.path.abspath(os.fspath(path))
    if not os.path.lexists(path):
        return
    real = os.path.realpath(path)
    for given in inputs:
        if given is None:
            continue
        inp = os.path.realpath(os.fspath(given))
        if inp == real or inp.startswith(real.rstrip(os.sep) + os.sep):
            where = 'is' if inp == real else 'contains'
            raise error(f'{path}: {where} {os.fspath(given)!r}, an input of this command; it is '
                        'never replaced: choose another output path')
    if os.path.isdir(path) and not os.listdir(path):
        return
    if not is_kind(path):
        raise error(f'{path}: exists and is {_found(path)}, not {what}; only {what} is ever '
                    'replaced: choose another path, or move it away yourself')
    if not overwrite:
        raise error(f'{path}: {what} already exists; pass {how} to replace it')


def _exchange(a: str, b: str) -> bool:
    """Swap two paths in one step (Linux renameat2 RENAME_EXCHANGE); False where the
    system or file system has no such call."""
    try:
        fn = getattr(ctypes.CDLL(None, use_errno=True), 'renameat2', None)
    except OSError:
        return False
    if fn is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(err, f'cannot move {a!r} to {b!r}: {os.strerror(err)}')


def replace_dir(new: str, path: str) -> str:
    """Move the complete directory `new` to `path`, replacing what is there: swapped in one
    step where the system can, else set aside, renamed and deleted, so that `path` holds
    the old directory or the new one at every moment (an interruption between the two
    renames is undone by the next `remove_stale`).

    Args:
        new: the complete directory (typically `partial_path(path)`); it is moved.
        path: where it goes.

    Returns:
        `path`.
    """
    if not os.path.lexists(path):
        os.rename(new, path)
    elif _exchange(new, path):
        _remove(new)   # now the old one
    else:
        old = partial_path(path).replace(PARTIAL, _OLD, 1)
        os.rename(path, old)
        os.rename(new, path)
        _remove(old)
    return path
