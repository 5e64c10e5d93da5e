"""`jlearngene train --config FILE|NAME[:arg] --workdir DIR [--config.x=y ...]`.

The config's `task` picks what runs: 'classification' (`tasks.run_classification`, e.g.
`--config digits_vit`) or 'experiment' (`jlearngene.experiments.harness.run`, e.g.
`--config tleg:digits`, which `jlearngene demo` runs). NAME is a config bundled with the
package (`jlearngene.experiments.configs.names()`); FILE a path to any config file.

Several processes (hosts of a TPU pod slice, SLURM tasks) run the same command; each joins
jax's distributed runtime first (`jlearngene.distributed.initialize`: from
`--coordinator_address`, `--num_processes`, `--process_id`, else from
JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID, SLURM or the TPU metadata),
reads its own share of the data and trains; process 0 prints and writes the metrics, all
write the checkpoints in --workdir (a directory every host sees).
"""
from __future__ import annotations

import os
import sys
import time

from absl import flags

from jlearngene.commands import config_args

HELP = 'train or run an experiment from a config (file or bundled name; --config.x=y overrides)'
TASKS = ('classification', 'experiment')


def _flags(fv):
    flags.DEFINE_string('workdir', None, 'run directory (metrics, checkpoints, config.json)', flag_values=fv)
    flags.DEFINE_bool('progress', True, 'show a progress bar (experiments: one line per run)',
                      flag_values=fv)
    flags.DEFINE_string('coordinator_address', None, 'multi-process runs: host:port of process 0 '
                        '(default: $JAX_COORDINATOR_ADDRESS, SLURM or TPU detection)', flag_values=fv)
    flags.DEFINE_integer('num_processes', None, 'multi-process runs: the number of processes '
                         '(default: $JAX_NUM_PROCESSES, SLURM or TPU detection)', flag_values=fv)
    flags.DEFINE_integer('process_id', None, 'multi-process runs: this process, in '
                         '[0, num_processes) (default: $JAX_PROCESS_ID, SLURM or TPU detection)',
                         flag_values=fv)


def parse_flags(argv: list[str], prog: str = 'jlearngene train'):
    """The parsed flags of `jlearngene train` (`fv.config` the loaded, overridden config)."""
    return config_args.parse(prog, argv, _flags)


def workdir_problem(workdir: str) -> str | None:
    """Why `workdir` cannot be a run directory (it, or the nearest of its parents that
    exists, is a file), or None."""
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
    fv = parse_flags(argv, prog)
    if not fv.workdir:
        print(f'{prog}: --workdir is required', file=sys.stderr)
        return 2
    problem = workdir_problem(fv.workdir)
    if problem:
        print(f'{prog}: {problem}', file=sys.stderr)
        return 2
    config = fv.config
    task = config.get('task', 'classification')
    if task not in TASKS:
        print(f'{prog}: unknown task {task!r} (known: {", ".join(TASKS)})', file=sys.stderr)
        return 2
    from jlearngene import distributed
    try:   # before anything uses a jax device
        distributed.initialize(fv.coordinator_address, fv.num_processes, fv.process_id)
    except distributed.DistributedError as e:
        print(f'{prog}: {e}', file=sys.stderr)
        return 2
    from jlearngene.train.checkpoint import CheckpointError
    from jlearngene.train.trainer import NonFiniteLossError
    start = time.time()
    try:
        check_init(config)
        if task == 'experiment':
            from jlearngene.experiments import harness
            results = harness.run(config, fv.workdir, quiet=not fv.progress)
            if distributed.is_main_process():
                print(harness.summary(results, fv.workdir))
            return 0
        from jlearngene.train import tasks
        _, history = tasks.run_classification(config, fv.workdir, progress=fv.progress)
    except (ValueError, KeyError, CheckpointError, NonFiniteLossError) as e:
        print(f'{prog}: {e}', file=sys.stderr)
        return 1
    if not distributed.is_main_process():
        return 0
    final = history['eval'][-1] if history['eval'] else {}
    summary = '  '.join(f'{k}={v:.4f}' for k, v in final.items() if k != 'step')
    print(f'done in {time.time() - start:.1f}s; {summary}; model saved to {os.path.join(fv.workdir, "model")}')
    return 0
