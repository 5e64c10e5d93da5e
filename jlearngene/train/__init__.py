"""Training engine: task losses, optimiser from config, orbax checkpoints, metrics, one
`evaluate` and the generic `fit(loss_fn, trainable, data, optimizer, config, hooks)` (see
`trainer`). It imports no method (`genes`), experiment or command.

The package attribute `evaluate` is the function (`from jlearngene.train.evaluate import
evaluate` names the same one)."""
from jlearngene.train import checkpoint, metrics, optim, tasks, trainer
from jlearngene.train.checkpoint import CheckpointError, RunCheckpointer, load_model, save_model
from jlearngene.train.evaluate import evaluate
from jlearngene.train.optim import make_optimizer
from jlearngene.train.trainer import (Evaluation, FitConfig, Hook, NonFiniteLossError, Preempted,
                                      StopWhen, fit, init_state, make_train_step)

__all__ = ['checkpoint', 'metrics', 'optim', 'tasks', 'trainer', 'CheckpointError',
           'RunCheckpointer', 'load_model', 'save_model', 'evaluate', 'make_optimizer',
           'Evaluation', 'FitConfig', 'Hook', 'NonFiniteLossError', 'Preempted', 'StopWhen', 'fit',
           'init_state', 'make_train_step']
