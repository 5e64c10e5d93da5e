"""`jlearngene demo`: the TLEG learngene experiment on the bundled digits, from the package.

Trains a teacher, learns a TLEG gene (and a Share-Init gene) through an Aux-Net by soft
distillation, initialises descendants of depth 2/3/4/6 and fine-tunes them next to Scratch,
Share-Init and He-LG at the same budget; prints the results table at the end (3-7 min wall
on 2 CPU cores). It is `jlearngene train --config tleg:SCALE --workdir DIR` with the flags
below turned into config overrides (`--config.x=y` overrides are accepted as well); the
config is the bundled jlearngene/experiments/configs/tleg.py.
"""
from __future__ import annotations

import argparse

HELP = 'TLEG learngene demo on the bundled digits: gene, descendants of 4 depths, baselines, table'

# demo flag -> the config field it sets
_FIELDS = {'seed': 'seed', 'variant': 'model.variant', 'data_dir': 'data.data_dir',
           'tfds_name': 'data.tfds_name', 'teacher': 'teacher.checkpoint'}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog='jlearngene demo', description=__doc__.split('\n\n')[0],
        epilog='Any --config.FIELD=VALUE override of the tleg config is passed through.',
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--workdir', default='workdirs/demo', help='output folder (default %(default)s)')
    p.add_argument('--scale', default='digits', choices=('digits', 'smoke', 'paper'))
    p.add_argument('--quick', action='store_true',
                   help='half the step budgets (a pipeline check; ~60%% of the time: compiling dominates)')
    p.add_argument('--seed', type=int)
    p.add_argument('--variant', choices=('Ti', 'S', 'B'), help="paper scale: DeiT width (default 'S')")
    p.add_argument('--data-dir', help='paper scale: tfds data_dir holding the prepared dataset')
    p.add_argument('--tfds-name', help="paper scale: tfds dataset name (default 'imagenet2012')")
    p.add_argument('--teacher', help='a jlearngene model artefact to distil from (and inherit He-LG layers)')
    p.add_argument('--official-pool-order', action='store_true',
                   help='descendants pool LN(mean(x)) as the official TLEG Des-Net (fc_norm)')
    p.add_argument('--quiet', action='store_true', help='print only the final table')
    return p


def train_argv(argv: list[str]) -> list[str]:
    """The `jlearngene train` arguments that the demo's `argv` stands for."""
    args, rest = parser().parse_known_args(list(argv))
    stray = [a for a in rest if not a.startswith('--config.')]
    if stray:
        parser().error(f'unrecognized arguments: {" ".join(stray)}')
    out = ['--config', 'tleg:' + args.scale + (',quick' if args.quick else ''),
           '--workdir', args.workdir]
    out += [f'--config.{field}={getattr(args, flag)}' for flag, field in _FIELDS.items()
            if getattr(args, flag) is not None]
    if args.official_pool_order:
        out.append('--config.descend.official_pool_order=true')
    if args.quiet:
        out.append('--noprogress')
    return out + rest


def main(argv: list[str]) -> int:
    import os
    import sys

    from jlearngene.commands import train
    args = train_argv(argv)
    workdir = os.path.abspath(args[args.index('--workdir') + 1])
    print(f'jlearngene demo: writing checkpoints, metrics, plots and results (tens of MB) to '
          f'{workdir}; choose the folder with --workdir DIR', file=sys.stderr)
    return train.main(args, prog='jlearngene demo')
