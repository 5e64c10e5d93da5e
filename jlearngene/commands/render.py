"""`jlearngene render DIR [--out DIR]`: a recorded study's tables, verdicts and plot again,
from its results.json alone (nothing is trained); with --out, a read-only record renders
into another folder. `jlearngene render --headline DIR [DIR ...]` prints the headline table
of transfer-study records (`experiments.headline`) instead."""
from __future__ import annotations

import argparse

HELP = "re-render a recorded study's results.md, verdicts and plot from its results.json"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog='jlearngene render', description=__doc__)
    parser.add_argument('workdir', nargs='+', help="the study's folder (holds results.json)")
    parser.add_argument('--out', default=None, help='write results.md and the plot here instead')
    parser.add_argument('--headline', action='store_true',
                        help='print the headline table of these transfer-study records')
    args = parser.parse_args(argv)
    if args.headline:
        from jlearngene.experiments import headline
        print(headline.table(args.workdir))
        return 0
    if len(args.workdir) != 1:
        parser.error('give one study folder (several only with --headline)')
    from jlearngene.experiments import harness, study
    results = study.render(args.workdir[0], args.out)
    print(harness.summary(results, args.out or args.workdir[0]))
    return 0
