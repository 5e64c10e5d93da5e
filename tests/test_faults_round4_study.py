"""Faults and friction, round four (issue 69), the study side: each test names the fault it
guards against. A transfer study whose source task has another class count than the
descendants' (the Aux-Net, the small model and the operators on the source task's classes),
a nested config field given in the wrong shape, a results.json whose fields do not fit
together, a headline that does not say what it shows, and a config file that defines a
bundled study's transfer variant."""
import copy
import json
import os
import re

import jax
import numpy as np
import pytest

from helpers import cli_error

from jlearngene import cli
from jlearngene.experiments import configs, harness, headline, results, study
from jlearngene.experiments.configs import section
from jlearngene.models import init
from jlearngene.models.config import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TLEG_FASHION = os.path.join(ROOT, 'experiments', 'tleg', 'fashion')
MANGO = os.path.join(ROOT, 'experiments', 'mango')
SOURCE, DOWNSTREAM = (0, 1, 2), (3, 4, 5, 6, 7)      # 3 source classes, 5 downstream


# ----------------------------------------------------------------------------------------
# 3. Models of the source task have its class count.

def _two_tasks(name: str, **fields):
    """The bundled config `name` on two tasks of the digits: 3 source classes, 5 downstream."""
    c = configs.load(name)
    c.unlock()
    c.tasks = section(ancestor=SOURCE, descendant=DOWNSTREAM)
    c.update(fields)
    return harness.plain(c)


def _upstream_context(config, workdir) -> harness.Context:
    """A study's context as the protocol leaves it before the upstream runs: the teacher of
    seed 0 (freshly drawn: only its class count matters here) on the source task, S = 2."""
    ctx = harness.Context(config, str(workdir))
    ctx.rows = study.make_rows(config)
    ctx.plan, ctx.shapes = study._plan(ctx, ctx.rows), study.study_shapes(config)
    ctx.t_cfg = harness.shape_configs(config, (ctx.ref.width, ctx.ref.depth),
                                      ctx.ancestor_dset.num_classes)[0]
    ctx.teachers, ctx.S_ref = {0: init(ctx.t_cfg, jax.random.key(0))}, 2
    return ctx


def _shapes(tree):
    return jax.tree.map(np.shape, tree)


@pytest.mark.parametrize('name, method', [
    ('tleg:smoke', 'tleg'),
    pytest.param('letra:smoke', 'letra', marks=pytest.mark.slow),    # the same recipe, a bigger gene
])
def test_the_aux_net_distils_on_the_source_task_s_classes(name, method, tmp_path):
    """The Aux-Net was built with the descendants' 5 classes and its KL loss refused the
    teacher's 3 logits, after the teacher's whole sweep: it has the source task's classes,
    its gene's shapes are what the plan said, and the descendants get a head for 5 (the
    protocol's upstream and descendant steps of one seed, from a freshly drawn teacher)."""
    config = _two_tasks(name, methods=(method,))
    ctx = _upstream_context(config, tmp_path)
    row = ctx.rows[0]
    up = row.recipe.upstream(ctx, ctx.rows, 0)
    gene = up.genes[row.name]
    assert 0 <= up.info[f'aux_{method}_accuracy'] <= 1
    shape = ctx.shapes[-1]
    d_cfg = ctx.plan[row.name][shape]
    assert _shapes(row.recipe.gene_shapes(ctx, row, d_cfg)) == _shapes(gene)
    params, _ = row.recipe.descendant(ctx, row, up, d_cfg, jax.random.key(1), 4, 0)
    assert params['head']['bias'].shape == (len(DOWNSTREAM),)


@pytest.mark.slow
def test_the_small_model_and_the_operator_train_on_their_own_tasks(tmp_path):
    """The small model the growth methods grow trained on the source task with the
    descendants' class count; it has the source's, and Mango's operator grows it into the
    descendant with a fresh head for the descendants' task, trained with the operator."""
    config = _two_tasks('mango:smoke', methods=('mango',), shapes=((32, 2),))
    config['small'].update(converged=False, fraction=1.0)
    ctx = _upstream_context(config, tmp_path)
    row = ctx.rows[0]
    up = row.recipe.upstream(ctx, ctx.rows, 0)
    assert up.genes[row.name]['head']['bias'].shape == (len(SOURCE),)
    d_cfg = ctx.plan[row.name][(32, 2)]
    assert not isinstance(d_cfg, str), d_cfg
    params, extra = row.recipe.descendant(ctx, row, up, d_cfg, jax.random.key(1), 20, 0)
    assert params['head']['bias'].shape == (len(DOWNSTREAM),) and extra > 0
    assert 0 <= harness.accuracy(params, d_cfg, ctx.dset) <= 1


