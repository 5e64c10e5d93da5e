"""`jlearngene compare [--config compare[:digits|smoke|paper]] [--workdir DIR] [--config.x=y ...]`:
every method and baseline on one task under the fair protocol (`jlearngene.experiments.compare`).

It is `jlearngene train --config compare --workdir DIR`: the bundled config
jlearngene/experiments/configs/compare.py (or the one given with --config) runs through the
study harness and the results table and verdicts are printed at the end.
"""
from __future__ import annotations

HELP = 'every method against a converged Scratch on one task: FLOPs to its accuracy, break-even N'


def train_argv(argv: list[str]) -> list[str]:
    """The `jlearngene train` arguments for `argv`: `--config compare` and `--workdir
    workdirs/compare` unless given."""
    argv = list(argv)
    has = lambda flag: any(a == flag or a.startswith(flag + '=') for a in argv)   # noqa: E731
    if not has('--config'):
        argv = ['--config', 'compare'] + argv
    if not has('--workdir'):
        argv += ['--workdir', 'workdirs/compare']
    return argv


def main(argv: list[str]) -> int:
    from jlearngene.commands import train
    return train.main(train_argv(argv), prog='jlearngene compare')
