"""`jlearngene eval --workdir DIR [--checkpoint latest|best|STEP|model] [--split test]`
or `jlearngene eval --model PATH --config FILE`: accuracy of a trained classifier. A saved
model is evaluated as the model config it stores; the config names the data and split."""
from __future__ import annotations

import json
import math
import os

from jlearngene.commands import config_args
from jlearngene.commands.config_args import UsageError

HELP = "evaluate a run's checkpoint (latest, best, a step) or a saved model on a split"


def parser() -> config_args.Parser:
    """The parser of `jlearngene eval`'s flags: --workdir with --checkpoint, or --model,
    --split, and an optional --config (its --config.FIELD=VALUE overrides are left to
    `config_args.parse`)."""
    p = config_args.Parser('jlearngene eval', __doc__)
    p.add_argument('--workdir', help='training workdir (its config.json and checkpoints)')
    p.add_argument('--checkpoint', default='model',
                   help="'model' (WORKDIR/model), 'latest', 'best' or a step (default %(default)s)")
    p.add_argument('--model', help='a model artefact (checkpoint.save_model), evaluated as the model '
                   'config it stores; needs --config for the data')
    p.add_argument('--split', help='split to evaluate (default: the config eval_split)')
    config_args.add_config(p, required=False)
    return p


CHECKPOINTS = ('model', 'latest', 'best')


def check_checkpoint_arg(which: str) -> None:
    """`--checkpoint` is 'model', 'latest', 'best' or a step number."""
    if which not in CHECKPOINTS and not which.isdigit():
        raise ValueError(f"--checkpoint {which!r}: expected 'model' (WORKDIR/model), 'latest', "
                         "'best' or a step number")


def check_workdir(workdir: str) -> None:
    """`--workdir` is an existing directory."""
    dangling = config_args.dangling_symlink(workdir, '--workdir')
    if dangling:
        raise FileNotFoundError(dangling)
    if not os.path.exists(workdir):
        raise FileNotFoundError(f'--workdir {workdir!r} does not exist')
    if not os.path.isdir(workdir):
        raise NotADirectoryError(f'--workdir {workdir!r} is a file, not a training workdir directory')


def _not_a_training_workdir(workdir: str, path: str) -> str:
    """Why `workdir`, which has no `config.json`, is not what `eval --workdir` reads: a
    study's workdir or one of its runs (their accuracies are `jlearngene info`'s), or
    something else."""
    from jlearngene.experiments.harness import FINISHED, PROGRESS, holds_study_runs
    if holds_study_runs(workdir):
        return (f'{workdir} holds the runs of a study (or of jlearngene demo), not one training '
                f'run: `jlearngene info {workdir}` lists them and their accuracies')
    if any(os.path.isfile(os.path.join(workdir, f)) for f in (FINISHED, PROGRESS)):
        study = os.path.dirname(os.path.dirname(os.path.abspath(workdir)))
        return (f'{workdir} is a run of the study in {study}, which keeps its config: '
                f'`jlearngene info {study}` lists this run\'s accuracies')
    return f'{path} not found (not a jlearngene train workdir?)'


def _workdir_config(workdir: str, overrides: dict[str, str]):
    """The training run's `config.json` with the command line's `overrides` applied (a
    misspelt or mistyped field is a UsageError, as for --config)."""
    import ml_collections

    from jlearngene.experiments import configs
    path = os.path.join(workdir, 'config.json')
    if not os.path.exists(path):
        raise FileNotFoundError(_not_a_training_workdir(workdir, path))
    try:
        with open(path, encoding='utf-8') as f:
            config = ml_collections.ConfigDict(json.load(f))
    except ValueError as e:
        raise ValueError(f'{path}: not a JSON config ({e})') from None
    try:
        return configs.override(config, overrides, from_text=True, where=path)
    except ValueError as e:
        raise UsageError(str(e)) from None