def test_a_recipe_that_cannot_serve_two_tasks_refuses_before_anything_trains(tmp_path):
    """Scala's sub-networks keep the head trained on the source task's 3 classes: refused up
    front, by the recipe's check, which the protocol runs before anything trains."""
    config = _two_tasks('scala:smoke')
    row = study.make_rows(config)[0]
    with pytest.raises(ValueError, match='keep its head'):
        row.recipe.check(harness.Context(config, num_classes=len(DOWNSTREAM)), [row])
    with pytest.raises(ValueError, match='keep its head'):
        study.run_experiment(config, str(tmp_path / 'w'), quiet=True)
    assert not os.path.exists(tmp_path / 'w' / 'runs')


@pytest.mark.slow
def test_a_converged_small_model_of_two_tasks_is_trained_as_the_teacher_is(tmp_path):
    """With two tasks, `small.converged` was refused (a converged small model was Scratch's
    run of the descendants' task): it is now a model of the source task with its own sweep,
    doubled to convergence (`scratch.baseline`, tag 'small'), shown in the record and its
    report beside the teacher."""
    from jlearngene.experiments import report, scratch
    from jlearngene.experiments.recipes import grown
    config = _two_tasks('mango:smoke', methods=('mango',), shapes=((32, 2),))
    config['small'].update(converged=True, fraction=0.0)
    config['scratch'].update(lrs=(1e-3, 3e-3), max_steps=24)
    ctx = _upstream_context(config, tmp_path)
    row = ctx.rows[0]
    row.recipe.check(ctx, ctx.rows)
    params, steps, acc = grown.small_model(ctx, 0)
    cfg = grown.small_config(ctx)
    assert params['head']['bias'].shape == (len(SOURCE),)
    made = ctx.memo[scratch.UPSTREAM_MODELS][f'small {results.shape_key((cfg.width, cfg.depth))}']
    assert steps == made['steps'] and acc == made['runs'][0]['acc']
    assert made['doubling'][0][0][0] == config['scratch']['steps'] and len(made['doubling'][0]) >= 2
    assert made['sweeps'][0]['steps'] == config['scratch']['steps']
    record = study._upstream_models(ctx)['upstream_models']
    assert 'params' not in record[f'small {results.shape_key((cfg.width, cfg.depth))}']
    lines = report.upstream_model_lines({'upstream_models': record})
    assert any(line.startswith(f'**Small model w{cfg.width} L{cfg.depth}** (source task)') for line in lines)


def test_a_small_model_of_no_steps_is_refused(tmp_path):
    config = harness.plain(configs.load('mango:smoke'))
    config['small'].update(converged=False, fraction=0.0)
    row = study.make_rows(config)[0]
    with pytest.raises(ValueError, match='small.fraction=0.0 trains the small model for no steps'):
        row.recipe.check(harness.Context(config, num_classes=10), [row])


# ----------------------------------------------------------------------------------------
# 7. A nested config field keeps its shape.

@pytest.mark.parametrize('key, text, says', [
    ('labels.seeds', '0,1', r'labels\.seeds must be a tuple of tuples of integers \(it is \(\(0, 1, 2, 3, 4\)'),
    ('shapes', '64,3', r'shapes must be a tuple of tuples of integers'),
    ('labels.scratch_steps', '1.5,2', r'labels\.scratch_steps must be a tuple of integers'),
    ('methods', '1,2', r'methods must be a tuple of strings'),
])
def test_a_nested_config_field_in_another_shape_is_one_line(key, text, says, capsys, tmp_path):
    """`--config.labels.seeds=0,1` was accepted and failed later in a TypeError traceback."""
    with pytest.raises(ConfigError, match=says):
        configs.load('tleg:fashion', {key: text}, from_text=True)
    line = cli_error(capsys, ['train', '--config', 'tleg:fashion', f'--config.{key}={text}',
                              '--workdir', str(tmp_path / 'w')], 'train', code=2)
    assert key in line
    assert not os.path.exists(tmp_path / 'w')


def test_a_nested_config_field_in_its_own_shape_is_taken(tmp_path):
    c = configs.load('tleg:fashion', {'labels.seeds': '((0, 1), (2,))', 'shapes': '((64, 3), (64, 6, 2))',
                                      'scratch.lrs': '1,2,3'}, from_text=True)
    assert c.labels.seeds == ((0, 1), (2,)) and c.shapes == ((64, 3), (64, 6, 2))
    path = tmp_path / 'flat_seeds.py'      # a config file is held to its template's shapes too
    path.write_text('from jlearngene.experiments.configs import tleg\n\n\ndef get_config(arg=None):\n'
                    "    c = tleg.get_config('fashion')\n    c.labels.seeds = (0, 1)\n    return c\n")
    with pytest.raises(ConfigError, match=f'{path}: labels.seeds must be a tuple of tuples'):
        configs.load(str(path))


