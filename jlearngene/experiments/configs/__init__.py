"""Bundled ml_collections config files: `get_config(arg)` per file, one file per experiment.

They ship inside the package, so an installed wheel can run them by name::

    jlearngene train --config digits_vit --workdir DIR          # this folder's digits_vit.py
    jlearngene train --config tleg:smoke --workdir DIR          # tleg.py, get_config('smoke')
    jlearngene train --config path/to/my_config.py:arg ...      # any file path works too

`resolve(spec)` turns a bundled name into its file path (a path that exists is kept), `load`
returns the locked ConfigDict with overrides applied, `names()` lists the bundled configs.

`validate(config)` checks a config file as strictly as the locked config checks command-line
overrides: its values are set into a locked copy of the task's bundled config (its template:
`digits_vit` for classification, the config named by `experiment` for experiments, with the
keys of every variant of it, e.g. `letra`'s 'digits' and 'fashion'), so ml_collections
rejects a key the template lacks (named with the closest known key) and a value of another
type, and a tuple field keeps its shape (a tuple of tuples of integers takes no flat tuple,
from a file or the command line); `model`, `optim` and `data` are checked against the fields
their consumers know; what types cannot say is a short table of value ranges (step counts,
batch sizes and learning rates positive). Each problem is a one-line `ConfigError` naming the
key.
`resolve` and `load` apply it, so a misspelt key in a config file fails before anything is
read or written.
"""
from __future__ import annotations

import difflib
import importlib.util
import math
import os
from typing import Any
from collections.abc import Mapping

import ml_collections

from jlearngene.models.config import ConfigError

_HERE = os.path.dirname(os.path.abspath(__file__))


def names() -> tuple[str, ...]:
    """The bundled config names (the .py files of this folder)."""
    return tuple(sorted(f[:-3] for f in os.listdir(_HERE)
                        if f.endswith('.py') and not f.startswith('_')))


def split(spec: str) -> tuple[str, str | None]:
    """'name_or_path[:arg]' -> (name_or_path, arg or None)."""
    where, sep, arg = spec.partition(':')
    return where, (arg if sep else None)


def path(name: str) -> str:
    """The file of the bundled config `name`; a clear error for an unknown name."""
    if name not in names():
        raise ValueError(f'no config file or bundled config {name!r}; bundled: '
                         f'{", ".join(names())} (or give the path of a .py file)')
    return os.path.join(_HERE, name + '.py')


def resolve(spec: str) -> str:
    """'NAME[:arg]' of a bundled config -> '/its/file.py[:arg]'; a file path is returned
    unchanged. Either way the config is loaded once and checked (`validate`), so a missing
    file, an unknown argument or a misspelt key is a one-line error (ValueError) here."""
    where, arg = split(spec)
    if not (os.path.exists(where) or where.endswith('.py')):
        where = path(where)
    _get_config(where, arg)
    return where + ('' if arg is None else ':' + arg)


def _is_bundled(where: str) -> bool:
    return os.path.dirname(os.path.abspath(where)) == _HERE


def _get_config(where: str, arg: str | None) -> ml_collections.ConfigDict:
    """`get_config(arg)` of the config file `where`, checked by `validate` (bundled configs
    are their own template: only their values are checked)."""
    return _call(_module(where), where, arg)


def _module(where: str):
    """The config file `where`, executed as a module that defines get_config."""
    if os.path.isdir(where):
        raise ValueError(f'config file {where!r} is a directory; give a .py file defining get_config')
    if not os.path.isfile(where):
        raise ValueError(f'config file {where!r} does not exist' + (
            '' if where.endswith('.py') else ' (a config file is a .py file defining get_config)'))
    module_spec = importlib.util.spec_from_file_location(
        f'_jlearngene_config_{os.path.basename(where)[:-3]}', where)
    if module_spec is None:
        raise ValueError(f'config file {where!r} is not a Python file (a .py defining get_config)')
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except SyntaxError as e:
        raise ValueError(f'config file {where!r} is not valid Python (line {e.lineno}: {e.msg})') from None
    if not hasattr(module, 'get_config'):
        raise ValueError(f'config file {where!r} defines no get_config(arg)')
    return module