def load_params(config, workdir: str | None, which: str, model_path: str | None):
    """Parameters named by the command line, with the model config they belong to: a saved
    model's own (`model_path`; `config.model` where it stores none), else `config.model`.
    From a run checkpoint only the parameters are read (`RunCheckpointer.restore_params`)."""
    import jax

    from jlearngene.models import init, model_config
    from jlearngene.train import checkpoint, integrity, run_checkpoint
    cfg = model_config(config.model)
    if model_path:   # evaluated as it was saved: --config names its data, not its shape
        params, stored, _ = checkpoint.load_model(model_path)
        return params, stored or cfg, model_path
    if which == 'model':
        path = os.path.join(workdir, 'model')
        return checkpoint.load_model(path, expect_cfg=cfg)[0], cfg, path
    check_checkpoint_arg(which)
    directory = os.path.join(workdir, 'checkpoints')
    if not os.path.isdir(directory):   # RunCheckpointer would create it
        raise integrity.CheckpointError(f'{workdir!r} has no checkpoints directory (not a training '
                                        f'workdir?), so --checkpoint {which!r} names nothing')
    target = jax.eval_shape(lambda: init(cfg, jax.random.key(0)))  # a config.init model has this shape too
    with run_checkpoint.RunCheckpointer(directory,
                                        best_metric=config.get('best_metric') or None) as ck:
        step = {'latest': ck.latest_step, 'best': ck.best_step}.get(which, lambda: int(which))()
        if step is None:
            raise integrity.CheckpointError(f'no {which} checkpoint in {ck.directory}')
        if step not in ck.steps():
            have = ', '.join(map(str, ck.steps())) or 'none'
            raise integrity.CheckpointError(f'no checkpoint at step {step} in {ck.directory} '
                                            f'(its steps: {have})')
        params, _ = ck.restore_params(target, step, model_config=cfg)
    return params, cfg, os.path.join(workdir, 'checkpoints', str(step))


def evaluate(config, params, cfg, split: str) -> dict:
    """`train.evaluate` of the classification metrics over `split` -> {'split', 'count',
    'accuracy', 'loss'}.

    Raises:
        ValueError: the data's classes or image shape are not `cfg`'s.
    """
    from jlearngene import data
    from jlearngene.commands.run import check_data_fits
    from jlearngene.train import tasks
    from jlearngene.train.evaluate import evaluate as evaluate_batches
    it, info = data.from_config(config.data, split, batch_size=config.eval_batch_size, seed=config.seed, train=False)
    check_data_fits(cfg, info, split)
    return {'split': split, **evaluate_batches(tasks.classification_eval(cfg), params, it)}


def main(argv: list[str]) -> int:
    """The command: checks the flags and the workdir or --model before anything is read,
    then loads the parameters (`load_params`), evaluates them on --split, else the config's
    `eval_split` (`evaluate`), and prints one summary line and the result as a JSON line
    (`json_line`); exit status 0. The config is --config's, else the workdir's config.json,
    with the --config.FIELD=VALUE overrides applied.

    Raises:
        UsageError: neither --workdir nor --model; --model without --config, or with a
            `model.*` override (a saved model is evaluated as stored); a --checkpoint that is
            not 'model', 'latest', 'best' or a step; a bad override.
    """
    args, overrides = config_args.parse(parser(), argv)
    if not args.workdir and not args.model:
        raise UsageError('give --workdir (a training run) or --model with --config')
    if args.model and args.config is None:
        raise UsageError('--model needs --config (the config names the data and the split to '
                         'evaluate on), e.g. --config digits_vit')
    if args.model and any(k.split('.')[0] == 'model' for k in overrides):
        raise UsageError(f'--config.{next(k for k in overrides if k.split(".")[0] == "model")}: '
                         '--model is evaluated as the model config it stores, which overrides '
                         'do not change')
    try:   # the flags, before anything is read
        check_checkpoint_arg(args.checkpoint)
    except ValueError as e:
        raise UsageError(str(e)) from None
    config = config_args.load(args.config, overrides) if args.config is not None else None
    if args.model:
        from jlearngene.commands.convert import check_model_checkpoint
        check_model_checkpoint(args.model, '--model')
    else:
        check_workdir(args.workdir)
    config = config if config is not None else _workdir_config(args.workdir, overrides)
    params, cfg, where = load_params(config, args.workdir, args.checkpoint, args.model)
    result = evaluate(config, params, cfg, args.split or config.eval_split)
    print(f"{where}: {result['split']} accuracy={result['accuracy']:.4f} loss={result['loss']:.4f} "
          f"(n={int(result['count'])})")
    print(json_line(result))
    return 0


def json_line(result: dict) -> str:
    """`result` as one line of strict JSON: a value that is not a finite number (a NaN loss
    of a diverged model) is null, since JSON has no NaN or infinity."""
    def finite(v):
        return None if isinstance(v, float) and not math.isfinite(v) else v
    return json.dumps({k: finite(v) for k, v in result.items()}, allow_nan=False)
