"""`jlearngene compare [VARIANT] [--workdir DIR] [--config.FIELD=VALUE ...]`: every method and
baseline on one task under the fair protocol (`jlearngene.experiments.compare`).

It is `jlearngene train --config compare:VARIANT --workdir DIR`: the bundled config
jlearngene/experiments/configs/compare.py, whose fields --config.FIELD=VALUE overrides, runs
through the study harness, and the results table and verdicts are printed at the end.

    jlearngene compare                            # the recorded comparison, in workdirs/compare
    jlearngene compare smoke                      # about a minute: the tests' miniature
    jlearngene compare fashion                    # the transfer setting (CPU-hours; Debian's dataset-fashion-mnist)
    jlearngene compare --config.methods="('tleg','ligo')"
    jlearngene compare paper --config.data.data_dir=~/tensorflow_datasets
"""
from __future__ import annotations

HELP = 'every method against a converged Scratch on one task: FLOPs to its accuracy, break-even N'
CONFIG, WORKDIR = 'compare', 'workdirs/compare'
VARIANTS = "digits (default), smoke, paper or fashion, optionally followed by ',quick' (one seed)"


def main(argv: list[str]) -> int:
    """The command: `argv` parsed as the `compare` config's VARIANT and the run flags
    (`train.parse_named`), then run like `jlearngene train` (`train.run`); its exit status."""
    from jlearngene.commands import train
    return train.run(train.parse_named(argv, 'jlearngene compare', CONFIG, WORKDIR, __doc__, VARIANTS))
