"""`jlearngene` / `python -m jlearngene`: one entry point, one module per subcommand.

Each subcommand lives in `jlearngene/commands/<name>.py` and exposes `HELP` (one line) and
`main(argv) -> int`. Modules are imported lazily so `jlearngene info` does not pay for the
trainer's imports.
"""
from __future__ import annotations

import importlib
import sys

COMMANDS = ('demo', 'train', 'eval', 'plot', 'info', 'convert')


def _usage() -> str:
    lines = ['usage: jlearngene <command> [options]   (jlearngene <command> --help for details)', '',
             'commands:']
    for name in COMMANDS:
        try:
            help_line = importlib.import_module(f'jlearngene.commands.{name}').HELP
        except ModuleNotFoundError:
            continue
        lines.append(f'  {name:<9} {help_line}')
    return '\n'.join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ('-h', '--help', 'help'):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f'jlearngene: unknown command {name!r}\n\n{_usage()}', file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(f'jlearngene.commands.{name}')
    except ModuleNotFoundError as e:
        if e.name == f'jlearngene.commands.{name}':
            print(f'jlearngene: command {name!r} is not available in this build', file=sys.stderr)
            return 2
        raise
    return int(module.main(rest) or 0)


if __name__ == '__main__':
    sys.exit(main())
