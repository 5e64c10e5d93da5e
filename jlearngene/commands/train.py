"""`jlearngene train --config FILE|NAME[:arg] --workdir DIR [--config.x=y ...]`.

The config's `task` picks what runs: 'classification' (`run.run_classification`, e.g.
`--config digits_vit`) or 'experiment' (`jlearngene.experiments.study.run_experiment`, e.g.
`--config tleg:digits`). NAME is a config bundled with the
package (`jlearngene.experiments.configs.names()`); FILE a path to any config file.

Several processes (hosts of a TPU pod slice, SLURM tasks) run the same command; each joins
jax's distributed runtime first (`jlearngene.distributed.initialize`: from
`--coordinator_address`, `--num_processes`, `--process_id`, else from
JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID, else the cluster jax detects),
reads its own share of the data and trains; process 0 prints and writes the metrics, all
write the checkpoints in --workdir (a directory every host sees).
"""
from __future__ import annotations

import argparse
import os
import time

from jlearngene.commands import config_args
from jlearngene.commands.config_args import UsageError

HELP = 'train or run an experiment from a config (file or bundled name; --config.x=y overrides)'
TASKS = ('classification', 'experiment')


def add_run_flags(p: config_args.Parser, *, workdir: str | None = None) -> None:
    """The flags of a run: --workdir (required unless `workdir` is its default), the progress
    display and the multi-process settings (`jlearngene.distributed`)."""
    p.add_argument('--workdir', required=workdir is None, default=workdir,
                   help='run directory: config.json, metrics, checkpoints'
                        + (' (default %(default)s)' if workdir else ''))
    p.add_argument('--noprogress', dest='progress', action='store_false',
                   help='no progress bar (experiments: only the final table)')
    multi = p.add_argument_group('multi-process runs (default: $JAX_COORDINATOR_ADDRESS / '
                                 '$JAX_NUM_PROCESSES / $JAX_PROCESS_ID, else the cluster jax detects)')
    multi.add_argument('--coordinator_address', metavar='HOST:PORT', help='process 0')
    multi.add_argument('--num_processes', type=int, help='the number of processes')
    multi.add_argument('--process_id', type=int, help='this process, in [0, num_processes)')


def parser(prog: str = 'jlearngene train') -> config_args.Parser:
    """The parser of `jlearngene train`'s flags: the required --config (its
    --config.FIELD=VALUE overrides are left to `config_args.parse`) and the run flags
    (`add_run_flags`); its epilog lists the bundled configs.

    Args:
        prog: the program name its usage and errors show.
    """
    from jlearngene.experiments import configs
    p = config_args.Parser(prog, __doc__, epilog=f'bundled configs (NAME): {", ".join(configs.names())}')
    config_args.add_config(p)
    add_run_flags(p)
    return p


def parse_flags(argv: list[str], prog: str = 'jlearngene train') -> argparse.Namespace:
    """The parsed flags of `jlearngene train` (`.config` the loaded, overridden config)."""
    args, overrides = config_args.parse(parser(prog), argv)
    args.config = config_args.load(args.config, overrides)
    return args


def workdir_problem(workdir: str) -> str | None:
    """Why `workdir` cannot be a run directory (it, or the nearest of its parents that
    exists, is a file; it or a parent is a dangling symlink), or None."""
    dangling = config_args.dangling_symlink(workdir, '--workdir')
    if dangling:
        return dangling
    path = os.path.abspath(workdir)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    if os.path.isdir(path):
        return None
    if path == os.path.abspath(workdir):
        return (f'--workdir {workdir!r} is a file, not a directory (the run writes its config.json, '
                'metrics and checkpoints into a directory)')
    return f'--workdir {workdir!r}: {path!r} is a file, not a directory'


def check_init(config) -> None:
    """`config.init`, when set, names a model checkpoint directory (not a file to convert)."""
    init = config.get('init', '') if hasattr(config, 'get') else ''
    if init:
        from jlearngene.commands.convert import check_model_checkpoint
        check_model_checkpoint(init, '--config.init')


def main(argv: list[str], prog: str = 'jlearngene train') -> int:
    """The command: `argv`'s flags parsed and the config loaded (`parse_flags`), then run
    (`run`); its exit status.

    Args:
        argv: the command line after `train`.
        prog: the program name its usage and errors show.
    """
    return run(parse_flags(argv, prog))


def run(args: argparse.Namespace) -> int:
    """Runs the parsed flags' config (`args.config`, loaded) in `args.workdir`, holding it
    meanwhile (`train.workdir_lock`: a second run there is refused at once)."""
    problem = workdir_problem(args.workdir)
    if problem:
        raise UsageError(problem)
    config = args.config
    task = config.get('task', 'classification')
    if task not in TASKS:
        raise UsageError(f'unknown task {task!r} (known: {", ".join(TASKS)})')
    from jlearngene import distributed
    # before anything uses a jax device
    distributed.initialize(args.coordinator_address, args.num_processes, args.process_id)
    from jlearngene.train.workdir_lock import hold_workdir
    with hold_workdir(args.workdir):   # one run per workdir: a second one is refused at once
        return _run_held(args, config, task)


def _run_held(args: argparse.Namespace, config, task: str) -> int:
    from jlearngene import distributed
    start = time.time()
    check_init(config)
    from jlearngene.commands import run as run_task   # jax, grain: after the flags are parsed
    if task == 'experiment':
        from jlearngene.experiments import harness, study
        if config.get('compile_cache', False):   # process-wide: the command's choice
            run_task.enable_compile_cache(os.path.join(args.workdir, 'jax_cache'))
        results = study.run_experiment(config, args.workdir, quiet=not args.progress)
        if distributed.is_main_process():
            print(harness.summary(results, args.workdir))
        return 0
    _, history = run_task.run_classification(config, args.workdir, progress=args.progress)
    if not distributed.is_main_process():
        return 0
    final = history['eval'][-1] if history['eval'] else {}
    summary = '  '.join(f'{k}={v:.4f}' for k, v in final.items() if k != 'step')
    model = os.path.join(args.workdir, 'model')
    if history.get('finished_before'):
        print(f'already finished: {config.steps} steps in {args.workdir}; its last evaluation '
              f'{summary or "none"}; its model is {model}')
        return 0
    print(f'done in {time.time() - start:.1f}s; {summary}; model saved to {model}')
    return 0


def parse_named(argv: list[str], prog: str, config: str, workdir: str, doc: str,
                variants: str) -> argparse.Namespace:
    """The flags of a command that is one bundled config (`jlearngene compare`):
    `train`'s, with the config's argument as the positional VARIANT (`variants` says which)
    instead of --config, and --workdir defaulting to `workdir`."""
    p = config_args.Parser(prog, doc)
    p.add_argument('variant', nargs='?', default='', metavar='VARIANT',
                   help=f'the {config} config\'s argument: {variants}')
    add_run_flags(p, workdir=workdir)
    args, overrides = config_args.parse(p, argv)
    args.config = config_args.load(f'{config}:{args.variant}' if args.variant else config, overrides)
    return args