def _call(module, where: str, arg: str | None) -> ml_collections.ConfigDict:
    """`module.get_config(arg)` of the config file `where`, checked by `validate`."""
    try:
        config = module.get_config(arg) if arg is not None else module.get_config()
    except TypeError as e:   # ml_collections' type safety: a value of another type than the field's
        raise ConfigError(f'{where}: {str(e).splitlines()[0]}') from None
    if not isinstance(config, ml_collections.ConfigDict):
        raise ValueError(f'get_config of {where!r} returned a {type(config).__name__}, '
                         'not an ml_collections.ConfigDict')
    validate(config, template=None if _is_bundled(where) else 'auto', where=where)
    return config


def load(spec: str, overrides: Mapping[str, Any] | None = None, *,
         from_text: bool = False) -> ml_collections.ConfigDict:
    """The locked ConfigDict of `spec` ('tleg:smoke', 'digits_vit', 'file.py:arg') with
    dotted-key `overrides` ({'descend.steps': 10}) applied; a misspelt key is an error naming
    the closest field, and the result passes `validate`. `from_text`: the values are
    command-line text, read as each field's type (`_from_text`)."""
    where, arg = split(spec)
    if not (os.path.exists(where) or where.endswith('.py')):
        where = path(where)
    return override(_get_config(where, arg), overrides, from_text=from_text, where=where)


def override(config: ml_collections.ConfigDict, overrides: Mapping[str, Any] | None, *,
             from_text: bool = False, where: str = 'the config') -> ml_collections.ConfigDict:
    """`config`, locked, with the dotted-key `overrides` applied and checked as `load` does
    (`where`: what errors name as the config's source); e.g. a training workdir's
    `config.json` with `jlearngene eval`'s overrides."""
    config.lock()
    for key, value in (overrides or {}).items():
        node, parts = config, key.split('.')
        for i, part in enumerate(parts):
            if not isinstance(node, ml_collections.ConfigDict) or part not in node:
                known = list(node) if isinstance(node, ml_collections.ConfigDict) else []
                close = difflib.get_close_matches(part, known, n=1)
                raise ConfigError(f'the config has no field {key!r} to override'
                                  + (f' (did you mean {".".join(parts[:i] + close)!r}?)' if close else ''))
            if i < len(parts) - 1:
                node = node[part]
        leaf = parts[-1]
        _assign(node, leaf, _from_text(node[leaf], value, key) if from_text else value, key, 'it is')
    if overrides:
        validate(config, template=None, where=where)
    return config


def _kind(value: Any) -> str:
    """'an integer', 'a string', ... for an error message about `value`'s type."""
    names = {bool: 'true or false', int: 'an integer', float: 'a number', str: 'a string',
             tuple: 'a tuple', list: 'a list', ml_collections.ConfigDict: 'a section'}
    return names.get(type(value), f'a {type(value).__name__}')


def _from_text(current: Any, text: str, key: str) -> Any:
    """Command-line `text` as the type of the field's `current` value, read by the parsers
    ml_collections' config_flags uses: absl's for bool, int and float, its TupleParser for
    tuples ('3,4,5', '((32,1),)'; bare names 'tleg,share_init' split on the commas too); a
    string field takes the text, any other field (None, a list) a Python literal, else the
    text."""
    import ast

    from absl import flags
    from ml_collections.config_flags import tuple_parser
    if isinstance(current, str):
        return text
    parser = {bool: flags.BooleanParser, int: flags.IntegerParser, float: flags.FloatParser,
              tuple: tuple_parser.TupleParser}.get(type(current))
    if parser is None:
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return text
    try:
        value = parser().parse(text)
    except ValueError:
        raise ConfigError(f'{key} must be {_kind(current)}, got {text!r}') from None
    if (parser is tuple_parser.TupleParser and len(value) == 1 and isinstance(value[0], str)
            and ',' in value[0]):   # bare names 'tleg,share_init', split as '3,4,5' is
        value = tuple(part.strip() for part in value[0].split(','))
    return value


