"""`jlearngene train --config experiments/configs/digits_vit.py --workdir DIR [--config.x=y]`."""
from __future__ import annotations

import os
import time

from absl import flags

from jlearngene.commands import _config

HELP = 'train from an ml_collections config file (--config.x=y overrides; resumes in WORKDIR)'


def _flags(fv):
    flags.DEFINE_string('workdir', None, 'run directory (metrics, checkpoints, config.json)', flag_values=fv)
    flags.DEFINE_bool('progress', True, 'show a progress bar', flag_values=fv)


def main(argv: list[str]) -> int:
    fv = _config.parse('jlearngene train', argv, _flags)
    if not fv.workdir:
        print('jlearngene train: --workdir is required')
        return 2
    config = fv.config
    task = config.get('task', 'classification')
    if task != 'classification':
        print(f'jlearngene train: unknown task {task!r} (known: classification)')
        return 2
    from jlearngene.train import tasks
    from jlearngene.train.checkpoint import CheckpointError
    from jlearngene.train.trainer import NonFiniteLossError
    start = time.time()
    try:
        _, history = tasks.run_classification(config, fv.workdir, progress=fv.progress)
    except (ValueError, KeyError, CheckpointError, NonFiniteLossError) as e:
        print(f'jlearngene train: {type(e).__name__}: {e}')
        return 1
    final = history['eval'][-1] if history['eval'] else {}
    summary = '  '.join(f'{k}={v:.4f}' for k, v in final.items() if k != 'step')
    print(f'done in {time.time() - start:.1f}s; {summary}; model saved to {os.path.join(fv.workdir, "model")}')
    return 0
