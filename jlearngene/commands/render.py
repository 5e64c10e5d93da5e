"""`jlearngene render DIR [--out DIR]`: a recorded study's tables, verdicts and plot again,
from its results.json alone (nothing is trained); with --out, a read-only record renders
into another folder. `jlearngene render --headline DIR [DIR ...] [--out DIR]` prints the
headline table of transfer-study records (`experiments.headline`) instead, and with --out
writes it to headline.md there."""
from __future__ import annotations

import argparse
import os

HEADLINE = 'headline.md'   # the headline table's file in --out
HELP = "re-render a recorded study's results.md, verdicts and plot from its results.json"


def main(argv: list[str]) -> int:
    """The command: with --headline, prints the headline table of the folders' records
    (`headline.table`) and writes it to --out/headline.md when --out is given; else
    re-renders the one study folder's results from its results.json (`study.render`, into
    --out when given) and prints their summary. Exit status 0; several folders without
    --headline are argparse's usage error (status 2)."""
    parser = argparse.ArgumentParser(prog='jlearngene render', description=__doc__)
    parser.add_argument('workdir', nargs='+', help="the study's folder (holds results.json)")
    parser.add_argument('--out', default=None, help='write results.md and the plot here instead '
                        '(with --headline: headline.md)')
    parser.add_argument('--headline', action='store_true',
                        help='print the headline table of these transfer-study records')
    args = parser.parse_args(argv)
    if args.headline:
        from jlearngene.experiments import headline
        table = headline.table(args.workdir)
        print(table)
        if args.out is not None:
            from jlearngene.train import files
            os.makedirs(args.out, exist_ok=True)
            written = files.write_text(os.path.join(args.out, HEADLINE), table + '\n')
            print(f'\nwrote {written}')
        return 0
    if len(args.workdir) != 1:
        parser.error('give one study folder (several only with --headline)')
    from jlearngene.experiments import harness, study
    results = study.render(args.workdir[0], args.out)
    print(harness.summary(results, args.out or args.workdir[0]))
    return 0
