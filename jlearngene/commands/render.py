"""`jlearngene render DIR [--out DIR]`: a recorded study's tables, verdicts and plot again,
from its results.json alone (nothing is trained); with --out, a read-only record renders
into another folder. `jlearngene render --headline DIR [DIR ...] [--out DIR]` prints the
headline table of transfer-study records (`experiments.headline`) instead, and with --out
writes it to headline.md there."""
from __future__ import annotations

import argparse
import os

HEADLINE = 'headline.md'   # the headline table's file in --out
RESULTS = 'results.json'   # a study's record, in its folder
HELP = "re-render a recorded study's results.md, verdicts and plot from its results.json"


def check_record(workdir: str) -> None:
    """One line for a folder with no study record to render, instead of open's bare errno:
    it does not exist, is a file, is a training workdir, or is a study's (or demo's) workdir
    that has not finished. A folder with results.json passes (`results.read` checks it)."""
    from jlearngene.commands.config_args import dangling_symlink
    if os.path.lexists(os.path.join(workdir, RESULTS)):
        return
    dangling = dangling_symlink(workdir, 'study folder')
    if dangling:
        raise FileNotFoundError(dangling)
    if not os.path.exists(workdir):
        raise FileNotFoundError(f'{workdir!r} does not exist')
    if not os.path.isdir(workdir):
        hint = '; give the folder that holds it' if os.path.basename(workdir) == RESULTS else ''
        raise NotADirectoryError(f"{workdir!r} is a file, not a study's folder (which holds "
                                 f'{RESULTS}){hint}')
    if all(os.path.isfile(os.path.join(workdir, f)) for f in ('config.json', 'metrics.jsonl')):
        raise ValueError(f'{workdir!r} is a training workdir, not a study: it has no {RESULTS} to '
                         f'render (`jlearngene info {workdir}` describes its run)')
    from jlearngene.experiments.harness import holds_study_runs
    if holds_study_runs(workdir):
        raise ValueError(f"{workdir!r} is a study's workdir that has not finished: no {RESULTS} "
                         f'yet (`jlearngene info {workdir}` tells where it stands)')
    raise FileNotFoundError(f"{workdir!r} holds no {RESULTS}: not a study's folder")


def main(argv: list[str]) -> int:
    """The command: with --headline, prints the headline table of the folders' records
    (`headline.table`) and writes it to --out/headline.md when --out is given; else
    re-renders the one study folder's results from its results.json (`study.render`, into
    --out when given) and prints their summary. Exit status 0; several folders without
    --headline are argparse's usage error (status 2); a folder without results.json is a
    one-line error (`check_record`), before anything is read."""
    parser = argparse.ArgumentParser(prog='jlearngene render', description=__doc__)
    parser.add_argument('workdir', nargs='+', help="the study's folder (holds results.json)")
    parser.add_argument('--out', default=None, help='write results.md and the plot here instead '
                        '(with --headline: headline.md)')
    parser.add_argument('--headline', action='store_true',
                        help='print the headline table of these transfer-study records')
    args = parser.parse_args(argv)
    if not args.headline and len(args.workdir) != 1:
        parser.error('give one study folder (several only with --headline)')
    for workdir in args.workdir:
        check_record(workdir)
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
    from jlearngene.experiments import harness, study
    results = study.render(args.workdir[0], args.out)
    print(harness.summary(results, args.out or args.workdir[0]))
    return 0
