"""A study's results as pure functions of its records (what `results.json` holds): each
run's target and FLOPs to it, the summary per row, shape and budget, the break-even number of
descendants and the verdicts on the paper claims; so a recorded study is re-derived without
training (`study.render`).

Statistics: every mean ± std over seeds uses the sample std (ddof = 1; 0.0 for a single
seed, where it is undefined). A difference between two rows counts as reproduced only where
Welch's t-test (`welch`) gives p < `ALPHA` and, for accuracies, the gap is at least `MIN_GAP`;
where p cannot be computed because both samples are constant it does not count, and where a
side has fewer than 2 seeds (a one-seed study) the comparison is not tested: a claim that
rests on such comparisons alone is 'not testable here', neither reproduced nor refuted.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import stat
import warnings
from typing import Any
from collections.abc import Callable, Sequence

import numpy as np
from scipy import stats

# a difference counts where Welch's t-test gives p < ALPHA and (accuracies) the gap is ≥ MIN_GAP
ALPHA = 0.05
MIN_GAP = 0.005

class ResultsError(ValueError):
    """A results.json that is not a study's record; the message names the file and field."""


# the pretrained source a method starts from: the papers leave its training out of their
# counts, so every cost is reported both without and with it
PRETRAINED = ('teacher', 'small')


def pretrained(run: str) -> bool:
    """Whether the upstream run `run` is the pretrained source: the teacher, the small model,
    or a transfer study's source model at a descendant shape ('source_w64_d3')."""
    return run in PRETRAINED or run.startswith('source_')


def shape_key(shape) -> str:
    """A shape's key in results: 'w64_d6', or 'w64_d6_h16' for (width, depth, heads)."""
    return f'w{shape[0]}_d{shape[1]}' + (f'_h{shape[2]}' if len(shape) == 3 else '')


def parse_key(key: str) -> tuple[int, ...]:
    """`shape_key`'s inverse: 'w64_d6_h16' -> (64, 6, 16)."""
    return tuple(int(part[1:]) for part in key.split('_'))


def shape_text(shape) -> str:
    """A shape in tables: 'w64 L6', or 'w64 L6 H16' for (width, depth, heads)."""
    return f'w{shape[0]} L{shape[1]}' + (f' H{shape[2]}' if len(shape) == 3 else '')



# What a study's record holds (`study.run`): top-level fields, and the fields of each run.
RECORD_FIELDS = {'config': dict, 'shapes': list, 'seeds': list, 'rows_spec': list, 'labels': dict,
                 'cannot': dict, 'reference': dict, 'scratch': dict, 'upstream_flops': dict,
                 'info': dict, 'rows': list}
RUN_FIELDS = {'name': str, 'method': str, 'label': str, 'shape': list, 'seed': int,
              'fraction': (int, float), 'steps': int, 'steps_taken': (int, float),
              'acc': (int, float), 'curve': list, 'params': int, 'extra_flops': (int, float),
              'step_flops': (int, float), 'finetune_flops': (int, float), 'upstream': list}
CONFIG_FIELDS = {'experiment': str, 'target_gap': (int, float), 'amortise': (list, tuple),
                 'batch_size': int, 'scratch': dict}


