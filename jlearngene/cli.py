"""`jlearngene` / `python -m jlearngene`: one entry point, one module per subcommand.

Each subcommand lives in `jlearngene/commands/<name>.py` and exposes `HELP` (one line) and
`main(argv) -> int`. Modules are imported lazily so `jlearngene info` does not pay for the
trainer's imports.

Errors are reported here, once for every command: an expected error (`expected_error`: a
bad command line, config, file, data set, gene or checkpoint, a non-finite loss, a missing
optional package) is one line `jlearngene <command>: <message>` on stderr and exit status 1
(2 for the command line: `commands.config_args.UsageError`); the
traceback follows only with `--verbose` (anywhere on the command line) or
`JLEARNGENE_TRACEBACK=1`. Any other exception is a bug: its traceback is printed, then
the same one line marked as an internal error. Ctrl-C during training saves a checkpoint
like SIGTERM does (`train.hooks.Preemption`) and names it; elsewhere (an import, XLA's
compilation, a checkpoint write, an evaluation) SIGINT and SIGTERM stop the process at once
with one line and status 130 or 143 (`_stop_on_signal`). Library loggers (absl, through
which orbax logs, and orbax) print only with `--verbose`: a command reports the problems
it meets itself, in its one line. A failed command exits with its status even when a
failed checkpoint write left orbax threads waiting (`_exit_despite_threads`).
"""
from __future__ import annotations

import importlib
import logging
import os
import select
import signal
import stat
import sys
import traceback

COMMANDS = ('demo', 'train', 'compare', 'eval', 'plot', 'info', 'convert', 'gene', 'descend',
            'render')
TRACEBACK_ENV = 'JLEARNGENE_TRACEBACK'
VERBOSE_FLAG = '--verbose'
STOP_SIGNALS = ('SIGINT', 'SIGTERM')
LIBRARY_LOGGERS = ('absl', 'orbax')
LINGER_SECONDS = 5.0   # how long a failed command waits for the threads of a failed write


def _usage() -> str:
    lines = ['usage: jlearngene <command> [options]   (jlearngene <command> --help for details)', '',
             'commands:']
    for name in COMMANDS:
        try:
            help_line = importlib.import_module(f'jlearngene.commands.{name}').HELP
        except ModuleNotFoundError:
            continue
        lines.append(f'  {name:<9} {help_line}')
    lines += ['', f'{VERBOSE_FLAG} (or {TRACEBACK_ENV}=1): print the traceback of an error as well']
    return '\n'.join(lines)


def _loaded(module: str, name: str):
    """`module.name` if `module` is imported already, else None: an exception of a module
    that was never imported cannot have been raised, so nothing is imported to ask."""
    return getattr(sys.modules.get(module), name, None)


def expected_error(e: BaseException) -> bool:
    """Whether `e` is an error the user can act on (reported in one line): ValueError (bad
    configs, data, genes, state dicts: `ConfigError`, `DataError`, `GeneError`,
    `StateDictError`), OSError (missing or unreadable files), ImportError (an optional
    package), `CheckpointError` and `NonFiniteLossError`."""
    kinds = [ValueError, OSError, ImportError]
    kinds += [k for k in (_loaded('jlearngene.train.integrity', 'CheckpointError'),
                          _loaded('jlearngene.train.hooks', 'NonFiniteLossError')) if k]
    return isinstance(e, tuple(kinds))


def _message(e: BaseException) -> str:
    text = str(e).strip()
    if isinstance(e, KeyError) and e.args:   # str() of a KeyError is the key's repr
        text = str(e.args[0])
    return text or type(e).__name__


# What a command stopped by a signal leaves, by command (`_stop_line`): the commands that
# train resume; the ones that write replace their outputs only once complete (`train.files`).
AFTER_STOP = {
    'train': 'a classification run keeps its last checkpoint and resumes from it when run again '
             '(a study reads its finished runs back and trains the rest)',
    'compare': 'run the same command again: the study reads its finished runs back and trains the rest',
    'demo': 'run it again: the runs that finished are read back',
    **dict.fromkeys(('plot', 'render', 'convert', 'descend', 'gene'),
                    'its outputs are replaced only once complete, so none was left half-written'),
}


def _stop_line(prog: str, name: str) -> str:
    """The one line for a command stopped by signal `name`: what happened, and what the
    command (`prog`'s last word) leaves behind (`AFTER_STOP`; nothing for a command that
    writes nothing)."""
    what = 'interrupted (Ctrl-C)' if name == 'SIGINT' else f'stopped by {name}'
    after = AFTER_STOP.get(prog.split()[-1])
    return f'{prog}: {what}' + (f'; {after}' if after else '')


def _stop_on_signal(prog: str) -> dict:
    """Install handlers that end the process on SIGINT or SIGTERM with `_stop_line` on
    stderr and status 128 + the signal number, at once (`os._exit`): the signal may land in
    any library's code (an import, a gc callback of XLA, orbax's threads), where a raised
    KeyboardInterrupt can be swallowed, or unwind into interpreter shutdown while XLA's and
    tensorstore's threads still run. A training loop replaces them with its own, which
    save a checkpoint first (`train.hooks.Preemption`), and puts them back after. Returns
    the handlers replaced (none outside the main thread, where Python installs none)."""
    def stop(signum, frame):
        del frame
        try:
            sys.stdout.flush()
        except (OSError, ValueError, RuntimeError):   # a closed pipe, or a flush in progress
            pass
        os.write(2, ('\n' + _stop_line(prog, signal.Signals(signum).name) + '\n').encode())
        release = _loaded('jlearngene.train.workdir_lock', 'release_all')
        if release is not None:   # os._exit runs no `finally`: the workdir's lock goes here
            release()
        os._exit(128 + signum)

    old = {}
    try:
        for name in STOP_SIGNALS:
            old[name] = signal.signal(getattr(signal, name), stop)
    except ValueError:   # not the main thread
        pass
    return old