# ----------------------------------------------------------------------------------------
# 8. and 9. render and render --headline on records whose fields do not fit together.

def _first(record: dict) -> dict:
    return next(iter(record['budgets'].values()))


def _record(source: str) -> dict:
    with open(os.path.join(source, 'results.json'), encoding='utf-8') as f:
        return json.load(f)


def _write(folder, record) -> str:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, 'results.json'), 'w', encoding='utf-8') as f:
        json.dump(record, f)
    return str(folder)


def _drop_tasks(r):
    r['config'].pop('tasks')
    for sub in r['budgets'].values():
        sub['config'].pop('tasks')


def _amortise_zero(r):
    for config in [r['config']] + [sub['config'] for sub in r['budgets'].values()]:
        config['amortise'] = [0]


def _duplicate_run(r):
    rows = _first(r)['rows']
    rows.append(copy.deepcopy(next(x for x in rows if x['name'] == 'tleg')))


DAMAGES = {     # the ten kinds the issue found, and a repeated run (9)
    'a Scratch shape missing': (lambda r: _first(r)['scratch'].pop('w64_d3'),
                                r'budgets\.0\.01\.scratch\.w64_d3: missing'),
    'seeds empty': (lambda r: _first(r).update(seeds=[]), r'budgets\.0\.01\.seeds: empty'),
    'budgets empty': (lambda r: r.update(budgets={}), 'budgets: empty'),
    'a budget with no seeds': (lambda r: _first(r).update(seeds=[], rows=[], upstream_seed={}),
                               r'budgets\.0\.01\.seeds: empty'),
    'a shape of words': (lambda r: _first(r).update(shapes=[['a', 'b'], [64, 6]]),
                         r'budgets\.0\.01\.shapes\[0\]: expected \[width, depth\]'),
    'a shape of one number': (lambda r: _first(r)['rows'][0].update(shape=[64]),
                              r'budgets\.0\.01\.rows\[0\]\.shape: expected \[width, depth\]'),
    'amortise [0]': (_amortise_zero, r'config\.amortise: expected numbers of descendants > 0'),
    'a budget without label_fraction': (lambda r: _first(r).pop('label_fraction'),
                                        r'budgets\.0\.01\.label_fraction: expected a fraction'),
    'tasks removed': (_drop_tasks, r'config\.tasks: missing'),
    'a run repeated': (_duplicate_run, r'budgets\.0\.01\.rows\[\d+\]: repeats rows\[\d+\] \(tleg at w64 L3, seed'),
}


@pytest.mark.parametrize('damage, says', DAMAGES.values(), ids=list(DAMAGES))
def test_render_and_the_headline_refuse_a_record_that_does_not_fit_in_one_line(damage, says, tmp_path, capsys):
    """Each of these was a traceback (KeyError, IndexError, ZeroDivisionError,
    StopIteration), a wrong table or, for a repeated run, one more seed in Welch's p; now
    `results.read` refuses it, naming the file and the field, before anything renders."""
    record = _record(TLEG_FASHION)
    damage(record)
    folder = _write(tmp_path / 'record', record)
    for argv in (['render', folder, '--out', str(tmp_path / 'out')], ['render', '--headline', folder]):
        line = cli_error(capsys, argv, 'render')
        assert os.path.join(folder, 'results.json') in line
        assert results.ResultsError.__name__ not in line
        assert len(re.findall(says, line)) == 1, line
    assert not os.path.exists(tmp_path / 'out')


SAME_TASK_DAMAGES = {
    'seeds empty': (lambda r: r.update(seeds=[]), 'seeds: empty'),
    'a run repeated': (lambda r: r['rows'].append(copy.deepcopy(r['rows'][-1])), r'rows\[\d+\]: repeats rows'),
    'a seed not listed': (lambda r: r['rows'][0].update(seed=7), r'rows\[0\]\.seed: 7 is none of the record'),
    "a seed without Scratch's run": (
        lambda r: [x.update(seed=1) for x in r['rows'] if x['name'] == 'scratch' and x['seed'] == 0],
        r'rows\[\d+\]: repeats rows|rows: no Scratch run at w\d+ L\d+ for seed 0'),
    'a Scratch shape missing': (lambda r: r['scratch'].pop(next(iter(r['scratch']))),
                                r'scratch\.w\d+_d\d+: missing'),
    'no such experiment': (lambda r: r['config'].update(experiment='nonesuch'),
                           'config.experiment: unknown experiment'),
}