def _accuracy(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and 0.0 <= x <= 1.0


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _integer(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _type_name(kind) -> str:
    """'an object', 'a list', 'a number', ... for a type (or tuple of types) of *_FIELDS."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if float in kinds:
        return 'a number'
    return {dict: 'an object', list: 'a list', str: 'a string', int: 'an integer'}.get(kinds[0], 'a value')


def _fields(obj: dict, spec: dict, prefix: str, bad: Callable[[str, str], ResultsError]) -> None:
    """`bad(field, problem)` for the first field of `spec` ({name: type}) that `obj` lacks or
    holds with another type."""
    for key, kind in spec.items():
        if key not in obj:
            raise bad(f'{prefix}{key}', 'missing')
        if not isinstance(obj[key], kind) or isinstance(obj[key], bool):
            raise bad(f'{prefix}{key}', f'expected {_type_name(kind)}, got {type(obj[key]).__name__}')


def _shape_problem(shape: Any) -> str | None:
    """Why `shape` is not a descendant shape (2 or 3 positive integers: width, depth[, heads])."""
    if (not isinstance(shape, list) or len(shape) not in (2, 3)
            or not all(_integer(x) and x > 0 for x in shape)):
        return f'expected [width, depth] or [width, depth, heads] of positive integers, got {shape!r}'
    return None


def _distinct(values: list, what: str, field: str, bad: Callable[[str, str], ResultsError]) -> None:
    """`bad(field, ...)` for an empty list `values` or one that repeats a value."""
    if not values:
        raise bad(field, f'empty; a study records at least one {what}')
    seen = [json.dumps(v) for v in values]
    repeated = next((v for v, s in zip(values, seen) if seen.count(s) > 1), None)
    if repeated is not None:
        raise bad(field, f'repeats the {what} {repeated!r}')


def validate(recorded: Any, where: str, field: str = '') -> None:
    """ResultsError naming `where` (the file) and the first field of `recorded` (a study's
    record; a label budget's under `field`, e.g. 'budgets.0.01.') that is not what a study
    writes, or that does not fit the others:

    * a missing field or one of another type, an accuracy outside [0, 1], a FLOP count that
      is not finite and ≥ 0;
    * `seeds` (integers) and `shapes` ([width, depth] or [width, depth, heads], positive
      integers) empty or repeating a value; `config.amortise` not positive numbers;
      `config.tasks`, where present, not two lists of class ids;
    * Scratch's baseline (`scratch`) missing at a shape, or Scratch's runs at a shape and
      seed; Scratch's runs at another budget than its converged one (fraction 1);
    * a run at a shape or seed the record does not list, of a row that is not in
      `rows_spec`, or repeating another's row, shape, seed and budget (it would count as one
      more seed);
    * upstream FLOPs missing for a seed, a row without its label or a shape it cannot make
      that is no shape key.

    A record may carry more fields than these: they are not checked.

    Args:
        recorded: the record, as JSON reads it.
        where: the file, at the start of every message.
        field: the record's place in the file, before every field named ('budgets.0.01.').

    Raises:
        ResultsError: one line, '<where>: <field>: <problem>'.
    """
    def bad(name: str, problem: str) -> ResultsError:
        return ResultsError(f'{where}: {field}{name}: {problem}')

    if not isinstance(recorded, dict):
        raise ResultsError(f'{where}: {field.rstrip(".") or "the file"}: expected a JSON object, '
                           f'got {type(recorded).__name__}')
    _fields(recorded, RECORD_FIELDS, '', bad)
    config = recorded['config']
    _fields(config, CONFIG_FIELDS, 'config.', bad)
    if not config['amortise'] or not all(_finite(n) and n > 0 for n in config['amortise']):
        raise bad('config.amortise', f'expected numbers of descendants > 0, got {config["amortise"]!r}')
    if not _finite(config['target_gap']) or config['target_gap'] < 0:
        raise bad('config.target_gap', f'expected an accuracy gap ≥ 0, got {config["target_gap"]!r}')
    if not _finite(config['scratch'].get('plateau')):
        raise bad('config.scratch.plateau', f'expected a number, got {config["scratch"].get("plateau")!r}')
    lrs = config['scratch'].get('lrs')
    if not isinstance(lrs, list) or not lrs or not all(_finite(x) for x in lrs):
        raise bad('config.scratch.lrs', f'expected a list of learning rates, got {lrs!r}')
    if 'tasks' in config:
        tasks = config['tasks']
        for part in ('ancestor', 'descendant'):
            classes = tasks.get(part) if isinstance(tasks, dict) else None
            if not isinstance(classes, list) or not classes or not all(_integer(c) for c in classes):
                raise bad(f'config.tasks.{part}', f'expected a list of class ids, got {classes!r}')
    seeds, shapes = recorded['seeds'], recorded['shapes']
    _distinct(seeds, 'seed', 'seeds', bad)
    for i, s in enumerate(seeds):
        if not _integer(s):
            raise bad(f'seeds[{i}]', f'expected an integer seed, got {s!r}')
    for i, s in enumerate(shapes):
        if _shape_problem(s):
            raise bad(f'shapes[{i}]', _shape_problem(s))
    _distinct(shapes, 'shape', 'shapes', bad)
    rows_spec = recorded['rows_spec']
    for i, name in enumerate(rows_spec):
        if not isinstance(name, str):
            raise bad(f'rows_spec[{i}]', f'expected a row name, got {name!r}')
        if not isinstance(recorded['labels'].get(name), str):
            raise bad(f'labels.{name}', f'expected the label of the row {name!r}, got '
                                        f'{recorded["labels"].get(name)!r}')
    for name, why in recorded['cannot'].items():
        if name not in rows_spec or not isinstance(why, dict):
            raise bad(f'cannot.{name}', f'expected the shapes a row of rows_spec cannot make, got {why!r}')
        for key, reason in why.items():
            if not _shape_key(key) or not isinstance(reason, str):
                raise bad(f'cannot.{name}.{key}', f"expected a shape key such as 'w64_d6' and the reason, "
                                                  f'got {reason!r}')
    ref = recorded['reference']
    for f in ('width', 'depth'):
        if not _integer(ref.get(f)) or ref[f] < 1:
            raise bad(f'reference.{f}', f'expected a positive integer, got {ref.get(f)!r}')
    if not _finite(ref.get('S')) or ref['S'] < 0:
        raise bad('reference.S', f'expected a step count ≥ 0, got {ref.get("S")!r}')
    _scratch_baseline(recorded, bad)
    ancestor = recorded.get('ancestor')
    if ancestor is not None:
        _ancestor(ancestor, bad)
    for seed in seeds:
        ups = recorded['upstream_flops'].get(str(seed))
        if not isinstance(ups, dict):
            raise bad(f'upstream_flops.{seed}', f'expected the FLOPs of seed {seed}\'s upstream runs, got {ups!r}')
    for seed, ups in recorded['upstream_flops'].items():
        for k, v in (ups.items() if isinstance(ups, dict) else [('', ups)]):
            if not _finite(v) or v < 0:
                raise bad(f'upstream_flops.{seed}.{k}', f'expected FLOPs ≥ 0, got {v!r}')
    for seed, info in recorded['info'].items():
        if not isinstance(info, dict):
            raise bad(f'info.{seed}', f'expected an object, got {type(info).__name__}')
    _runs_fit(recorded, bad)


def _scratch_baseline(recorded: dict, bad: Callable[[str, str], ResultsError]) -> None:
    """The record's `scratch` entries: one per shape, each with what the tables read."""
    for key, b in recorded['scratch'].items():
        if not _shape_key(key):
            raise bad(f'scratch.{key}', "expected a shape key such as 'w64_d6'")
        if not isinstance(b, dict):
            raise bad(f'scratch.{key}', f'expected an object, got {type(b).__name__}')
        for f in ('acc', 'std', 'S', 'lr', 'steps'):
            if f not in b or not _finite(b[f]):
                raise bad(f'scratch.{key}.{f}', f'expected a finite number, got {b.get(f)!r}')
        if not _accuracy(b['acc']):
            raise bad(f'scratch.{key}.acc', f'{b["acc"]!r} is not an accuracy in [0, 1]')
        if not isinstance(b.get('sweep'), dict) or not all(_finite(a) for a in b['sweep'].values()):
            raise bad(f'scratch.{key}.sweep', f'expected {{setting: accuracy}}, got {b.get("sweep")!r}')
        if not isinstance(b.get('converged'), bool):
            raise bad(f'scratch.{key}.converged', f'expected true or false, got {b.get("converged")!r}')
        if 'weight_decay' in b and not _finite(b['weight_decay']):
            raise bad(f'scratch.{key}.weight_decay', f'expected a number, got {b["weight_decay"]!r}')
    for shape in recorded['shapes']:
        if shape_key(shape) not in recorded['scratch']:
            raise bad(f'scratch.{shape_key(shape)}', f"missing: Scratch's baseline at the shape {shape}")


def _ancestor(ancestor: Any, bad: Callable[[str, str], ResultsError]) -> None:
    """A two-task record's `ancestor`: the source model's baseline, as the tables read it."""
    if not isinstance(ancestor, dict):
        raise bad('ancestor', f'expected an object or null, got {type(ancestor).__name__}')
    for f in ('lr', 'S', 'acc', 'std'):
        if not _finite(ancestor.get(f)):
            raise bad(f'ancestor.{f}', f'expected a finite number, got {ancestor.get(f)!r}')
    for f in ('classes', 'descendant_classes'):
        if not isinstance(ancestor.get(f), list):
            raise bad(f'ancestor.{f}', f'expected a list of class ids, got {ancestor.get(f)!r}')
    if not isinstance(ancestor.get('sweep'), dict) or not all(_finite(a) for a in ancestor['sweep'].values()):
        raise bad('ancestor.sweep', f'expected {{lr: accuracy}}, got {ancestor.get("sweep")!r}')
    if not isinstance(ancestor.get('converged'), bool):
        raise bad('ancestor.converged', f'expected true or false, got {ancestor.get("converged")!r}')


def _runs_fit(recorded: dict, bad: Callable[[str, str], ResultsError]) -> None:
    """Each run's fields, and how the runs fit the record: at its shapes and seeds, of its
    rows, none repeated, Scratch's at every shape and seed."""
    shapes = [tuple(s) for s in recorded['shapes']]
    names = set(recorded['rows_spec']) | {'scratch'}
    seen: dict[tuple, int] = {}
    for i, r in enumerate(recorded['rows']):
        prefix = f'rows[{i}].'
        if not isinstance(r, dict):
            raise bad(f'rows[{i}]', f'expected an object, got {type(r).__name__}')
        _fields(r, RUN_FIELDS, prefix, bad)
        if _shape_problem(r['shape']):
            raise bad(f'{prefix}shape', _shape_problem(r['shape']))
        if tuple(r['shape']) not in shapes:
            raise bad(f'{prefix}shape', f'{r["shape"]} is none of the record\'s shapes')
        if r['seed'] not in recorded['seeds']:
            raise bad(f'{prefix}seed', f'{r["seed"]} is none of the record\'s seeds {recorded["seeds"]}')
        if r['name'] not in names:
            raise bad(f'{prefix}name', f'{r["name"]!r} is neither Scratch nor a row of rows_spec')
        if not _finite(r['fraction']) or r['fraction'] < 0:
            raise bad(f'{prefix}fraction', f'expected a budget ≥ 0, got {r["fraction"]!r}')
        if not _accuracy(r['acc']):
            raise bad(f'{prefix}acc', f'{r["acc"]!r} is not an accuracy in [0, 1]')
        if 'acc_init' not in r:
            raise bad(f'{prefix}acc_init', 'missing')
        if r['acc_init'] is not None and not _accuracy(r['acc_init']):
            raise bad(f'{prefix}acc_init', f'{r["acc_init"]!r} is not an accuracy in [0, 1]')
        if 'acc_at_best_val' in r and not _accuracy(r['acc_at_best_val']):
            raise bad(f'{prefix}acc_at_best_val', f'{r["acc_at_best_val"]!r} is not an accuracy in [0, 1]')
        for f in ('extra_flops', 'step_flops', 'finetune_flops'):
            if not _finite(r[f]) or r[f] < 0:
                raise bad(f'{prefix}{f}', f'expected FLOPs ≥ 0, got {r[f]!r}')
        if not all(isinstance(u, str) for u in r['upstream']):
            raise bad(f'{prefix}upstream', f'expected the names of upstream runs, got {r["upstream"]!r}')
        for j, point in enumerate(r['curve']):
            if (not isinstance(point, list) or len(point) != 2 or not _finite(point[0])
                    or not _accuracy(point[1])):
                raise bad(f'{prefix}curve[{j}]', f'expected [step, accuracy in [0, 1]], got {point!r}')
        if r['name'] == 'scratch':
            for f in ('lr', 'plateau_step'):
                if not _finite(r.get(f)):
                    raise bad(f'{prefix}{f}', f'expected a finite number, got {r.get(f)!r}')
            if not isinstance(r.get('converged'), bool):
                raise bad(f'{prefix}converged', f'expected true or false, got {r.get("converged")!r}')
            if r['fraction'] != 1:
                raise bad(f'{prefix}fraction', f"Scratch's runs are at its converged budget, 1; got {r['fraction']!r}")
        key = (r['name'], tuple(r['shape']), r['seed'], r['fraction'], budget_kind(r))
        if key in seen:
            raise bad(f'rows[{i}]', f'repeats rows[{seen[key]}] ({r["name"]} at {shape_text(r["shape"])}, seed '
                                    f'{r["seed"]}, budget {r["fraction"]:g}·S): a repeated run would count as '
                                    'one more seed')
        seen[key] = i
    for shape in shapes:
        for seed in recorded['seeds']:
            if ('scratch', shape, seed, 1.0, 'paper') not in seen:
                raise bad('rows', f"no Scratch run at {shape_text(shape)} for seed {seed}: each method is "
                                  "compared with Scratch's runs at its shape")


def _shape_key(key: str) -> bool:
    """Whether `key` is a shape's key in results ('w64_d6', 'w32_d6_h4')."""
    try:
        return shape_key(parse_key(key)) == key and _shape_problem(list(parse_key(key))) is None
    except (ValueError, IndexError):
        return False


def read(workdir: str, *, transfer: bool = False) -> dict:
    """The record in `workdir`/results.json, checked whole before anything renders it.

    Args:
        workdir: the study's folder.
        transfer: the record must be a transfer study's (with label budgets).

    Returns:
        The record, as JSON reads it.

    Raises:
        ResultsError: one line naming the file (and the field) for a file that is not a
            regular file (a FIFO would block), empty, not JSON, not a study's record or one
            whose fields do not fit together (`validate_record`).
        OSError: the file cannot be read.
    """
    path = os.path.join(workdir, 'results.json')
    if os.path.exists(path) and not stat.S_ISREG(os.stat(path).st_mode):    # a FIFO would block
        raise ResultsError(f'{path}: is not a regular file (a FIFO, device or folder); a study '
                           'writes its record there as a file')
    with open(path, encoding='utf-8') as f:
        text = f.read()
    if not text.strip():
        raise ResultsError(f'{path}: empty; a study writes its record there when it finishes')
    try:
        recorded = json.loads(text)
    except json.JSONDecodeError as e:
        raise ResultsError(f'{path}: not JSON ({e.msg} at line {e.lineno})') from None
    validate_record(recorded, path, transfer=transfer)
    return recorded


def validate_record(recorded: Any, where: str, *, transfer: bool = False) -> None:
    """Checks a whole `results.json`: the study's wall time and run timings, then a study's
    record (`validate`), or a transfer study's (one with `budgets`): its config's `tasks`,
    its label budgets not empty, each keyed by its `label_fraction` in (0, 1] and a study
    record of its own (`validate`) with the study's config, its labelled image count, the
    source seed of each of its seeds and its lr sweeps.

    Args:
        recorded: the file's content, as JSON reads it.
        where: the file, at the start of every message.
        transfer: the record must be a transfer study's.

    Raises:
        ResultsError: one line, '<where>: <field>: <problem>', for the first field that does
            not fit.
    """
    def bad(name: str, problem: str) -> ResultsError:
        return ResultsError(f'{where}: {name}: {problem}')

    if not isinstance(recorded, dict):
        raise bad('the file', f'expected a JSON object, got {type(recorded).__name__}')
    if transfer and not isinstance(recorded.get('budgets'), dict):
        raise ResultsError(f'{where}: no label budgets; the headline reads transfer studies '
                           '(their fashion records)')
    if not _finite(recorded.get('seconds')) or recorded['seconds'] < 0:
        raise bad('seconds', f'expected the wall time in seconds, got {recorded.get("seconds")!r}')
    timings, reused = recorded.get('timings', {}), recorded.get('reused', [])
    if not isinstance(timings, dict) or not all(_finite(t) for t in timings.values()):
        raise bad('timings', f'expected {{run: seconds}}, got {timings!r}')
    if not isinstance(reused, list) or not all(isinstance(n, str) for n in reused):
        raise bad('reused', f'expected the names of runs read back, got {reused!r}')
    if 'budgets' not in recorded:
        validate(recorded, where)
        return
    _fields(recorded, {'config': dict, 'budgets': dict}, '', bad)
    if 'tasks' not in recorded['config']:
        raise bad('config.tasks', 'missing: a study with label budgets has two tasks')
    if not recorded['budgets']:
        raise bad('budgets', 'empty; a transfer study records at least one label budget')
    for key, sub in recorded['budgets'].items():
        prefix = f'budgets.{key}.'
        validate(sub, where, prefix)
        if sub['config'] != recorded['config']:
            raise bad(f'{prefix}config', 'differs from the study\'s config (the top-level one)')
        fraction = sub.get('label_fraction')
        if not _finite(fraction) or not 0 < fraction <= 1:
            raise bad(f'{prefix}label_fraction', f'expected a fraction in (0, 1], got {fraction!r}')
        if key != f'{fraction:g}':
            raise bad(f'budgets.{key}', f'keyed {key!r}, but its label_fraction is {fraction:g}')
        if not _integer(sub.get('labelled')) or sub['labelled'] < 0:
            raise bad(f'{prefix}labelled', f'expected an image count, got {sub.get("labelled")!r}')
        pairs = sub.get('upstream_seed')
        if (not isinstance(pairs, dict) or sorted(pairs) != sorted(str(s) for s in sub['seeds'])
                or not all(_integer(v) for v in pairs.values())):
            raise bad(f'{prefix}upstream_seed', f'expected the source seed of each of the seeds '
                                                f'{sub["seeds"]}, got {pairs!r}')
        sweeps = sub.get('descend_sweeps') or {}
        if not isinstance(sweeps, dict):
            raise bad(f'{prefix}descend_sweeps', f'expected {{row shape budget: {{lr: accuracy}}}}, got {sweeps!r}')
        for name, sweep in sweeps.items():
            if (not isinstance(sweep, dict) or not sweep or not all(_finite(a) for a in sweep.values())
                    or not all(_number_text(lr) for lr in sweep)):
                raise bad(f'{prefix}descend_sweeps.{name}', f'expected {{lr: accuracy}}, got {sweep!r}')


def _number_text(text: str) -> bool:
    """Whether `text` reads as a finite number ('0.001')."""
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def claims(recorded: dict, where: str) -> tuple[Claim, ...]:
    """The paper claims of the experiment a record names.

    Args:
        recorded: a record that passed `validate_record`.
        where: the file, at the start of the message.

    Returns:
        The claims of `jlearngene.experiments.<config.experiment>`'s STUDY.

    Raises:
        ResultsError: `config.experiment` names no experiment.
    """
    from jlearngene.experiments import harness
    try:
        return harness.module(recorded['config']['experiment']).STUDY.claims
    except ValueError as e:
        raise ResultsError(f'{where}: config.experiment: {e}') from None


@dataclasses.dataclass(frozen=True)
class Claim:
    """One paper claim as a test on the rows.

    kind 'reaches': `method` at `fraction` reaches the target (Scratch's converged mean − 0.5
      pt) at every shape; with `flops_ratio`, also with at most that fraction of Scratch's
      total training FLOPs (the sum over shapes of S·step; the method's upstream without the
      teacher, as the papers count, plus its descendants' own FLOPs).
    kind 'beats': `method` at `fraction` above `other` (at `other_fraction`, default the same)
      at every shape: the mean accuracy at least `MIN_GAP` (0.5 pt) higher and Welch's t-test
      on the seeds' accuracies p < `ALPHA` (`welch`; with both sides constant p is n/a and
      the shape does not count; with fewer than 2 seeds on either side the shape is not
      tested, and a claim with no tested shape is 'not testable here').
    kind 'close': `method` at `fraction` no more than `tolerance` below `other` at every shape
      (mean against mean; the sample stds are reported).
    kind 'cheaper': `method` at `fraction` reaches the target with fewer training FLOPs than
      `other` (default Scratch's converged runs) at every shape: per seed, its own FLOPs to
      the target plus its upstream without the pretrained source; the method's mean lower
      with Welch's p < `ALPHA` on the per-seed FLOPs (no minimum gap; fewer than 2 seeds on
      either side: that shape is not tested, as for 'beats'), and with `flops_ratio` at most
      that fraction of the other's mean.
    `shapes` limits a claim to those shapes ((width, depth) or (width, depth, heads); default:
    every shape).
    """
    text: str
    kind: str
    method: str
    fraction: float
    other: str = ''
    other_fraction: float | None = None
    flops_ratio: float | None = None
    tolerance: float = 0.01
    shapes: tuple[tuple[int, ...], ...] | None = None


def reach(curve, start: float, per_step: float, target: float) -> float | None:
    """FLOPs at which a curve [(step, accuracy)] first reaches `target`: `start` plus the
    steps taken, linear between evaluations; None if it never does."""
    pts = [(start + s * per_step, a) for s, a in curve]
    for i, (x, y) in enumerate(pts):
        if y >= target:
            if i == 0:
                return x
            x0, y0 = pts[i - 1]
            return x0 + (x - x0) * (target - y0) / (y - y0)
    return None


def finish(results: dict, claims: Sequence[Claim]) -> dict:
    """`results` with what follows from its raw records computed: each record's target,
    FLOPs to the target and upstream FLOPs (with and without the pretrained source), the
    'summary' and the 'verdicts'."""
    gap = float(results['config']['target_gap'])
    for key, base in results['scratch'].items():    # Scratch's spread from its own records
        accs = [r['acc'] for r in results['rows'] if r['name'] == 'scratch' and shape_key(r['shape']) == key]
        if accs:
            base['std'] = _mean_std(accs)[1]
    for r in results['rows']:
        r['target'] = results['scratch'][shape_key(r['shape'])]['acc'] - gap
        r['reach_flops'] = reach(r['curve'], r['extra_flops'], r['step_flops'], r['target'])
        ups = results['upstream_flops'].get(str(r['seed']), {})
        r['upstream_flops'] = sum(ups.get(u, 0.0) for u in r['upstream'])
        r['upstream_flops_without_source'] = sum(ups.get(u, 0.0) for u in r['upstream']
                                                 if not pretrained(u))
    results['summary'] = summarise(results, [float(x) for x in results['config']['amortise']])
    results['verdicts'] = [verdict(c, results) for c in claims]
    return results


def _mean_std(xs) -> tuple[float, float]:
    """Mean and sample std (ddof = 1) over seeds; std 0.0 for a single seed (undefined there,
    and JSON has no NaN: `welch` keeps such a comparison from counting)."""
    xs = np.asarray(xs, dtype=float)
    return float(np.mean(xs)), (float(np.std(xs, ddof=1)) if len(xs) > 1 else 0.0)


def welch(a, b) -> float | None:
    """The two-sided p-value of Welch's t-test of samples `a` against `b`
    (`scipy.stats.ttest_ind(a, b, equal_var=False)`); None where it cannot be computed:
    fewer than 2 values on either side, or both samples constant."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(a) < 2 or len(b) < 2 or (np.ptp(a) == 0 and np.ptp(b) == 0):
        return None
    with warnings.catch_warnings():     # scipy's precision note on a constant side: its variance is 0
        warnings.simplefilter('ignore', RuntimeWarning)
        p = float(stats.ttest_ind(a, b, equal_var=False).pvalue)
    return p if math.isfinite(p) else None


def _p_text(p: float | None) -> str:
    return 'p n/a' if p is None else f'p {p:.3g}'


def _too_few_seeds(n: int, m: int) -> str:
    """Why a comparison of `n` seeds against `m` is not tested: Welch's test needs at least 2
    on each side (a one-seed study, `,quick`, gives neither a finding nor its absence)."""
    return f"p n/a: {n} seed{'s' * (n != 1)} against {m}, too few for Welch's test"


def summarise(results: dict, amortise: Sequence[float]) -> list[dict]:
    """One record per (row name, shape, fraction, `budget_kind`): mean ± sample std (ddof = 1, 0.0 for one
    seed) of the final accuracy over seeds, the mean initial accuracy, seeds that reached the
    target, mean FLOPs to the target (own, and with the upstream without the pretrained source
    amortised over N = amortise[0]), the own FLOPs, the upstream with and without the
    pretrained source, and the amortised total per descendant for each N (without the source,
    the papers' count, and with it)."""
    groups: dict[tuple, list[dict]] = {}
    for r in results['rows']:
        groups.setdefault((r['name'], tuple(r['shape']), r['fraction'], budget_kind(r)), []).append(r)
    out = []
    for (name, shape, fraction, kind), rs in groups.items():
        acc, std = _mean_std([r['acc'] for r in rs])
        own = float(np.mean([r['extra_flops'] + r['finetune_flops'] for r in rs]))
        up = float(np.mean([r['upstream_flops'] for r in rs]))
        up_wo = float(np.mean([r['upstream_flops_without_source'] for r in rs]))
        reached = [r['reach_flops'] for r in rs if r['reach_flops'] is not None]
        s = dict(name=name, label=rs[0]['label'], shape=list(shape), fraction=fraction, budget=kind,
                 seeds=len(rs), acc=acc, std=std, target=rs[0]['target'],
                 acc_init=None if rs[0]['acc_init'] is None else _mean_std([r['acc_init'] for r in rs])[0],
                 steps=int(round(np.mean([r['steps'] for r in rs]))),
                 steps_taken=float(np.mean([r['steps_taken'] for r in rs])),
                 reached=len(reached), own_flops=own, upstream_flops=up,
                 upstream_flops_without_source=up_wo,
                 reach_flops=float(np.mean(reached)) if len(reached) == len(rs) else None,
                 amortised={f'{n:g}': dict(without_source=up_wo / n + own, with_source=up / n + own)
                            for n in amortise})
        if name == 'scratch':
            s.update(lr=rs[0]['lr'], plateau_step=int(round(np.mean(
                [r['plateau_step'] for r in rs]))), converged=all(r['converged'] for r in rs))
        out.append(s)
    scratch = {tuple(s['shape']): s for s in out if s['name'] == 'scratch'}
    for s in out:
        base = scratch.get(tuple(s['shape']))
        if s['name'] == 'scratch' or base is None or s['reach_flops'] is None or base['reach_flops'] is None:
            continue
        own = s['reach_flops']
        s['break_even'] = {k: break_even(s[u], own, base['reach_flops'])
                           for k, u in (('without_source', 'upstream_flops_without_source'),
                                        ('with_source', 'upstream_flops'))}
    return out


def budget_kind(run: dict) -> str:
    """'paper' (a fraction of S from the method's paper, for the verdicts) or 'equal'
    (Scratch's own steps at that shape, for the value) of a run or summary record; a record
    without the field is at its paper's budget."""
    return run.get('budget', 'paper')


def break_even(upstream: float, per_descendant: float, scratch_per_descendant: float) -> int | None:
    """The least number of descendants N ≥ 1 at which a method (upstream U, c per
    descendant) costs less than Scratch (c_s per descendant): U + N·c < N·c_s; None when
    c ≥ c_s (never)."""
    saving = scratch_per_descendant - per_descendant
    if saving <= 0:
        return None
    return max(1, math.floor(upstream / saving) + 1)


def _runs(rows, name, shape, fraction, kind: str = 'paper') -> list[dict]:
    """The records (one per seed) of a row at a shape and budget (`budget_kind`)."""
    return [r for r in rows if r['name'] == name and tuple(r['shape']) == tuple(shape)
            and r['fraction'] == fraction and budget_kind(r) == kind]


def _reached(rows, name, shape, fraction) -> tuple[int, int]:
    """(seeds that reached the target, seeds) of a row at a shape."""
    mine = _runs(rows, name, shape, fraction)
    return sum(r['reach_flops'] is not None for r in mine), len(mine)


def _to_target(rows, name, shape, fraction) -> list[float] | None:
    """Per seed: own FLOPs to the target plus the upstream without the pretrained source;
    None unless every seed reached it."""
    mine = _runs(rows, name, shape, fraction)
    if not mine or any(r['reach_flops'] is None for r in mine):
        return None
    return [r['reach_flops'] + r['upstream_flops_without_source'] for r in mine]


def _find(summary, name, shape, fraction, kind: str = 'paper'):
    return next((s for s in summary if s['name'] == name and tuple(s['shape']) == tuple(shape)
                 and s['fraction'] == fraction and budget_kind(s) == kind), None)


def _not_run(results: dict, name: str, fraction: float, shapes) -> str:
    """What was not run, in words: the row at that budget, or at those shapes."""
    if not any(r['name'] == name and r['fraction'] == fraction for r in results['rows']):
        return f'{name} was not run at {fraction:g}·S'
    if not shapes:
        return "the claim's shapes are none of the study's"
    return f"{name} was not run at {', '.join(shape_text(s) for s in shapes)} at {fraction:g}·S"


def _untuned_on_a_new_task(claim: Claim, results: dict) -> str | None:
    """Why an accuracy claim at 0·S says nothing where the descendants learn a new task (the
    study's `tasks` differ): each has a freshly drawn head for the new classes, so every
    row is at chance before tuning. None where the claim is testable."""
    tasks = results.get('config', {}).get('tasks') or {}
    new_task = tasks.get('descendant') is not None and tasks.get('descendant') != tasks.get('ancestor')
    other_f = claim.fraction if claim.other_fraction is None else claim.other_fraction
    at_zero = claim.fraction == 0 or (claim.other is not None and other_f == 0)
    if not new_task or claim.kind == 'cheaper' or not at_zero:
        return None
    accs = [s['acc'] for s in results['summary'] if s['fraction'] == 0 and s['name'] != 'scratch']
    return (f'at 0·S every descendant has a freshly drawn head for the new task, so every row is '
            f'near chance: {min(accs):.3f}–{max(accs):.3f} (chance {1 / len(tasks["descendant"]):.3f})')


def verdict(claim: Claim, results: dict) -> dict:
    """{'claim', 'verdict': 'reproduced' | 'not reproduced' | 'not testable here', 'detail'}:
    the claim checked at every shape the method makes, in numbers. A shape where Welch's test
    cannot run for want of seeds (fewer than 2 on a side) is listed but decides nothing; a
    claim where every compared shape is such is 'not testable here'."""
    summary, shapes = results['summary'], [tuple(s) for s in results['shapes']]
    if claim.shapes is not None:
        shapes = [s for s in shapes if s in {tuple(x) for x in claim.shapes}]
    mine = [(sh, _find(summary, claim.method, sh, claim.fraction)) for sh in shapes]
    mine = [(sh, s) for sh, s in mine if s is not None]
    if not mine:
        return dict(claim=claim.text, verdict='not testable here',
                    detail=_not_run(results, claim.method, claim.fraction, shapes))
    untuned = _untuned_on_a_new_task(claim, results)
    if untuned:
        return dict(claim=claim.text, verdict='not testable here', detail=untuned)
    parts, ok = [], True
    if claim.kind == 'reaches':
        for sh, s in mine:
            good = s['acc'] >= s['target']
            ok &= good
            parts.append(f"{shape_text(sh)}: {s['acc']:.3f} ± {s['std']:.3f} vs target "
                         f"{s['target']:.3f} ({'met' if good else 'missed'})")
        if claim.flops_ratio is not None:
            scratch_total = sum(_find(summary, 'scratch', sh, 1.0)['own_flops'] for sh, _ in mine)
            total = mine[0][1]['upstream_flops_without_source'] + sum(s['own_flops'] for _, s in mine)
            with_source = mine[0][1]['upstream_flops'] + sum(s['own_flops'] for _, s in mine)
            ratio = total / scratch_total
            ok &= ratio <= claim.flops_ratio
            parts.append(f'total FLOPs {ratio:.2f}× Scratch\'s converged runs without the pretrained source '
                         f'({with_source / scratch_total:.2f}× with it; claim ≤ {claim.flops_ratio:g}×)')
    elif claim.kind in ('beats', 'close'):
        other_f = claim.fraction if claim.other_fraction is None else claim.other_fraction
        untestable = []
        for sh, s in mine:
            o = _find(summary, claim.other, sh, other_f)
            if o is None:
                continue
            diff = s['acc'] - o['acc']
            text = (f"{shape_text(sh)}: {s['acc']:.3f} ± {s['std']:.3f} vs {o['acc']:.3f} ± "
                    f"{o['std']:.3f} (Δ {diff:+.3f}, ")
            if claim.kind == 'beats':
                a, b = (_runs(results['rows'], claim.method, sh, claim.fraction),
                        _runs(results['rows'], claim.other, sh, other_f))
                if min(len(a), len(b)) < 2:
                    untestable.append(text + _too_few_seeds(len(a), len(b)) + ')')
                    continue
                p = welch([r['acc'] for r in a], [r['acc'] for r in b])
                good = diff >= MIN_GAP and p is not None and p < ALPHA
                test = _p_text(p)
            else:
                good = diff >= -claim.tolerance
                test = f'tolerance {claim.tolerance:.3f}'
            ok &= good
            parts.append(text + test + ')')
        if untestable and not parts:
            return dict(claim=claim.text, verdict='not testable here', detail='; '.join(untestable))
        parts += untestable
        if not parts:
            return dict(claim=claim.text, verdict='not testable here',
                        detail=_not_run(results, claim.other, other_f, [sh for sh, _ in mine]))
    elif claim.kind == 'cheaper':
        other = claim.other or 'scratch'
        other_f = 1.0 if other == 'scratch' else (
            claim.fraction if claim.other_fraction is None else claim.other_fraction)
        untestable = []
        for sh, _ in mine:
            a = _to_target(results['rows'], claim.method, sh, claim.fraction)
            b = _to_target(results['rows'], other, sh, other_f)
            if b is None:      # no baseline cost to compare with, unless the method does worse
                na, nb = (_reached(results['rows'], n, sh, f) for n, f in
                          ((claim.method, claim.fraction), (other, other_f)))
                text = (f'{shape_text(sh)}: {claim.method} reached the target in {na[0]}/{na[1]} '
                        f'seeds, {other} in {nb[0]}/{nb[1]}')
                if na[0] < nb[0]:
                    ok = False
                    parts.append(text)
                else:
                    untestable.append(text + ': not every seed of either')
                continue
            if a is None:
                ok = False
                parts.append(f'{shape_text(sh)}: not every {claim.method} seed reached the target')
                continue
            (ma, sa), (mb, sb), p = _mean_std(a), _mean_std(b), welch(a, b)
            ratio = f'{ma / mb:.2f}×' if mb > 0 else f'{other} there from the start'  # grown at the target
            text = (f"{shape_text(sh)}: {ma / 1e9:.3g} ± {sa / 1e9:.2g} vs {mb / 1e9:.3g} ± "
                    f"{sb / 1e9:.2g} GFLOPs to the target ({ratio}, ")
            if min(len(a), len(b)) < 2:
                untestable.append(text + _too_few_seeds(len(a), len(b)) + ')')
                continue
            good = (ma < mb and p is not None and p < ALPHA
                    and (claim.flops_ratio is None or ma / mb <= claim.flops_ratio))
            ok &= good
            parts.append(text + _p_text(p) + ')')
        if untestable and not parts:
            return dict(claim=claim.text, verdict='not testable here', detail='; '.join(untestable))
        parts += untestable
    else:
        raise ValueError(f'claim kind {claim.kind!r}; expected reaches, beats, close or cheaper')
    return dict(claim=claim.text, verdict='reproduced' if ok else 'not reproduced',
                detail='; '.join(parts))


def _against(rows, s: dict, own: bool, scratch: list[float]) -> dict:
    """A summary `s` against Scratch's accuracies `scratch` at its shape: its numbers, Δ and
    Welch's p (None for Scratch itself)."""
    mine = _runs(rows, s['name'], s['shape'], s['fraction'], budget_kind(s))
    best = [r['acc_at_best_val'] for r in mine if 'acc_at_best_val' in r]
    return dict(fraction=s['fraction'], seeds=s['seeds'], acc=s['acc'], std=s['std'], summary=s,
                acc_at_best_val=float(np.mean(best)) if best else None,
                delta=s['acc'] - float(np.mean(scratch)),
                p=None if own else welch([r['acc'] for r in mine], scratch))


def versus_scratch(results: dict) -> list[dict]:
    """Per shape, Scratch's converged runs and then each row: at its paper's budget (its
    largest), the final test accuracy (mean ± sample std), the test accuracy at the best
    validation step where recorded, Δ against Scratch's mean and Welch's p against
    Scratch's runs; under 'equal', the same at Scratch's own steps where the row trained
    there (None otherwise); and the ceiling share (row − Scratch) / (ceiling − Scratch) at
    equal budget where both have it (a record without equal budgets: at the largest), None
    unless the 'ceiling' row is above Scratch. A row with only Scratch's steps (the
    ceiling) reports them in both places. Pure in the finished record (`finish`): a transfer
    study's label budget."""
    rows, summary, out = results['rows'], results['summary'], []
    for shape in results['shapes']:
        scratch = [r['acc'] for r in _runs(rows, 'scratch', shape, 1.0)]
        if not scratch:
            continue
        base = float(np.mean(scratch))
        paper, equal = {}, {}
        for s in summary:
            if tuple(s['shape']) != tuple(shape):
                continue
            if budget_kind(s) == 'equal':
                equal[s['name']] = s
            elif s['fraction'] >= paper.get(s['name'], s)['fraction']:
                paper[s['name']] = s


        on_equal = 'ceiling' in equal
        ceiling = (equal if on_equal else paper).get('ceiling')
        gain = None if ceiling is None else ceiling['acc'] - base
        for name in ['scratch'] + list(results['rows_spec']):
            s, e = paper.get(name) or equal.get(name), equal.get(name)
            if s is None:
                continue
            own = name == 'scratch'
            share_from = e if on_equal else s
            out.append(dict(name=name, label=s['label'], shape=list(shape), scratch=base,
                            **_against(rows, s, own, scratch),
                            equal=None if e is None or own else _against(rows, e, own, scratch),
                            ceiling_share=0.0 if own else (
                                None if not gain or gain <= 0 or share_from is None
                                else (share_from['acc'] - base) / gain)))
    return out
