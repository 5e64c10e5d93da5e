"""`jlearngene demo`: the TLEG learngene demo on the bundled digits (experiments/tleg/run.py).

Trains a teacher, learns a TLEG gene through an Aux-Net by soft distillation, initialises
descendants of depth 2/3/4/6 and fine-tunes them next to Scratch, Share-Init and He-LG at
the same budget; prints the results table at the end (about 3.5 min wall on 2 CPU cores).
"""
from __future__ import annotations

import importlib.util
import os
import sys

HELP = 'TLEG learngene demo on the bundled digits: gene, descendants of 4 depths, baselines, table'

_SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                       'experiments', 'tleg', 'run.py')


def load_experiment(path: str = _SCRIPT):
    """Import experiments/tleg/run.py (it ships with the source tree, not inside the package)."""
    if not os.path.exists(path):
        raise FileNotFoundError(
            f'jlearngene demo needs the experiment script {path}, which ships with the source '
            'tree; install from a checkout (pip install -e .) or run that script directly')
    spec = importlib.util.spec_from_file_location('jlearngene_experiments_tleg', path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main(argv: list[str]) -> int:
    return load_experiment().main(list(argv), prog='jlearngene demo', workdir='workdirs/demo')
