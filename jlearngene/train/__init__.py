"""Training engine: losses, optimiser from config, orbax checkpoints, metrics, one
`evaluate` and the generic `fit(loss_fn, trainable, data, optimizer, ...)` (see `trainer`).

The package attribute `evaluate` is the function (`from jlearngene.train.evaluate import
evaluate` names the same one)."""
from jlearngene.train import checkpoint, losses, metrics, optim, tasks, trainer
from jlearngene.train.checkpoint import CheckpointError, RunCheckpointer, load_model, save_model
from jlearngene.train.evaluate import evaluate
from jlearngene.train.optim import make_optimizer
from jlearngene.train.trainer import NonFiniteLossError, Preempted, fit, init_state, make_train_step

__all__ = ['checkpoint', 'losses', 'metrics', 'optim', 'tasks', 'trainer', 'CheckpointError',
           'RunCheckpointer', 'load_model', 'save_model', 'evaluate', 'make_optimizer',
           'NonFiniteLossError', 'Preempted', 'fit', 'init_state', 'make_train_step']
