"""`jlearngene demo`: the TLEG study on the bundled digits, from the package.

Scratch at every descendant depth (lr sweep, trained to its plateau; the depth-6 run is the
teacher), TLEG and Share-Init genes learned through an Aux-Net by soft distillation,
descendants of depth 2/3/4/6 tuned 0.35·S next to He-LG and Pre-Fin, for three seeds; prints
the results table and the paper claims' verdicts at the end (about 25 minutes on 2 CPU cores;
`--quick`: one seed). It is `jlearngene train --config tleg:SCALE --workdir DIR` with the
flags below turned into config overrides (`--config.x=y` overrides are accepted as well); the
config is the bundled jlearngene/experiments/configs/tleg.py.
"""
from __future__ import annotations

import argparse

HELP = 'TLEG study on the bundled digits: converged Scratch, gene, descendants of 4 depths, verdicts'

# demo flag -> the config field it sets
_FIELDS = {'variant': 'model.variant', 'data_dir': 'data.data_dir', 'tfds_name': 'data.tfds_name'}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog='jlearngene demo', description=__doc__.split('\n\n')[0],
        epilog='Any --config.FIELD=VALUE override of the tleg config is passed through.',
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--workdir', default='workdirs/demo', help='output folder (default %(default)s)')
    p.add_argument('--scale', default='digits', choices=('digits', 'smoke', 'paper'))
    p.add_argument('--quick', action='store_true', help='one seed (a pipeline check, not a result)')
    p.add_argument('--seeds', help='comma-separated seeds, e.g. 3,4,5 (default 0,1,2)')
    p.add_argument('--variant', choices=('Ti', 'S', 'B'), help="paper scale: DeiT width (default 'S')")
    p.add_argument('--data-dir', help='paper scale: tfds data_dir holding the prepared dataset')
    p.add_argument('--tfds-name', help="paper scale: tfds dataset name (default 'imagenet2012')")
    p.add_argument('--official-pool-order', action='store_true',
                   help='descendants pool LN(mean(x)) as the official TLEG Des-Net (fc_norm)')
    p.add_argument('--quiet', action='store_true', help='print only the final table')
    return p


def train_argv(argv: list[str]) -> list[str]:
    """The `jlearngene train` arguments that the demo's `argv` stands for."""
    p = parser()
    args, rest = p.parse_known_args(list(argv))
    stray = [a for a in rest if not a.startswith('--config.')]
    if stray:
        p.error(f'unrecognized arguments: {" ".join(stray)}')
    out = ['--config', 'tleg:' + args.scale + (',quick' if args.quick else ''),
           '--workdir', args.workdir]
    out += [f'--config.{field}={getattr(args, flag)}' for flag, field in _FIELDS.items()
            if getattr(args, flag) is not None]
    if args.official_pool_order:
        out.append('--config.descend.official_pool_order=true')
    if args.quiet:
        out.append('--noprogress')
    if args.seeds is not None:
        try:
            seeds = tuple(int(s) for s in args.seeds.split(','))
        except ValueError:
            p.error(f'--seeds {args.seeds!r}: expected comma-separated integers, e.g. 0,1,2')
        out.append('--config.seeds=' + repr(seeds).replace(' ', ''))
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