@pytest.mark.parametrize('damage, says', SAME_TASK_DAMAGES.values(), ids=list(SAME_TASK_DAMAGES))
def test_render_refuses_a_same_task_record_that_does_not_fit_in_one_line(damage, says, tmp_path, capsys):
    record = _record(MANGO)
    damage(record)
    folder = _write(tmp_path / 'record', record)
    line = cli_error(capsys, ['render', folder, '--out', str(tmp_path / 'out')], 'render')
    assert os.path.join(folder, 'results.json') in line and len(re.findall(says, line)) == 1


@pytest.mark.parametrize('damage, says', [(lambda c: c.pop('depth'), "config: no 'depth'"),
                                           (lambda c: c.update(methods=None), 'config: plans no study'),
                                           (lambda c: c.update(variants='x'), 'config: plans no study')],
                         ids=['depth missing', 'methods null', 'variants a string'])
def test_the_headline_refuses_a_record_whose_config_plans_no_study(damage, says, tmp_path, capsys):
    """The headline reads each gene's size from the study's plan: a config it cannot plan
    from was a KeyError, TypeError or AttributeError traceback."""
    record = _record(TLEG_FASHION)
    for config in [record['config']] + [sub['config'] for sub in record['budgets'].values()]:
        damage(config)
    folder = _write(tmp_path / 'record', record)
    line = cli_error(capsys, ['render', '--headline', folder], 'render')
    assert f"{os.path.join(folder, 'results.json')}: {says}" in line


@pytest.mark.parametrize('text, says', [('[{"config": {}}]', 'the file: expected a JSON object, got list'),
                                        ('', 'empty'), ('{"rows": [', 'not JSON')])
def test_render_and_the_headline_name_a_file_that_is_no_record(text, says, tmp_path, capsys):
    (tmp_path / 'results.json').write_text(text)
    for argv in (['render', str(tmp_path), '--out', str(tmp_path / 'out')], ['render', '--headline', str(tmp_path)]):
        line = cli_error(capsys, argv, 'render')
        assert f"{tmp_path / 'results.json'}: " in line and says in line


def test_the_headline_counts_a_folder_once_and_names_records_of_one_study_by_folder(tmp_path, capsys):
    """The same folder twice doubled every row; two records of one study were
    indistinguishable; --out was ignored."""
    a = _write(tmp_path / 'a', _record(TLEG_FASHION))
    b = _write(tmp_path / 'b', _record(TLEG_FASHION))
    line = cli_error(capsys, ['render', '--headline', a, os.path.join(a, '.')], 'render')
    assert 'the same record given twice' in line and a in line
    assert cli.main(['render', '--headline', a, b, '--out', str(tmp_path / 'out')]) == 0
    printed = capsys.readouterr().out
    written = (tmp_path / 'out' / 'headline.md').read_text()
    assert written.strip() in printed and f"wrote {tmp_path / 'out' / 'headline.md'}" in printed
    studies = [line.split(' | ')[0] for line in written.splitlines() if line.startswith('| tleg')]
    assert set(studies) == {f'| tleg ({a})', f'| tleg ({b})'}
    assert studies.count(f'| tleg ({a})') == studies.count(f'| tleg ({b})') > 0
    verdicts = written.splitlines()[-1]
    assert f'tleg ({a}) at 1 %' in verdicts and f'tleg ({b}) at 10 %' in verdicts


def test_a_study_without_label_budgets_is_not_called_one_without_claims():
    assert headline.verdict_line([('letra', {'budgets': {}})]).endswith('letra: no label budgets.')


# ----------------------------------------------------------------------------------------
# 10. A config file may define a bundled study's transfer variant.

def test_a_config_file_may_define_any_variant_of_its_study(tmp_path):
    """A file returning `letra.get_config('fashion')` was refused: "unknown config key
    'descend.lrs'", the template being letra's digits variant; keys of no variant still are."""
    path = tmp_path / 'my_letra.py'
    path.write_text('from jlearngene.experiments.configs import letra\n\n\n'
                    "def get_config(arg=None):\n    return letra.get_config('fashion')\n")
    c = configs.load(str(path))
    assert tuple(c.descend.lrs) == (3e-4, 1e-3, 3e-3) and tuple(c.tasks.ancestor) == (0, 1, 2, 3, 4)
    study.check(c.to_dict())
    path.write_text(path.read_text().replace("return letra.get_config('fashion')",
                                             "c = letra.get_config('fashion')\n    c.descend.lrz = (1e-3,)\n"
                                             '    return c'))
    with pytest.raises(ConfigError, match=r"unknown config key 'descend.lrz'.*known keys of descend: .*lrs"):
        configs.load(str(path))