def _critical(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.CRITICAL


def _quiet_libraries(verbose: bool) -> list:
    """Unless `verbose`, the library loggers pass on CRITICAL records only: a filter on each
    (absl resets its logger's level when a command parses its flags) and the level for
    their child loggers. Returns what to undo."""
    if verbose:
        return []
    undo = []
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        undo.append((logger, logger.level))
        logger.addFilter(_critical)
        logger.setLevel(logging.CRITICAL)
    return undo


def _exit_despite_threads(code: int, grace: float = LINGER_SECONDS) -> None:
    """End the process with `code` when threads it cannot stop outlive `grace` seconds.

    A failed orbax write leaves non-daemon threads that wait for signals the failed
    thread never sends (up to orbax's coordination timeout, per signal); the interpreter
    would wait for them at exit. After a failed command they are abandoned: stdout and
    stderr are flushed and the process exits at once."""
    import threading
    import time
    deadline = time.monotonic() + grace
    for t in threading.enumerate():
        if t is not threading.current_thread() and not t.daemon:
            # Thread.join itself: orbax's threads override it to raise their error
            threading.Thread.join(t, max(deadline - time.monotonic(), 0.0))
    if any(t.is_alive() and not t.daemon for t in threading.enumerate()
           if t is not threading.current_thread()):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def main(argv: list[str] | None = None) -> int:
    """Run the command of `argv` (default the process's command line). As the process's
    entry point (no `argv`) the signal handlers and quiet loggers stay in place through the
    interpreter's exit, where orbax's threads may still report a failed write, and a failed
    command does not wait for the threads a failed write left (`_exit_despite_threads`);
    called with `argv` (in-process), they are put back on return."""
    code = _main(argv)
    if argv is None and code:
        _exit_despite_threads(code)
    return code


def _main(argv: list[str] | None) -> int:
    entry_point = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    verbose = VERBOSE_FLAG in argv or os.environ.get(TRACEBACK_ENV, '') not in ('', '0')
    argv = [a for a in argv if a != VERBOSE_FLAG]
    if not argv or argv[0] in ('-h', '--help', 'help'):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f'jlearngene: unknown command {name!r}\n\n{_usage()}', file=sys.stderr)
        return 2
    prog = f'jlearngene {name}'
    handlers, levels = _stop_on_signal(prog), _quiet_libraries(verbose)
    try:
        try:
            module = importlib.import_module(f'jlearngene.commands.{name}')
        except ModuleNotFoundError as e:
            if e.name == f'jlearngene.commands.{name}':
                print(f'jlearngene: command {name!r} is not available in this build', file=sys.stderr)
                return 2
            raise
        return int(module.main(rest) or 0)
    except KeyboardInterrupt:
        if verbose:
            traceback.print_exc()
        print(f'\n{_stop_line(prog, "SIGINT")}', file=sys.stderr)
        return 130
    except SystemExit as e:
        preempted = _loaded('jlearngene.train.hooks', 'Preempted')
        if preempted is not None and isinstance(e, preempted):
            print(f'{prog}: {e}; run the same command again to resume', file=sys.stderr)
            return int(e.code)
        raise
    except BrokenPipeError as e:
        if not _stdout_closed():
            return _error_exit(prog, e, verbose)
        return 128 + signal.SIGPIPE   # `jlearngene info | head`: the reader stopped reading
    except Exception as e:  # noqa: BLE001 - the one place that turns errors into messages
        return _error_exit(prog, e, verbose)
    finally:
        if entry_point:
            handlers, levels = {}, []
        for sig, handler in handlers.items():
            signal.signal(getattr(signal, sig), signal.SIG_DFL if handler is None else handler)
        for logger, level in levels:
            logger.removeFilter(_critical)
            logger.setLevel(level)


def _stdout_closed() -> bool:
    """Whether stdout is a pipe whose reader has gone (`poll` reports an error on its write
    end); if so it is pointed at /dev/null, so that the interpreter's last flush at exit
    does not fail again."""
    try:
        fd = sys.stdout.fileno()
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        if not any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0)):
            return False
        os.dup2(os.open(os.devnull, os.O_WRONLY), fd)
        return True
    except (OSError, ValueError, AttributeError):   # no descriptor (in-process callers), no poll
        return False


def _error_exit(prog: str, e: Exception, verbose: bool) -> int:
    """One line on stderr for an expected error (its traceback too with --verbose), the
    traceback and a bug line for any other; the exit code."""
    if expected_error(e):
        if verbose:
            traceback.print_exc()
        print(f'{prog}: {_message(e)}', file=sys.stderr)
        return getattr(e, 'exit_code', 1)   # 2: a usage error (commands.config_args.UsageError)
    traceback.print_exc()
    print(f'{prog}: internal error: {type(e).__name__}: {_message(e)} (a bug: please '
          'report it with the traceback above)', file=sys.stderr)
    return 1


if __name__ == '__main__':
    sys.exit(main())