# ----------------------------------------------------------------------------------------
# Validation.

# Classification keys that commands.run.run_classification reads with a default.
_OPTIONAL_CLASSIFICATION_KEYS = ('task', 'microbatches', 'steps_per_call', 'init')
# Sections whose fields their consumers check (ViTConfig, optim.check, pipeline.check_config).
_OWN_CHECKS = ('model', 'optim', 'data')
# Sections whose sub-sections are per-name options (e.g. per method): only the sub-sections
# the template has are checked.
_OPEN_SECTIONS = ('method_options',)


def _as_dict(c) -> dict:
    return c.to_dict() if hasattr(c, 'to_dict') else dict(c)


def _unknown(key: str, known, where: str, section: str) -> ConfigError:
    close = difflib.get_close_matches(key, list(known), n=1)
    hint = f' (did you mean {close[0]!r}?)' if close else ''
    name = f'{section}.{key}' if section else key
    return ConfigError(f'{where}unknown config key {name!r}{hint}; known keys'
                       f'{" of " + section if section else ""}: {", ".join(sorted(known))}')


def template_for(config) -> ml_collections.ConfigDict | None:
    """The bundled config a config file is checked against: `digits_vit` for the
    classification task, the bundled config named by `experiment` for experiments (None
    when there is none); a bundled config with several variants (its `ARGS`, e.g. 'digits'
    and 'fashion') gives every key and section of any of them (`_union`), so a file may
    define any variant."""
    task = config.get('task', 'classification')
    name = 'digits_vit' if task == 'classification' else config.get('experiment')
    if name not in names():
        return None
    where = path(name)
    module = _module(where)
    return _union([_call(module, where, arg) for arg in getattr(module, 'ARGS', (None,))])


def _union(variants) -> ml_collections.ConfigDict:
    """One config with every key of `variants` (ConfigDicts): sections merged key by key,
    a leaf with the first variant's value; None (any value) where the variants' values
    are of different types."""
    def merge(a: dict, b: Mapping) -> dict:
        for k, v in b.items():
            if k not in a:
                a[k] = v
            elif isinstance(a[k], dict) and isinstance(v, Mapping):
                merge(a[k], v)
            elif type(a[k]) is not type(v):
                a[k] = None
        return a

    out: dict = {}
    for v in variants:
        merge(out, _as_dict(v))
    return ml_collections.ConfigDict(out)


def validate(config, *, template: Any = 'auto', where: str = '') -> None:
    """ConfigError naming the first problem of `config` (see the module docstring).
    `template` is the config whose keys and types are the known ones ('auto':
    `template_for(config)`; None: check values and the `model`/`optim`/`data` fields only);
    `where` (e.g. the file) starts every message."""
    from jlearngene.data import pipeline
    from jlearngene.train import optim
    if template == 'auto':
        template = template_for(config)
    where = f'{where}: ' if where else ''
    c = _as_dict(config)
    task = c.get('task', 'classification')
    if task not in ('classification', 'experiment'):
        raise ConfigError(f"{where}task must be 'classification' or 'experiment', got {task!r}")
    if template is not None:
        locked = ml_collections.ConfigDict(_as_dict(template))
        locked.lock()
        _set_into(locked, c, where, '')
        if task == 'classification':
            missing = sorted(set(locked) - set(c) - set(_OPTIONAL_CLASSIFICATION_KEYS))
            if missing:
                raise ConfigError(f'{where}the classification task needs the key(s) {missing} '
                                  '(see the bundled digits_vit config)')
    if isinstance(c.get('model'), Mapping):
        from jlearngene.models import ViTConfig
        unknown = sorted(set(c['model']) - set(ViTConfig.__dataclass_fields__) - {'variant'})
        if unknown:
            raise _unknown(unknown[0], set(ViTConfig.__dataclass_fields__) | {'variant'}, where, 'model')
        if task == 'classification':
            from jlearngene.models import model_config
            model_config(c['model'])
    try:
        if isinstance(c.get('optim'), Mapping):
            optim.check(c['optim'])
        if isinstance(c.get('data'), Mapping):
            pipeline.check_config(c['data'])
    except ValueError as e:
        raise ConfigError(f'{where}{e}') from None
    _check_values(c, where, '')


