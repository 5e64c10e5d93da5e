"""Bundled ml_collections config files: `get_config(arg)` per file, one file per experiment.

They ship inside the package, so an installed wheel can run them by name::

    jlearngene train --config digits_vit --workdir DIR          # this folder's digits_vit.py
    jlearngene train --config tleg:smoke --workdir DIR          # tleg.py, get_config('smoke')
    jlearngene train --config path/to/my_config.py:arg ...      # any file path works too

`resolve(spec)` turns a bundled name into its file path (a path that exists is kept), `load`
returns the locked ConfigDict with overrides applied, `names()` lists the bundled configs.
"""
from __future__ import annotations

import importlib.util
import os
from typing import Any, Mapping

import ml_collections

_HERE = os.path.dirname(os.path.abspath(__file__))


def names() -> tuple[str, ...]:
    """The bundled config names (the .py files of this folder)."""
    return tuple(sorted(f[:-3] for f in os.listdir(_HERE)
                        if f.endswith('.py') and not f.startswith('_')))


def split(spec: str) -> tuple[str, str | None]:
    """'name_or_path[:arg]' -> (name_or_path, arg or None)."""
    where, sep, arg = spec.partition(':')
    return where, (arg if sep else None)


def path(name: str) -> str:
    """The file of the bundled config `name`; a clear error for an unknown name."""
    if name not in names():
        raise ValueError(f'no config file or bundled config {name!r}; bundled: '
                         f'{", ".join(names())} (or give the path of a .py file)')
    return os.path.join(_HERE, name + '.py')


def resolve(spec: str) -> str:
    """'NAME[:arg]' of a bundled config -> '/its/file.py[:arg]'; an existing file path (or
    anything ending in .py, left for the loader to report) is returned unchanged."""
    where, arg = split(spec)
    if os.path.exists(where) or where.endswith('.py'):
        return spec
    return path(where) + ('' if arg is None else ':' + arg)


def load(spec: str, overrides: Mapping[str, Any] | None = None) -> ml_collections.ConfigDict:
    """The locked ConfigDict of `spec` ('tleg:smoke', 'digits_vit', 'file.py:arg') with
    dotted-key `overrides` ({'descend.steps': 10}) applied; a misspelt key is an error."""
    where, arg = split(resolve(spec))
    if not os.path.exists(where):
        raise ValueError(f'config file {where!r} does not exist')
    module_spec = importlib.util.spec_from_file_location(
        f'_jlearngene_config_{os.path.basename(where)[:-3]}', where)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    if not hasattr(module, 'get_config'):
        raise ValueError(f'config file {where!r} defines no get_config(arg)')
    config = module.get_config(arg) if arg is not None else module.get_config()
    config.lock()
    for key, value in (overrides or {}).items():
        node = config
        for part in key.split('.')[:-1]:
            if part not in node:
                raise ValueError(f'the config has no field {key!r} to override')
            node = node[part]
        leaf = key.split('.')[-1]
        if leaf not in node:
            raise ValueError(f'the config has no field {key!r} to override')
        node[leaf] = value
    return config


def parse_arg(arg: str | None, choices: tuple[str, ...], flags: tuple[str, ...] = ()) -> tuple[str, set[str]]:
    """A config's `arg` 'choice[,flag...]' (e.g. 'digits,quick') -> (choice, {flags}); the
    first of `choices` when `arg` is empty. Unknown items are a one-line error."""
    items = [a.strip() for a in (arg or '').split(',') if a.strip()]
    picked = [a for a in items if a in choices]
    unknown = [a for a in items if a not in choices and a not in flags]
    if unknown or len(picked) > 1:
        bad = unknown[0] if unknown else ','.join(picked)
        raise ValueError(f'unknown config argument {bad!r}: expected one of {", ".join(choices)}'
                         + (', optionally followed by ' + ', '.join(',' + f for f in flags)
                            if flags else ''))
    return (picked[0] if picked else choices[0]), set(items) - set(picked)
