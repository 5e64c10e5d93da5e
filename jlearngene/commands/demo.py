"""`jlearngene demo [VARIANT] [--workdir DIR] [--config.FIELD=VALUE ...]`: the TLEG study
on the bundled digits, from the package.

Scratch at every descendant depth (lr sweep, trained to its plateau; the depth-6 run is the
teacher), TLEG and Share-Init genes learned through an Aux-Net by soft distillation,
descendants of depth 2/3/4/6 tuned 0.35·S next to He-LG and Pre-Fin, for three seeds; prints
the results table and the paper claims' verdicts at the end (about 25 minutes on 2 CPU
cores). It is `jlearngene train --config tleg:VARIANT --workdir DIR`: the bundled config
jlearngene/experiments/configs/tleg.py, whose fields --config.FIELD=VALUE overrides.

    jlearngene demo                               # the study, 3 seeds, in workdirs/demo
    jlearngene demo quick                         # one seed: a pipeline check, not a result
    jlearngene demo smoke --noprogress            # seconds: the tests' miniature, only the table
    jlearngene demo --config.seeds=3,4,5          # other seeds
    jlearngene demo --config.descend.official_pool_order=true   # the official Des-Net pooling
    jlearngene demo paper --config.data.data_dir=~/tensorflow_datasets --config.model.variant=B
"""
from __future__ import annotations

HELP = 'TLEG study on the bundled digits: converged Scratch, gene, descendants of 4 depths, verdicts'
CONFIG, WORKDIR = 'tleg', 'workdirs/demo'
VARIANTS = "digits (default), smoke or paper, optionally followed by ',quick' (one seed), e.g. quick"


def main(argv: list[str]) -> int:
    import os
    import sys

    from jlearngene.commands import train
    args = train.parse_named(argv, 'jlearngene demo', CONFIG, WORKDIR, __doc__, VARIANTS)
    print(f'jlearngene demo: writing checkpoints, metrics, plots and results (tens of MB) to '
          f'{os.path.abspath(args.workdir)}; choose the folder with --workdir DIR', file=sys.stderr)
    return train.run(args)