def _set_into(locked: ml_collections.ConfigDict, c: Mapping, where: str, section: str) -> None:
    """Sets `c`'s values into the locked template copy `locked`, section by section, so that
    ml_collections rejects a key the template lacks (locking) and a value of another type
    (type safety); the sections of _OWN_CHECKS are left to their consumers."""
    for k, v in c.items():
        name = f'{section}.{k}' if section else k
        if k not in locked:
            raise _unknown(k, locked, where, section)
        if name in _OWN_CHECKS:
            continue
        if isinstance(v, Mapping) and isinstance(locked[k], ml_collections.ConfigDict):
            if name not in _OPEN_SECTIONS:
                _set_into(locked[k], v, where, name)
            else:   # only the per-name sub-sections the template has
                for sub, sv in v.items():
                    if isinstance(sv, Mapping) and isinstance(locked[k].get(sub), ml_collections.ConfigDict):
                        _set_into(locked[k][sub], sv, where, f'{name}.{sub}')
            continue
        _assign(locked, k, v, name, 'the template has', where)


def _assign(node: ml_collections.ConfigDict, key: str, value: Any, name: str, has: str,
            where: str = '') -> None:
    """`node[key] = value`, ml_collections' type safety as a ConfigError naming `name` and
    the field's current value ('{name} must be an integer ({has} 5), got 'five''); a tuple
    field also keeps its shape (`_fits`: '{name} must be a tuple of tuples of integers ...')."""
    current = node[key]
    if isinstance(current, (tuple, list)) and not _fits(current, value):
        raise ConfigError(f'{where}{name} must be {_shape(current)} ({has} {current!r}), got {value!r}')
    try:
        node[key] = value
    except TypeError:
        raise ConfigError(f'{where}{name} must be {_kind(current)} ({has} {current!r}), '
                          f'got {value!r}') from None


def _fits(current: Any, value: Any) -> bool:
    """Whether `value` has the shape of the field's `current` value: a tuple (or list) whose
    items each fit one of `current`'s items (any items where `current` is empty), integers
    where it has integers, numbers where it has floats; None takes anything."""
    if current is None:
        return True
    if isinstance(current, (tuple, list)):
        return isinstance(value, (tuple, list)) and (
            not current or all(any(_fits(c, v) for c in current) for v in value))
    if isinstance(current, bool) or isinstance(value, bool):
        return isinstance(current, bool) and isinstance(value, bool)
    if isinstance(current, float):
        return isinstance(value, (int, float))
    return isinstance(value, type(current))


def _shape(current: Any, plural: bool = False) -> str:
    """The shape of a field's `current` value in words ('a tuple of tuples of integers')."""
    words = {bool: 'true or false', int: 'integers', float: 'numbers', str: 'strings'}
    if isinstance(current, (tuple, list)):
        items = {_shape(c, True) for c in current}
        return (('tuples' if plural else 'a tuple')
                + (f' of {items.pop()}' if len(items) == 1 else ''))
    return words.get(type(current), 'values') if plural else _kind(current)


def _value_range(key: str, in_stage: bool):
    """(what, test) for the values of `key`, or None: what ml_collections' types cannot say.
    A stage's `steps` may be 0 (its `epochs` then set the budget)."""
    if key == 'steps' and in_stage:
        return 'a non-negative integer (0: the epochs set the budget)', lambda x: x >= 0
    if key == 'steps' or key.endswith('batch_size') or key in ('log_every', 'keep_checkpoints'):
        return 'a positive integer', lambda x: x > 0
    if key.endswith(('_every', 'warmup_steps')):
        return 'a non-negative integer', lambda x: x >= 0
    if key == 'lr':
        return 'a positive number', lambda x: x > 0
    if key == 'epochs':
        return 'a non-negative number', lambda x: x >= 0
    if key == 'label_smoothing':
        return 'a number in [0, 1)', lambda x: 0 <= x < 1
    return None


