"""Shared flag parsing for commands that take an ml_collections config file.

`--config` takes a file path or the name of a config bundled with the package
(`jlearngene.experiments.configs`: `--config tleg:smoke`, `--config digits_vit`), so an
installed wheel runs its configs without the source tree."""
from __future__ import annotations

import argparse
import sys

from absl import flags
from ml_collections import config_flags


def parse(prog: str, argv: list[str], define_extra=None, *, config_required: bool = True):
    """Parse `--config file.py|NAME[:arg] --config.x=y ... --other flags` with a locked config
    (a misspelt override is an error). Returns the absl FlagValues, or exits on --help."""
    try:
        argv = [prog] + resolve_config_arg(list(argv))
    except ValueError as e:
        print(f'{prog}: {e}', file=sys.stderr)
        raise SystemExit(2) from None
    fv = flags.FlagValues()
    config_flags.DEFINE_config_file('config', None, 'experiment config file (get_config) or '
                                    'bundled config name, optionally with :arg', flag_values=fv, lock_config=True,
                                    sys_argv=argv)
    if define_extra:
        define_extra(fv)
    if any(a in ('-h', '--help', '-help', '--helpshort') for a in argv[1:]):
        from jlearngene.experiments import configs
        print(f'usage: {prog} --config FILE|NAME[:arg] [--config.key=value ...] [flags]\n\n'
              f'bundled configs (NAME): {", ".join(configs.names())}\n\n{fv.get_help()}')
        raise SystemExit(0)
    try:
        fv(argv)
    except (flags.Error, AttributeError, KeyError, ValueError, TypeError) as e:
        # A locked ConfigDict's KeyError (str() is a repr) surfaces wrapped; show its message.
        key_error = next((c for c in (e, e.__cause__, e.__context__) if isinstance(c, KeyError)), None)
        message = key_error.args[0] if key_error is not None and key_error.args else e
        key = message.strip("'") if isinstance(message, str) else ''
        if key.isidentifier():   # a bare key name: no such field, and no close match
            message = (f'the config has no field {key!r} to override (overrides can only '
                       'change fields that the config file defines)')
        print(f'{prog}: {message}', file=sys.stderr)
        raise SystemExit(2) from None
    if config_required and fv.config is None:
        print(f'{prog}: --config is required', file=sys.stderr)
        raise SystemExit(2)
    if fv.config is not None:   # the overridden values, as strictly as the file's (configs.validate)
        from jlearngene.experiments import configs
        try:
            configs.validate(fv.config, template=None)
        except ValueError as e:
            print(f'{prog}: {e}', file=sys.stderr)
            raise SystemExit(2) from None
    return fv


def resolve_config_arg(argv: list[str]) -> list[str]:
    """`argv` with the value of `--config NAME[:arg]` / `--config=NAME[:arg]` turned into the
    bundled config's file path (`configs.resolve`); file paths stay as they are."""
    from jlearngene.experiments import configs
    out = list(argv)
    for i, a in enumerate(out):
        if a in ('--config', '-config') and i + 1 < len(out):
            out[i + 1] = configs.resolve(out[i + 1])
        elif a.startswith(('--config=', '-config=')):
            flag, _, value = a.partition('=')
            out[i] = f'{flag}={configs.resolve(value)}'
    return out


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
