"""`jlearngene render DIR [--out DIR]`: a recorded study's tables, verdicts and plot again,
from its results.json alone (nothing is trained); with --out, a read-only record renders
into another folder."""
from __future__ import annotations

import argparse

HELP = "re-render a recorded study's results.md, verdicts and plot from its results.json"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog='jlearngene render', description=__doc__)
    parser.add_argument('workdir', help="the study's folder (holds results.json)")
    parser.add_argument('--out', default=None, help='write results.md and the plot here instead')
    args = parser.parse_args(argv)
    from jlearngene.experiments import harness, study
    results = study.render(args.workdir, args.out)
    print(harness.summary(results, args.out or args.workdir))
    return 0