def _check_values(c: dict, where: str, section: str) -> None:
    """The value ranges of `_value_range`, and a stage's budget (steps or epochs)."""
    for k, v in c.items():
        name = f'{section}.{k}' if section else k
        if isinstance(v, Mapping):
            _check_values(dict(v), where, name)
            continue
        rule = _value_range(k, bool(section))
        if rule is None:
            continue
        what, ok = rule
        kind = int if 'integer' in what else (int, float)
        if isinstance(v, bool) or not isinstance(v, kind) or not math.isfinite(v) or not ok(v):
            raise ConfigError(f'{where}{name} must be {what}, got {v!r}')
    if section and c.get('steps') == 0 and c.get('epochs', None) == 0:
        raise ConfigError(f'{where}{section} has steps = 0 and epochs = 0: give one of them')


def section(**fields) -> ml_collections.ConfigDict:
    """A config section: a ConfigDict of the keyword fields."""
    return ml_collections.ConfigDict(fields)


def experiment_base(experiment: str, scale: str, *, eval_batch_size: int = 128) -> ml_collections.ConfigDict:
    """What every bundled experiment config starts from: the method part to run
    (`jlearngene.experiments.<experiment>`), the scale `parse_arg` picked, seed 0, batches
    of 64, the embedded digits at 16 px with 1-px crop padding, AdamW at lr 2e-3 with 20
    warm-up steps, weight decay 0.05 and clipping at 1, and jax's persistent compilation
    cache in workdir/jax_cache. Each config then sets its model and stages and changes
    whatever its scale needs."""
    c = ml_collections.ConfigDict()
    c.task = 'experiment'
    c.experiment = experiment
    c.scale = scale
    c.seed = 0
    c.batch_size = 64
    c.eval_batch_size = eval_batch_size
    c.compile_cache = True
    c.data = section(name='digits', image_size=16, augment=section(crop_padding=1))
    c.optim = section(lr=2e-3, warmup_steps=20, weight_decay=0.05, clip_norm=1.0)
    return c


def study_base(experiment: str, scale: str) -> ml_collections.ConfigDict:
    """`experiment_base` plus what every study of `jlearngene.experiments.study` declares:
    three seeds; the studies' shared digits split (half the data for testing, 901 images:
    'half_train' / 'half_test'); Scratch's lr sweep (1e-3, 2e-3, 4e-3 around the teacher's
    2e-3), trained 1,200 steps with an evaluation every 50 and the plateau rule (0.5 pt,
    patience 4 evaluations; a run still rising is trained again at twice its steps while that
    stays within `max_steps`, 4,800; 0: never; every seed ends at the most steps any seed
    needed); the target gap (0.5 pt); amortisation over N = 1, 4, 10; the descendants'
    fine-tuning lr 1e-3 and 5 evaluations per run. Each study then sets its shapes, methods
    and budget fractions (its smoke variant: no retraining)."""
    c = experiment_base(experiment, scale)
    c.seeds = (0, 1, 2)
    c.data.splits = section(train='half_train', test='half_test')
    c.scratch = section(lrs=(1e-3, 2e-3, 4e-3), steps=1200, epochs=0.0, eval_every=50, evals=0,
                        plateau=0.005, patience=4, max_steps=4800)
    c.target_gap = 0.005
    c.amortise = (1, 4, 10)
    c.on_missing = 'mark'          # 'mark': a table entry; 'error': stop before training
    c.method_options = section()
    c.variants = section()
    return c


