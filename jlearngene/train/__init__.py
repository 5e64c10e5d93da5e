"""Training engine: task losses, optimiser from config, orbax checkpoints (model artefacts in
`checkpoint`, run checkpoints in `run_checkpoint`, damage checks in `integrity`), metrics,
one `evaluate` and the generic `fit(loss_fn, trainable, data, optimizer, config, hooks)`
(`trainer`, over `state`, `step` and `hooks`). It imports no method (`genes`), experiment
or command.

The package attribute `evaluate` is the function (`from jlearngene.train.evaluate import
evaluate` names the same one)."""
from jlearngene.train import (checkpoint, hooks, integrity, metrics, optim, run_checkpoint, state,
                              step, tasks, trainer)
from jlearngene.train.checkpoint import load_model, save_model
from jlearngene.train.evaluate import evaluate
from jlearngene.train.hooks import Evaluation, Hook, NonFiniteLossError, Preempted, StopWhen
from jlearngene.train.integrity import CheckpointError
from jlearngene.train.optim import make_optimizer
from jlearngene.train.run_checkpoint import RunCheckpointer
from jlearngene.train.state import init_state
from jlearngene.train.step import make_train_step
from jlearngene.train.trainer import FitConfig, fit

__all__ = ['checkpoint', 'hooks', 'integrity', 'metrics', 'optim', 'run_checkpoint', 'state',
           'step', 'tasks', 'trainer', 'CheckpointError', 'RunCheckpointer', 'load_model',
           'save_model', 'evaluate', 'make_optimizer', 'Evaluation', 'FitConfig', 'Hook',
           'NonFiniteLossError', 'Preempted', 'StopWhen', 'fit', 'init_state', 'make_train_step']
