"""The command line's one flag system: argparse parsers whose errors are exceptions, and the
`--config FILE|NAME[:arg]` / `--config.FIELD=VALUE` overrides of an ml_collections config.

Every command builds its parser as a `Parser`; a usage error raises `UsageError`, which
`jlearngene.cli` reports (`jlearngene <command>: <message>`, status 2) like every other
expected error. `--config` takes a file path or the name of a config bundled with the
package (`jlearngene.experiments.configs`: `--config tleg:smoke`, `--config digits_vit`), so an
installed wheel runs its configs without the source tree. `--config.model.depth=2` sets a
field of the locked config, the text read as the field's type (`configs.load`).
"""
from __future__ import annotations

import argparse
import os


class UsageError(ValueError):
    """A command line that cannot run (an unknown or missing flag, a bad value); status 2."""
    exit_code = 2


class Parser(argparse.ArgumentParser):
    """argparse without abbreviations, whose errors raise `UsageError` (not print and exit)."""

    def __init__(self, prog: str, description: str | None = None, **kwargs):
        kwargs.setdefault('formatter_class', argparse.RawDescriptionHelpFormatter)
        super().__init__(prog=prog, description=description, allow_abbrev=False, **kwargs)

    def error(self, message: str):
        """Raises `UsageError(message)` where argparse would print the usage and exit 2.

        Raises:
            UsageError: always.
        """
        raise UsageError(message)


def dangling_symlink(path: str, what: str) -> str | None:
    """`"<what> 'path' is a dangling symlink to 'target'"` when `path`, or a folder on the way
    to it, is a symbolic link whose target does not exist (open and makedirs would then fail
    with a bare errno far from the cause); else None."""
    parts, prefix = os.path.normpath(path).split(os.sep), ''
    for i, part in enumerate(parts):
        prefix = os.path.join(prefix, part) if prefix else (part or os.sep)
        if os.path.islink(prefix) and not os.path.exists(prefix):
            where = '' if i == len(parts) - 1 else f': {prefix!r}'
            return f'{what} {path!r}{where} is a dangling symlink to {os.readlink(prefix)!r}'
    return None


OVERRIDE_PREFIX = '--config.'


def add_config(p: Parser, *, required: bool = True) -> None:
    """`--config FILE|NAME[:arg]` (overrides: `--config.FIELD=VALUE`)."""
    p.add_argument('--config', required=required, metavar='FILE|NAME[:arg]',
                   help='config file (defining get_config) or bundled config name, optionally '
                        'with :arg; override its fields with --config.FIELD=VALUE')


def parse(p: Parser, argv: list[str]) -> tuple[argparse.Namespace, dict[str, str]]:
    """`p`'s arguments and the `--config.FIELD=VALUE` overrides ({'model.depth': '2'}), in
    order; any other argument `p` does not know is a UsageError."""
    args, rest = p.parse_known_args(list(argv))
    overrides, stray = {}, []
    for a in rest:
        key, sep, value = a[len(OVERRIDE_PREFIX):].partition('=')
        if not a.startswith(OVERRIDE_PREFIX):
            stray.append(a)
        elif not sep or not key:
            raise UsageError(f'{a}: give an override as {OVERRIDE_PREFIX}FIELD=VALUE')
        else:
            overrides[key] = value
    if stray:
        raise UsageError(f'unrecognized arguments: {" ".join(stray)}')
    return args, overrides


def load(spec: str, overrides: dict[str, str]):
    """The locked config `spec` names with the command line's overrides applied (their text
    read as each field's type) and checked (`configs.load`); a config that cannot load is a
    UsageError, reported before anything runs."""
    from jlearngene.experiments import configs
    try:
        return configs.load(spec, overrides, from_text=True)
    except (ValueError, SyntaxError) as e:   # SyntaxError: a config file that does not parse
        raise UsageError(str(e)) from None


def parse_override(text: str):
    """`--set field=value` for argparse: ints, floats and true/false are typed, the rest stay strings."""
    key, sep, value = text.partition('=')
    if not sep:
        raise argparse.ArgumentTypeError(f'override {text!r} is not of the form field=value')
    for cast in (int, float):
        try:
            return key, cast(value)
        except ValueError:
            pass
    return key, {'true': True, 'false': False}.get(value.lower(), value)