def fashion_transfer(c: ml_collections.ConfigDict, *, patch_size: int = 7) -> ml_collections.ConfigDict:
    """`c` in the transfer setting of specs/fair_studies.md: Fashion-MNIST at 28 px from its
    local IDX files (`data.root`, $JLEARNGENE_DATA/fashion_mnist or Debian's
    dataset-fashion-mnist; nothing is downloaded), patches of `patch_size`; every upstream
    model on the source task (classes 0–4, all 30,000 training images, 3 seeds), descendants
    on classes 5–9 at 1 % and 10 % of their labels (300 and 3,000 images; 5 and 3 seeds),
    1,000 validation images held out of both, all 5,000 of their test images for the
    numbers. Scratch sweeps lr × weight decay (0.05, 0.3) on the validation images, the
    descendants three learning rates (3e-4, 1e-3, 3e-3), every sweep extended past an edge;
    Scratch and every upstream model converge by doubling (`scratch.baseline`) up to
    `scratch.max_steps`; every method trains at its paper's budget and at Scratch's steps
    (`descend.equal_budget`); nothing stops at the target."""
    c.data = section(name='fashion_mnist', root='', image_size=28, augment=section(crop_padding=2))
    c.model.update(image_size=28, patch_size=patch_size, channels=1)
    c.tasks = section(ancestor=(0, 1, 2, 3, 4), descendant=(5, 6, 7, 8, 9))
    c.labels = section(fractions=(0.01, 0.1), seeds=((0, 1, 2, 3, 4), (0, 1, 2)),
                       scratch_steps=(600, 1500), validation_per_class=200, subset_seed=0)
    c.seeds = (0, 1, 2)              # the source task's
    # the source models' sweep at 3,000 steps, then doubled up to 48,000 (102 epochs of the
    # 30,000 source images at 24,000: the teacher still gained 1.8 pt there); 20 evaluations
    # a run at any length
    c.scratch.update(steps=3000, weight_decays=(0.05, 0.3), max_steps=48000, evals=20)
    # every method at its paper's budget and at Scratch's own steps (evaluated 20 times)
    c.descend.update(lrs=(3e-4, 1e-3, 3e-3), stop_at_target=False, equal_budget=True, equal_evals=20)
    return c


def source_task(c: ml_collections.ConfigDict, *, patch_size: int = 7) -> ml_collections.ConfigDict:
    """`c` on the transfer setting's source task alone (classes 0–4 of Fashion-MNIST at 28
    px, all 30,000 training images, evaluated on their 5,000 test images): the same-task
    studies (Scala, Mango) train and evaluate there, as their papers do on ImageNet."""
    c.data = section(name='fashion_mnist', root='', image_size=28, classes=(0, 1, 2, 3, 4),
                     augment=section(crop_padding=2))
    c.model.update(image_size=28, patch_size=patch_size, channels=1)
    return c


def imagenet_data(**augment) -> ml_collections.ConfigDict:
    """The `paper` configs' data section: ImageNet-1k from a prepared tfds directory (set
    `data.data_dir`; nothing is downloaded) at 224 px, ImageNet mean/std, DeiT's augmentation
    (random resized crops, flips, mixup 0.8, cutmix 1.0, label smoothing 0.1; `augment`
    changes fields), evaluated on the validation split."""
    aug = section(rrc_scale=(0.08, 1.0), flip=True, mixup_alpha=0.8, cutmix_alpha=1.0,
                  label_smoothing=0.1)
    aug.update(augment)
    return section(name='tfds', tfds_name='imagenet2012', data_dir='', image_size=224,
                   mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), augment=aug,
                   splits=section(test='validation'))


def parse_arg(arg: str | None, choices: tuple[str, ...], flags: tuple[str, ...] = ()) -> tuple[str, set[str]]:
    """A config's `arg` 'choice[,flag...]' (e.g. 'digits,quick') -> (choice, {flags}); the
    first of `choices` when `arg` is empty. Unknown items are a one-line error."""
    items = [a.strip() for a in (arg or '').split(',') if a.strip()]
    picked = [a for a in items if a in choices]
    unknown = [a for a in items if a not in choices and a not in flags]
    if unknown or len(picked) > 1:
        bad = unknown[0] if unknown else ','.join(picked)
        raise ValueError(f'unknown config argument {bad!r}: expected one of {", ".join(choices)}'
                         + (', optionally followed by ' + ', '.join(',' + f for f in flags)
                            if flags else ''))
    return (picked[0] if picked else choices[0]), set(items) - set(picked)
