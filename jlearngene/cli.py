"""`jlearngene` / `python -m jlearngene`: one entry point, one module per subcommand.

Each subcommand lives in `jlearngene/commands/<name>.py` and exposes `HELP` (one line) and
`main(argv) -> int`. Modules are imported lazily so `jlearngene info` does not pay for the
trainer's imports.

Errors are reported here, once for every command: an expected error (`expected_error`: a
bad config, file, data set, gene or checkpoint, a non-finite loss, a missing optional
package) is one line `jlearngene <command>: <message>` on stderr and exit status 1; the
traceback follows only with `--verbose` (anywhere on the command line) or
`JLEARNGENE_TRACEBACK=1`. Any other exception is a bug: its traceback is printed, then
the same one line marked as an internal error. Ctrl-C during training saves a checkpoint
like SIGTERM does (`train.trainer.Preemption`) and names it; elsewhere it stops with one
line and status 130.
"""
from __future__ import annotations

import importlib
import os
import sys
import traceback

COMMANDS = ('demo', 'train', 'compare', 'eval', 'plot', 'info', 'convert', 'gene', 'descend')
TRACEBACK_ENV = 'JLEARNGENE_TRACEBACK'
VERBOSE_FLAG = '--verbose'


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
    kinds += [k for k in (_loaded('jlearngene.train.checkpoint', 'CheckpointError'),
                          _loaded('jlearngene.train.trainer', 'NonFiniteLossError')) if k]
    return isinstance(e, tuple(kinds))


def _message(e: BaseException) -> str:
    text = str(e).strip()
    if isinstance(e, KeyError) and e.args:   # str() of a KeyError is the key's repr
        text = str(e.args[0])
    return text or type(e).__name__


def main(argv: list[str] | None = None) -> int:
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
        print(f'\n{prog}: interrupted (Ctrl-C); a training run keeps its last checkpoint and '
              'resumes from it when run again', file=sys.stderr)
        return 130
    except SystemExit as e:
        preempted = _loaded('jlearngene.train.trainer', 'Preempted')
        if preempted is not None and isinstance(e, preempted):
            print(f'{prog}: {e}; run the same command again to resume', file=sys.stderr)
            return int(e.code)
        raise
    except Exception as e:  # noqa: BLE001 - the one place that turns errors into messages
        if expected_error(e):
            if verbose:
                traceback.print_exc()
            print(f'{prog}: {_message(e)}', file=sys.stderr)
        else:
            traceback.print_exc()
            print(f'{prog}: internal error: {type(e).__name__}: {_message(e)} (a bug: please '
                  'report it with the traceback above)', file=sys.stderr)
        return 1


if __name__ == '__main__':
    sys.exit(main())
