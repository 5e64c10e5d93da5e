"""The study harness (jlearngene/experiments/study.py): the protocol's rules, its arithmetic,
the paper configs' plans on shapes alone, and miniature runs of every study (slow tier)."""
import json
import os

import chex
import numpy as np
import pytest

from jlearngene import data
from jlearngene.experiments import cluster, compare, configs, harness, letra, mango, report, scala, scratch, study, tleg
from jlearngene.experiments import results as res

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Scratch's schedule in each paper (../shared/specs/tleg_letra_cluster.md): DeiT's recipe,
# 100 epochs at lr 5e-4 (batch 512) for TLEG's Table 1 and LeTra's Table 1; the comparison
# follows TLEG. Budget fractions of S: TLEG's Aux-Net 150 / 100 epochs, descendants 35 / 100;
# LeTra's Aux-Net 320 / 100 (its rebuttal), Des-Nets 0 and 5 / 100.
PAPER_SCRATCH = {'tleg': (100.0, 5e-4), 'letra': (100.0, 5e-4), 'compare': (100.0, 5e-4)}
PAPER_FRACTIONS = {'tleg': (1.5, (0.35,)), 'letra': (3.2, (0.0, 0.05)), 'compare': (1.5, (0.35,))}


@pytest.mark.parametrize('name', sorted(PAPER_SCRATCH))
def test_paper_config_plans_on_shapes_and_scratch_follows_the_paper(name):
    config = configs.load(f'{name}:paper')
    epochs, lr = PAPER_SCRATCH[name]
    assert config.scratch.epochs == epochs and config.scratch.steps == 0
    assert tuple(config.scratch.lrs) == (lr,)
    aux, fractions = PAPER_FRACTIONS[name]
    assert config.aux.fraction == aux and tuple(config.descend.fractions) == fractions
    study.check(config)                          # a paper config may follow a single lr
    plan = study.plan(config, 1000, harness.module(name).STUDY)   # jax.eval_shape of every descend
    shapes = {tuple(s) for s in config.shapes}
    assert set(plan['scratch']) == shapes
    made = {n: {s for s, c in p.items() if not isinstance(c, str)} for n, p in plan.items()}
    assert all(made[n] for n in made), made      # every method makes at least one shape
    if name == 'compare':
        assert made['tleg'] == made['he_lg'] == {(768, 6), (768, 12)}   # the Aux-Net's width only
        assert made['scala'] == {(384, 12), (576, 12), (768, 12)}        # its depth only
        assert (768, 6) not in made['mango']                              # growth never removes layers
        assert plan['scala'][(576, 12)].num_heads == 12                  # Scala keeps every head
    if name == 'tleg':
        assert all(c.pool_norm == 'after' for c in plan['scratch'].values())   # the official Des-Net
    if name == 'letra':
        assert made['letra/continuous'] == shapes


@pytest.mark.parametrize('module', [tleg, letra, compare, mango, scala, cluster],
                         ids=lambda m: m.__name__)
def test_every_claim_names_rows_and_budgets_its_study_runs(module):
    name = module.__name__.rsplit('.', 1)[1]
    config = configs.load(name)
    rows = {n for n, _, _ in study.variants(config)} | {'scratch'}
    fractions = set(config.descend.fractions) | {1.0}
    shapes = {tuple(s) for s in config.shapes}
    for claim in module.STUDY.claims:
        assert claim.method in rows and (not claim.other or claim.other in rows), claim
        assert claim.fraction in fractions, claim
        assert claim.shapes is None or set(claim.shapes) <= shapes, claim
        assert claim.kind in ('reaches', 'beats', 'close', 'cheaper'), claim


def test_the_sweep_cannot_be_switched_off_outside_the_paper_configs():
    for name in ('tleg', 'letra', 'compare'):
        config = configs.load(name)
        study.check(config)
        assert len(config.scratch.lrs) >= study.MIN_SWEEP and len(config.seeds) >= 3
        assert config.data.splits.test == 'half_test'
        with pytest.raises(ValueError, match='at least 3'):
            study.check(configs.load(name, {'scratch.lrs': (1e-3, 2e-3)}))
    for name in ('tleg', 'letra', 'cluster', 'scala', 'mango', 'compare'):
        # a digits Scratch still rising is trained again up to 4x its steps; a smoke never is
        assert configs.load(name).scratch.max_steps == 4 * configs.load(name).scratch.steps
        assert configs.load(f'{name}:smoke').scratch.max_steps == 0
    with pytest.raises(ValueError, match="'scratch' has no gene to make.*own baseline"):
        study.variants(configs.load('tleg', {'methods': ('scratch', 'tleg')}))
    with pytest.raises(ValueError, match="unknown method 'nosuch'"):
        study.variants(configs.load('tleg', {'methods': ('tleg', 'nosuch')}))
    assert [n for n, _, _ in study.variants(configs.load('letra:smoke'))] == [
        'letra/continuous', 'letra/random', 'imwlm']


def test_budget_fractions_of_the_spec():
    tleg, letra, compare = configs.load('tleg'), configs.load('letra'), configs.load('compare')
    assert tleg.aux.fraction == 1.5 and tuple(tleg.descend.fractions) == (0.35,)
    assert letra.aux.fraction == 3.2 and tuple(letra.descend.fractions) == (0.0, 0.05)
    assert compare.aux.fractions.letra == 3.2 and compare.operator.fraction == 0.05
    assert harness.fraction_steps(0.35, 1000) == 350 and harness.fraction_steps(0.0, 1000) == 0
    assert harness.fraction_steps(1e-4, 100) == 1


def test_plateau_step():
    rising = [(50 * i, a) for i, a in enumerate([0.5, 0.8, 0.9, 0.95, 0.96, 0.965, 0.97, 0.97, 0.971])]
    assert scratch.plateau(rising, 0.005) == 300          # first within 0.5 pt of 0.971 (0.97)
    assert scratch.plateau(rising[:5], 0.005) == 200      # ..., 0.9, 0.95, 0.96: S of its own run


def test_reach_interpolates_between_evaluations():
    curve = [(0, 0.1), (10, 0.3), (20, 0.7)]
    # start 5, 2 per step: x = 5, 25, 45; 0.5 is halfway between steps 10 and 20
    assert res.reach(curve, 5.0, 2.0, 0.5) == pytest.approx(35.0)
    assert res.reach(curve, 5.0, 2.0, 0.05) == 5.0
    assert res.reach(curve, 5.0, 2.0, 0.9) is None


def test_break_even_is_the_cost_arithmetic():
    # U + N·c < N·c_s  <=>  N > U / (c_s - c)
    assert res.break_even(100.0, 2.0, 7.0) == 21            # 100/5 = 20: a tie at 20
    assert res.break_even(99.0, 2.0, 7.0) == 20
    assert res.break_even(0.0, 1.0, 3.0) == 1                # no upstream: from the first
    assert res.break_even(10.0, 3.0, 3.0) is None            # no saving per descendant
    for u, c, cs in ((37.5, 1.25, 4.0), (1e12, 3e9, 8e9), (5.0, 0.0, 0.5)):
        n = res.break_even(u, c, cs)
        assert u + n * c < n * cs and (n == 1 or u + (n - 1) * c >= (n - 1) * cs)


def _record(name, seed, acc, *, shape=(8, 2), fraction=0.5, reach=None, up=30.0, up_wo=10.0):
    return dict(method=name.split('/')[0], name=name, label=name, shape=list(shape), seed=seed,
                fraction=fraction, steps=10, steps_taken=10, step_flops=0.9, lr=1e-3, acc_init=0.1, acc=acc,
                curve=[(0, 0.1), (10, acc)], params=100, extra_flops=1.0, finetune_flops=9.0,
                target=0.795, reach_flops=reach, upstream_flops=up, upstream_flops_without_source=up_wo,
                plateau_step=40, converged=True)


def _results(method_accs, scratch_accs=(0.80, 0.80, 0.80), reach=5.0):
    rows = [dict(_record('scratch', s, a, fraction=1.0, reach=20.0, up=0.0, up_wo=0.0))
            for s, a in enumerate(scratch_accs)]
    rows += [_record('tleg', s, a, reach=reach) for s, a in enumerate(method_accs)]
    rows += [_record('share_init', s, 0.70, reach=None) for s in range(3)]
    return dict(config={'amortise': (1, 4)}, shapes=[[8, 2]], rows=rows)


def test_summary_mean_std_amortised_cost_and_break_even():
    results = _results((0.90, 0.92, 0.94))
    s = {x['name']: x for x in res.summarise(results, (1, 4))}
    t = s['tleg']
    assert t['acc'] == pytest.approx(0.92) and t['std'] == pytest.approx(0.02)       # ddof = 1
    assert t['own_flops'] == 10.0 and t['reached'] == 3 and t['reach_flops'] == 5.0
    assert t['amortised']['1'] == {'without_source': 20.0, 'with_source': 40.0}
    assert t['amortised']['4'] == {'without_source': 12.5, 'with_source': 17.5}
    # 10 + N·5 < N·20 from N = 1; 30 + N·5 < N·20 from N = 3
    assert t['break_even'] == {'without_source': 1, 'with_source': 3}
    assert s['share_init']['reach_flops'] is None and 'break_even' not in s['share_init']
    assert s['scratch']['converged'] and s['scratch']['plateau_step'] == 40


def test_the_per_method_table_gives_each_shapes_steps():
    from jlearngene.experiments import report
    results = _results((0.90, 0.92, 0.94))
    wide = [dict(r, shape=[16, 2], steps=r['steps'] * 4, steps_taken=r['steps_taken'] * 4)
            for r in results['rows']]
    results.update(rows=results['rows'] + wide, shapes=[[8, 2], [16, 2]], rows_spec=['tleg', 'share_init'])
    results['summary'] = res.summarise(results, (1,))
    line = next(x for x in report.by_method(results) if x.startswith('| tleg |'))
    assert '| 0.5·S = 10–40 steps (by shape) | 2 |' in line, line
    results['rows'] = [r for r in results['rows'] if r['shape'] == [8, 2]]
    results['summary'] = res.summarise(results, (1,))
    assert '| 0.5·S = 10 steps | 1 |' in next(x for x in report.by_method(results) if x.startswith('| tleg |'))


def test_verdicts_count_a_difference_only_where_welch_says_so():
    beats = study.Claim('TLEG beats Share-Init', 'beats', 'tleg', 0.5, other='share_init')
    reaches = study.Claim('TLEG reaches', 'reaches', 'tleg', 0.5, flops_ratio=0.6)

    def check(accs, claim):
        results = _results(accs)
        results['summary'] = res.summarise(results, (1,))
        return res.verdict(claim, results)

    assert check((0.90, 0.92, 0.94), beats)['verdict'] == 'reproduced'          # Δ 0.22, p 0.0027
    noisy = check((0.40, 0.72, 1.0), beats)                                      # Δ 0.007, p 0.97
    assert noisy['verdict'] == 'not reproduced' and '(Δ +0.007, p 0.973)' in noisy['detail']
    # reaches 0.795 at 0.92, but FLOPs: upstream 10 + own 10 = 20 vs Scratch's own 10: 2× > 0.6×
    v = check((0.90, 0.92, 0.94), reaches)
    assert v['verdict'] == 'not reproduced' and '2.00×' in v['detail'] and 'met' in v['detail']
    assert check((0.70, 0.70, 0.70), dataclass_replace(reaches, flops_ratio=None))['verdict'] == 'not reproduced'
    assert check((0.90,) * 3, dataclass_replace(reaches, flops_ratio=None))['verdict'] == 'reproduced'
    missing = study.Claim('x', 'beats', 'mango', 0.5, other='tleg')
    assert check((0.9,) * 3, missing)['verdict'] == 'not testable here'


def test_close_cheaper_and_shape_limited_claims():
    results = _results((0.79, 0.80, 0.81), reach=5.0)
    results['summary'] = res.summarise(results, (1,))
    close = study.Claim('TLEG close to Share-Init', 'close', 'tleg', 0.5, other='share_init', tolerance=0.01)
    assert res.verdict(close, results)['verdict'] == 'reproduced'            # 0.80 ≥ 0.70 − 0.01
    behind = study.Claim('x', 'close', 'share_init', 0.5, other='tleg', tolerance=0.05)
    assert res.verdict(behind, results)['verdict'] == 'not reproduced'      # 0.10 below
    # per seed: own to target 4, 5, 6 + upstream w/o source 10 = 14, 15, 16 against Scratch's
    # 20 + 0 each: Welch p 0.013
    for r, reach in zip([r for r in results['rows'] if r['name'] == 'tleg'], (4.0, 5.0, 6.0)):
        r['reach_flops'] = reach
    cheaper = study.Claim('TLEG cheaper', 'cheaper', 'tleg', 0.5)
    v = res.verdict(cheaper, results)
    assert v['verdict'] == 'reproduced' and '(0.75×, p 0.0131)' in v['detail']
    assert res.verdict(dataclass_replace(cheaper, flops_ratio=0.5), results)['verdict'] == 'not reproduced'
    never = study.Claim('Share-Init cheaper', 'cheaper', 'share_init', 0.5)
    assert res.verdict(never, results)['verdict'] == 'not reproduced'       # no seed reached it
    results['rows'][0]['reach_flops'] = None                                  # a Scratch seed short of it
    v = res.verdict(cheaper, results)
    assert v['verdict'] == 'not testable here' and 'scratch in 2/3' in v['detail']
    assert res.verdict(never, results)['verdict'] == 'not reproduced'       # 0/3 against Scratch's 2/3
    elsewhere = dataclass_replace(close, shapes=((4, 4),))
    assert res.verdict(elsewhere, results)['verdict'] == 'not testable here'


def test_variants_name_a_gene_or_descend_option():
    mango = configs.load('mango')
    rows = study.variants(mango)
    assert [n for n, _, _ in rows][:3] == ['mango/1', 'mango/2', 'mango/4']
    assert rows[1][2] == {'gene': {'rank': 2}, 'descend': {}}
    made = {r.name: r for r in study.make_rows(mango)}
    assert made['mango/2'].gene == {'noise': 1e-2, 'remat': False, 'rank': 2}
    assert study.label(made['mango/2']) == 'Mango (R=2)'
    scala = {r.name: r for r in study.make_rows(configs.load('scala'))}
    assert scala['scala/official'].descend == {'rule': 'official', 'smallest': 0.25}
    assert study.label(scala['separate/flops']) == "Separate (Scala's flops)"
    assert scala['scala/official'].recipe.billed(scala['scala/official']) == ('scala/official',)
    with pytest.raises(ValueError, match='one gene or descend option'):
        study.variants(configs.load('mango', {'variants.mango': {'rank': (1, 2)}}))


def test_scala_study_plan_keeps_every_head_and_its_depth():
    config = configs.load('scala')
    plan = study.plan(config, 10, harness.module('scala').STUDY)
    assert plan['scratch'][(20, 4)].num_heads == 4 and plan['scratch'][(20, 4)].head_dim == 5
    assert plan['scala/clean'][(24, 4)].num_heads == 4
    assert plan['scala/official'][(24, 4)].ln_eps == 1e-5              # the official sub-network
    off_grid = {(w, 4) for w in range(20, 61, 8)}
    for name in ('separate/steps', 'separate/flops'):                # separate: the grid widths only
        assert all(isinstance(plan[name][s], str) == (s in off_grid) for s in plan['scratch'])
        assert 'width 20 is off the slimmable grid [16, 24,' in plan[name][(20, 4)]
    assert all(not isinstance(c, str) for n, p in plan.items() if not n.startswith('separate')
               for c in p.values())


def test_cluster_study_plan_two_tasks_and_head_counts():
    config = configs.load('cluster')
    plan = study.plan(config, 5, cluster.STUDY)
    shapes = [(32, 6, 4), (32, 6, 8), (32, 6, 16)]
    assert [(c.num_heads, c.head_dim) for c in (plan['scratch'][s] for s in shapes)] == [(4, 4), (8, 4), (16, 4)]
    assert all(not isinstance(plan[n][s], str) for n in ('cluster/clustered', 'cluster/random') for s in shapes)
    for baseline in ('pre_fin', 'he_lg', 'auto_lg'):     # the ancestor's 8 heads only
        assert [isinstance(plan[baseline][s], str) for s in shapes] == [True, False, True]
    # another task: every inherited head is replaced by a new one
    rows = {r.name: r for r in study.make_rows(config)}
    assert rows['cluster/clustered'].descend['head'] == 'new'
    assert rows['pre_fin'].descend['head'] == 'new'
    tleg_rows = {r.name: r for r in study.make_rows(configs.load('tleg'))}
    assert 'head' not in tleg_rows['pre_fin'].descend                  # its default: inherit
    assert tleg_rows['he_lg'].descend['head'] == 'new'


def test_info_describes_a_study_workdir_and_its_results(tmp_path, capsys):
    from jlearngene import cli
    results = _results((0.90, 0.92, 0.94))
    results.update(seeds=[0, 1, 2], verdicts=[{'claim': 'TLEG beats Share-Init', 'verdict': 'reproduced',
                                               'detail': ''}], config={'experiment': 'tleg', 'amortise': (1,)})
    (tmp_path / 'results.json').write_text(json.dumps(results))
    (tmp_path / 'runs').mkdir()
    assert cli.main(['info', str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f'experiment workdir {tmp_path}') and "experiment 'tleg'" in out
    assert '9 records, seeds [0, 1, 2]' in out and 'TLEG beats Share-Init: reproduced' in out
    assert 'runs/: 0 entries' in out


def test_info_tells_where_a_stopped_study_stands(tmp_path, capsys):
    """A study's workdir before its results: its finished runs and their seconds, the runs
    stopped part-way (at which step) or damaged, the superseded ones and how to resume;
    after, a transfer study's verdicts per label budget."""
    from jlearngene import cli
    (tmp_path / 'study.json').write_text(json.dumps({'experiment': 'cluster', 'config_sha256': 'x'}))
    for name, secs in (('ancestor_s0', 100.5), ('ancestor_s1', 200.0)):
        (tmp_path / 'runs' / name).mkdir(parents=True)
        (tmp_path / 'runs' / name / 'finished.json').write_text(json.dumps({'seconds': secs}))
    (tmp_path / 'runs' / 'ancestor_s1' / 'finished.json').write_text(json.dumps(
        {'seconds': 200.0, 'step': 3000, 'curve': [[1500, 0.8], [3000, 0.87654]],
         'val_curve': [[1500, 0.79], [3000, 0.861]]}))
    (tmp_path / 'runs' / 'scratch_s0').mkdir()
    (tmp_path / 'runs' / 'scratch_s0' / 'metrics.jsonl').write_text(
        '{"step": 50, "kind": "train"}\n{"step": 100, "kind": "eval"}\n')
    (tmp_path / 'runs' / 'scratch_s1').mkdir()
    (tmp_path / 'runs' / 'scratch_s1' / 'finished.json').write_text('{"seconds": ')
    (tmp_path / 'runs' / 'scratch_s2' / 'checkpoints' / '4000').mkdir(parents=True)   # resumable
    (tmp_path / 'runs' / 'scratch_s2' / 'progress.json').write_text('{}')
    (tmp_path / 'runs' / 'scratch_s2' / 'metrics.jsonl').write_text('{"step": 5150, "kind": "train"}\n')
    (tmp_path / 'superseded' / 'ancestor_s0').mkdir(parents=True)
    assert cli.main(['info', str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"study workdir {tmp_path}: the 'cluster' study, not finished")
    assert 'runs/: 2 finished (300 s of training), 3 unfinished: scratch_s0 (at step 100, starts again), ' \
           'scratch_s1 (finished.json damaged: trains again), ' \
           'scratch_s2 (at step 5150, resumes from step 4000)' in out
    assert 'superseded/: 1 finished runs' in out and 'resumes it' in out and 'decides its later runs' in out
    # what each finished run reached so far, in the order they finished
    assert out.index('| ancestor_s0 | – | – | – |') < out.index('| ancestor_s1 | 3,000 | 0.8765 | 0.8610 | 200 |')
    record = tmp_path / 'runs' / 'ancestor_s0' / 'finished.json'
    os.utime(record, (record.stat().st_mtime + 60,) * 2)
    assert cli.main(['info', str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.index('| ancestor_s1 |') < out.index('| ancestor_s0 |')
    for name, cpu in (('ancestor_s0', 90.0), ('ancestor_s1', 160.0)):   # CPU time where every record has it
        record = tmp_path / 'runs' / name / 'finished.json'
        record.write_text(json.dumps(dict(json.loads(record.read_text()), cpu_seconds=cpu)))
    assert cli.main(['info', str(tmp_path)]) == 0
    assert 'runs/: 2 finished (300 s of training, 250 s of CPU time), 3 unfinished' in capsys.readouterr().out
    sub = _results((0.90, 0.92, 0.94))
    sub.update(seeds=[0, 1, 2], verdicts=[{'claim': 'LeTra beats IMwLM', 'verdict': 'not reproduced',
                                           'detail': ''}])
    (tmp_path / 'results.json').write_text(json.dumps(
        {'config': {'experiment': 'cluster'}, 'budgets': {'0.01': sub, '0.1': sub}}))
    assert cli.main(['info', str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "the 'cluster' study, finished (results.json)" in out and 'resumes it' not in out
    assert "experiment 'cluster'" in out and '2 label budgets' in out
    assert out.count('LeTra beats IMwLM: not reproduced') == 2 and 'labels 10%: 9 records' in out


def test_info_counts_a_transfer_study_s_runs_by_label_budget(tmp_path, capsys):
    """Upstream, then each label budget (read from the run names), so a reader sees which
    stage a stopped transfer study reached; hidden folders (a copy being moved in) are not runs."""
    from jlearngene import cli
    (tmp_path / 'study.json').write_text(json.dumps({'experiment': 'tleg', 'config_sha256': 'x'}))
    for name, secs in (('ancestor_w32_d6_lr0.004_s0', 300.0), ('scratch_l0.01_w32_d6_lr0.002_s0', 40.0),
                       ('tleg_w32_d6_f0.35_s0_l0.01_lr0.003', 10.0), ('scratch_l0.1_w32_d6_lr0.004_s0', 90.0),
                       ('.incoming_tleg_w32_d6_f0.35_s0_l0.1_lr0.003', 5.0)):
        (tmp_path / 'runs' / name).mkdir(parents=True)
        (tmp_path / 'runs' / name / 'finished.json').write_text(json.dumps({'seconds': secs}))
    assert cli.main(['info', str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert 'runs/: 4 finished (440 s of training)\n' in out
    assert ('finished by stage: upstream 1 run (300 s), 1 % of the labels 2 runs (50 s), '
            '10 % of the labels 1 run (90 s)') in out


def test_info_lists_a_store_of_finished_runs(tmp_path, capsys):
    from jlearngene import cli
    for fingerprint, record in (('a' * 64, {'seconds': 120.0, 'step': 3000, 'curve': [[3000, 0.9123]]}),
                                ('b' * 64, None)):           # a damaged record still counts
        (tmp_path / fingerprint).mkdir()
        (tmp_path / fingerprint / 'finished.json').write_text('{' if record is None else json.dumps(record))
    (tmp_path / '.incoming_x').mkdir()                       # a copy being put in place
    assert cli.main(['info', str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f'run store {tmp_path}: 2 finished runs (120 s of training)')
    assert '| aaaaaaaaaaaa | 3,000 | 0.9123 | – | 120 |' in out and '| bbbbbbbbbbbb | – | – | – | – |' in out


def dataclass_replace(claim, **changes):
    import dataclasses
    return dataclasses.replace(claim, **changes)


def test_the_studies_digits_split_is_half_and_fixed():
    train, test = data.digits_split_indices('half_train'), data.digits_split_indices('half_test')
    assert (len(train), len(test)) == (896, 901)       # classes of odd size: one more test image
    assert not set(train) & set(test) and len(set(train) | set(test)) == 1797
    labels = data.digits('half_test').labels
    counts = np.bincount(labels, minlength=10)               # stratified: half of every class
    assert set(counts - np.bincount(data.digits('half_train').labels, minlength=10)) <= {0, 1}
    assert len(data.digits_split_indices('test')) == 364       # the default split is unchanged
    with pytest.raises(data.DataError, match="'half_testing'"):
        data.digits_split_indices('half_testing')


def _tiny_run():
    """(config, Data of digits 0 and 1, initial params, loss, eval) of a one-block ViT of width 8:
    runs of a few steps for `harness.fit`."""
    import jax

    from jlearngene.models import init, vit_config
    from jlearngene.train import tasks
    config = {'data': {'name': 'digits', 'image_size': 8}, 'batch_size': 16, 'eval_batch_size': 128,
              'seed': 0, 'optim': {'weight_decay': 0.05}}
    dset = harness.Data(config, classes=(0, 1))
    cfg = vit_config('Ti', width=8, num_heads=2, mlp_dim=16, depth=1, image_size=8, patch_size=4,
                     num_classes=2, channels=1)
    return config, dset, init(cfg, jax.random.key(0)), tasks.classification_loss(cfg), tasks.classification_eval(cfg)


def test_a_finished_run_is_read_back_and_anything_else_trains_again(tmp_path, monkeypatch, caplog):
    """`harness.fit` reads a finished run back (same name, settings, identity, data, initial
    params, code) with its params and curve; another lr, identity or XLA flags, or a damaged
    record, trains again, keeps the finished run under superseded/ and says what differs."""
    import jax

    config, dset, params0, loss, ev = _tiny_run()

    def fit(lr=1e-3, identity='a', reused=None):
        return harness.fit('r', loss, params0, ev, dset, steps=3, lr=lr, optim=config['optim'],
                           workdir=str(tmp_path), seed=0, eval_every=None, identity=identity,
                           reused=reused)

    first = fit()
    record = tmp_path / 'runs' / 'r' / harness.FINISHED
    meta = json.loads(record.read_text())
    assert meta['seconds'] == first[2] and meta['cpu_seconds'] > 0        # wall and CPU time
    reused = []
    again = fit(reused=reused)
    assert reused == ['r'] and again[1] == first[1] and again[2] == first[2]
    chex.assert_trees_all_equal(again[0], first[0])
    assert jax.tree.structure(again[0]) == jax.tree.structure(params0)
    for changed, why in ((dict(lr=2e-3), 'not reused (other optimiser settings)'),
                         (dict(identity='b'), 'study config')):
        reused, kept = [], {p.name for p in (tmp_path / 'superseded').glob('*')}
        caplog.clear()
        fit(reused=reused, **changed)
        assert reused == [] and why in caplog.text
        new = {p.name for p in (tmp_path / 'superseded').glob('*')} - kept
        assert len(new) == 1 and (tmp_path / 'superseded' / new.pop() / harness.FINISHED).exists()
    flags = os.environ.get('XLA_FLAGS', '')
    monkeypatch.setenv('XLA_FLAGS', flags + ' --xla_cpu_multi_thread_eigen=false')
    caplog.clear()
    fit(identity='b')
    assert (f"(other software and devices: XLA_FLAGS {flags!r} there, "
            f"{flags + ' --xla_cpu_multi_thread_eigen=false'!r} here)") in caplog.text
    monkeypatch.setenv('XLA_FLAGS', flags)
    fit()
    for damaged in (b'not a finished run', record.read_bytes()[:len(record.read_bytes()) // 2]):   # garbage, truncated
        record.write_bytes(damaged)
        reused = []
        caplog.clear()
        chex.assert_trees_all_equal(fit(reused=reused)[0], first[0])   # trained again, same result
        assert reused == [] and 'not reused (its record is unreadable)' in caplog.text


def _check_records(results, workdir):
    for name in ('results.json', 'results.md', 'accuracy_vs_flops.png'):
        assert os.path.getsize(os.path.join(workdir, name)) > 0, name
    saved = json.load(open(os.path.join(workdir, 'results.json')))
    rows = saved['rows']
    assert len(rows) == len(results['rows'])
    for r in rows:
        assert {'method', 'shape', 'seed', 'acc', 'finetune_flops', 'fraction'} <= set(r)
        assert 0.0 <= r['acc'] <= 1.0
        if r['method'] == 'scratch':     # one of the lrs swept, the extensions past an edge included
            swept = saved['scratch'][res.shape_key(r['shape'])]['sweeps'][-1]['scores']
            assert f"{r['lr']:g}" in swept and r['steps'] > 0
    assert saved['verdicts'] == results['verdicts']
    # the report is a function of results.json: re-rendering gives the same table
    assert study.render(workdir)['table'] == results['table']
    assert report.markdown(saved) == results['table']
    return saved


@pytest.mark.slow
def test_tleg_smoke_study(tmp_path, capsys):
    results = study.run_experiment(configs.load('tleg:smoke'), str(tmp_path))
    out, err = capsys.readouterr()
    assert not out and 'scratch  w32 L1 lr 0.001 seed 0' in err      # progress on stderr
    saved = _check_records(results, str(tmp_path))
    by = {(tuple(r['shape']), r['method']): r for r in saved['rows']}
    aux = saved['info']['0']
    # the descendant at the Aux-Net's depth is the Aux-Net: its accuracy before fine-tuning
    assert by[((32, 2), 'tleg')]['acc_init'] == pytest.approx(aux['aux_tleg_accuracy'], abs=1e-9)
    up = saved['upstream_flops']['0']
    assert by[((32, 1), 'tleg')]['upstream_flops'] == pytest.approx(up['teacher'] + up['aux_tleg'])
    assert by[((32, 1), 'tleg')]['upstream_flops_without_source'] == pytest.approx(up['aux_tleg'])
    assert by[((32, 1), 'he_lg')]['upstream_flops_without_source'] == 0.0
    assert by[((32, 1), 'mini_init')]['upstream_flops_without_source'] == pytest.approx(up['aux_mini_init'])
    claims = harness.module('tleg').STUDY.claims
    assert len(saved['verdicts']) == len(claims) and all(v['verdict'] for v in saved['verdicts'])
    from jlearngene import genes
    from jlearngene.train import checkpoint
    gene, aux_cfg, extra = checkpoint.load_model(str(tmp_path / 'genes' / 'tleg' / 'seed_0'))
    assert extra['kind'] == 'tleg_gene' and aux_cfg.depth == 2
    assert genes.get('tleg').descend(gene, aux_cfg.replace(depth=5))['blocks']['attn']['q']['kernel'].shape[0] == 5
    # run again in the same workdir: every training run is read back, the results are the same
    again = study.run_experiment(configs.load('tleg:smoke'), str(tmp_path), quiet=True)
    assert again['reused'] == sorted(saved['timings']) and again['rows'] == results['rows']
    assert 'had finished in an earlier process' in again['table']


@pytest.mark.slow
def test_letra_smoke_study(tmp_path):
    results = study.run_experiment(configs.load('letra:smoke'), str(tmp_path), quiet=True)
    saved = _check_records(results, str(tmp_path))
    names = {(r['name'], r['fraction']) for r in saved['rows'] if r['method'] != 'scratch'}
    assert names == {(n, f) for n in ('letra/continuous', 'letra/random', 'imwlm') for f in (0.0, 0.05)}
    untuned = [r for r in saved['rows'] if r['fraction'] == 0.0]
    assert all(r['acc'] == r['acc_init'] and r['finetune_flops'] == 0 for r in untuned)


@pytest.mark.slow
def test_compare_smoke_study(tmp_path):
    results = study.run_experiment(configs.load('compare:smoke'), str(tmp_path), quiet=True)
    saved = _check_records(results, str(tmp_path))
    assert "pre_fin: the gene's" in saved['cannot']['pre_fin']['w12_d2']
    assert 'Pre-Fin at w12 L2' in results['table']
    assert {tuple(r['shape']) for r in saved['rows'] if r['method'] == 'pre_fin'} == {(16, 2)}


@pytest.mark.slow
def test_scala_smoke_study(tmp_path):
    results = study.run_experiment(configs.load('scala:smoke'), str(tmp_path), quiet=True)
    saved = _check_records(results, str(tmp_path))
    rows = saved['rows']
    up = saved['upstream_flops']['0']
    assert {'scala/clean', 'scala/official', 'us_net'} <= set(up)     # one network per row
    steps = saved['info']['0']['scala/clean_steps']
    for r in rows:
        if r['method'] in ('scala', 'us_net'):
            assert r['steps'] == 0 and r['acc'] == r['acc_init']      # sub-networks as they are
            assert r['upstream_flops_without_source'] == up[r['name']]
        if r['name'] == 'separate/steps':
            assert r['steps'] == steps                                # Scala's steps at every width
        if r['method'] == 'separate':                                 # at its width's Scratch lr
            assert r['lr'] == saved['scratch'][res.shape_key(r['shape'])]['lr']
    flops = [r for r in rows if r['name'] == 'separate/flops']
    spent = sum(r['finetune_flops'] for r in flops)                   # Scala's FLOPs over the widths
    assert spent == pytest.approx(up['scala/clean'], rel=0.5 / flops[0]['steps'] + 1e-6)
    assert "Separate (Scala's steps)" in results['table']


@pytest.mark.slow
def test_cluster_smoke_study(tmp_path):
    results = study.run_experiment(configs.load('cluster:smoke'), str(tmp_path), quiet=True)
    anc = results['ancestor']
    assert anc['classes'] == [0, 1, 2, 3, 4] and anc['descendant_classes'] == [5, 6, 7, 8, 9]
    # the configured sweep, and the extensions past its edge where its choice sat on one
    extended = {f"{e['value']:g}" for sw in anc['sweeps'] for e in sw['extensions']}
    assert set(anc['sweep']) == {'0.001', '0.002', '0.004'} | (extended & set(anc['sweep']))
    info = results['info']['0']['attention_distance']
    assert np.asarray(info['distances']).shape == (2, 4) and len(info['centroids']) == 2
    names = {(r['name'], tuple(r['shape'])) for r in results['rows']}
    assert ('pre_fin', (16, 2, 4)) in names and ('pre_fin', (16, 2, 2)) not in names
    assert {('cluster/random', s) for s in ((16, 2, 2), (16, 2, 4))} <= names
    for r in results['rows']:
        if r['name'].startswith('cluster'):
            assert r['upstream'] == ['teacher', 'attention_distance']
    assert len(results['verdicts']) == len(cluster.STUDY.claims)
    assert 'Mean attention distance' in results['table'] and 'Ancestor' in results['table']
    for f in ('results.md', 'results.json', 'accuracy_vs_flops.png'):
        assert (tmp_path / f).exists(), f


@pytest.mark.slow
def test_mango_smoke_study(tmp_path):
    results = study.run_experiment(configs.load('mango:smoke'), str(tmp_path), quiet=True)
    saved = _check_records(results, str(tmp_path))
    up = saved['upstream_flops']['0']
    small = saved['scratch']['w16_d1']                  # the small model is a converged Scratch run
    assert up['small'] > 0 and f"{small['lr']:g}" in small['sweeps'][-1]['scores']
    grown = {r['name']: r for r in saved['rows'] if r['method'] != 'scratch'}
    assert set(grown) == {'mango/2', 'bert2bert'}
    assert grown['mango/2']['extra_flops'] > 0 and grown['bert2bert']['extra_flops'] == 0
    for r in grown.values():                             # stopped at the target, or ran out
        stopped = r['steps_taken'] < r['steps']
        assert not stopped or r['acc'] >= r['target']
        assert r['upstream_flops_without_source'] == 0 and r['upstream_flops'] == up['small']
    assert 'Mango (R=2)' in results['table']


def test_a_study_refuses_fake_replication_and_nonsense_up_front(tmp_path):
    """Each in one line, before anything is read or written."""
    cases = (({'seeds': (0, 0)}, r'seeds=\(0, 0\) repeats a seed'),
             ({'descend.fractions': (-0.1,)}, 'negative budget'),
             ({'methods': ()}, 'methods is empty'),
             ({'methods': ('scala',)}, "scala \\(slimmable family\\) reads the config section 'slim', "
                                       'which the tleg study lacks; run it with .*--config scala:digits'),
             ({'methods': ('mango',)}, "'operator'.*--config mango:digits"))
    for overrides, message in cases:
        config = configs.load('tleg:smoke', overrides)
        with pytest.raises(ValueError, match=message) as e:
            study.run_experiment(config, str(tmp_path / 'w'), quiet=True)
        assert '\n' not in str(e.value)
    assert not (tmp_path / 'w').exists()
    # a method of a family whose section the study has runs there (LeTra's Aux-Net in TLEG's)
    study.check(configs.load('tleg:smoke', {'methods': ('letra',)}))


def test_methods_split_like_seeds_on_the_command_line():
    from jlearngene.commands import train
    fv = train.parse_flags(['--config', 'tleg:smoke', '--config.methods=tleg,share_init',
                            '--config.seeds=3,4,5', '--workdir=w'], 'p')
    config = fv.config
    assert tuple(config.methods) == ('tleg', 'share_init') and tuple(config.seeds) == (3, 4, 5)


def test_a_verdict_on_a_row_not_run_says_so():
    results = _results((0.90, 0.92, 0.94))
    results['summary'] = res.summarise(results, (1,))
    v = res.verdict(study.Claim('x', 'beats', 'tleg', 0.35, other='share_init'), results)
    assert v == {'claim': 'x', 'verdict': 'not testable here', 'detail': 'tleg was not run at 0.35·S'}



def test_render_validates_the_record_and_names_the_first_bad_field(tmp_path, capsys):
    from jlearngene import cli
    record = json.loads(open(os.path.join(ROOT, 'experiments', 'mango', 'results.json')).read())
    cases = ((lambda r: r.pop('rows'), 'rows: missing'),
             (lambda r: r['rows'][3].update(acc=1.7), r'rows\[3\]\.acc: 1\.7 is not an accuracy'),
             (lambda r: r['rows'][0].update(step_flops=float('nan')), r'rows\[0\]\.step_flops: expected FLOPs'),
             (lambda r: r['config'].pop('experiment'), 'config.experiment: missing'),
             (lambda r: r['rows'][2]['curve'].append([5, -0.1]), r'rows\[2\]\.curve\[\d+\]'))
    for damage, message in cases:
        broken = json.loads(json.dumps(record))
        damage(broken)
        (tmp_path / 'results.json').write_text(json.dumps(broken))
        with pytest.raises(res.ResultsError, match=message) as e:
            study.render(str(tmp_path))
        assert str(tmp_path / 'results.json') in str(e.value) and '\n' not in str(e.value)
    (tmp_path / 'results.json').write_text('{"rows": [')
    assert cli.main(['render', str(tmp_path)]) == 1
    assert 'results.json: not JSON' in capsys.readouterr().err


def test_render_verb_renders_a_read_only_record_elsewhere(tmp_path, capsys):
    from jlearngene import cli
    record = tmp_path / 'record'
    record.mkdir()
    (record / 'results.json').write_bytes(open(os.path.join(ROOT, 'experiments', 'mango', 'results.json'), 'rb').read())
    record.chmod(0o555)
    try:
        assert cli.main(['render', str(record), '--out', str(tmp_path / 'out')]) == 0
    finally:
        record.chmod(0o755)
    table = (tmp_path / 'out' / 'results.md').read_text()
    assert '**Verdicts**' in table and (tmp_path / 'out' / 'accuracy_vs_flops.png').exists()
    assert sorted(os.listdir(record)) == ['results.json']


def test_a_study_workdir_belongs_to_one_study(tmp_path):
    config = configs.load('tleg:smoke')
    harness.claim_workdir(str(tmp_path), config)
    harness.claim_workdir(str(tmp_path), config)                       # the same study: resumes
    with pytest.raises(ValueError, match="belongs to the study 'tleg'.*another --workdir"):
        study.run_experiment(configs.load('scala:smoke'), str(tmp_path), quiet=True)
    with pytest.raises(ValueError, match=r"the tleg study with another config \(seeds: \[0\] -> \[3\]\)"):
        study.run_experiment(configs.load('tleg:smoke', {'seeds': (3,)}), str(tmp_path), quiet=True)
    assert os.listdir(tmp_path) == ['study.json']
    owner = json.loads((tmp_path / 'study.json').read_text())
    del owner['config']                          # a study.json that keeps only the digest
    (tmp_path / 'study.json').write_text(json.dumps(owner))
    harness.claim_workdir(str(tmp_path), config)                       # still its own study
    with pytest.raises(ValueError, match='another config') as refused:
        harness.claim_workdir(str(tmp_path), configs.load('tleg:smoke', {'seeds': (3,)}))
    assert 'seeds' not in str(refused.value) and 'JLEARNGENE_STORE' in str(refused.value)
    (tmp_path / 'other').mkdir()
    (tmp_path / 'other' / 'results.json').write_text('{}')
    with pytest.raises(ValueError, match='not recorded there'):
        harness.claim_workdir(str(tmp_path / 'other'), config)


def test_results_files_are_replaced_whole_or_not_at_all(tmp_path, monkeypatch):
    (tmp_path / 'results.json').write_text('old')
    real_replace = os.replace

    def full_disk(src, dst):
        raise OSError(28, 'No space left on device')
    monkeypatch.setattr(os, 'replace', full_disk)
    with pytest.raises(OSError, match="cannot write .*results.json'?: No space left on device"):
        harness.write_results({'a': 1}, str(tmp_path), 'table')
    monkeypatch.setattr(os, 'replace', real_replace)
    assert (tmp_path / 'results.json').read_text() == 'old'
    assert os.listdir(tmp_path) == ['results.json']                  # no temporary left behind


def test_an_interrupted_run_resumes_from_its_last_checkpoint_and_ends_as_an_uninterrupted_one(
        tmp_path, monkeypatch, caplog):
    """A study run cut off part-way continues from its newest checkpoint when run again:
    the same params and curve as a run never cut off, and the seconds of the steps it keeps;
    an unfinished run of other settings starts again from step 0."""
    from jlearngene.train import metrics

    monkeypatch.setattr(harness, 'RESUME_EVERY', 4)
    config, dset, params0, loss, ev = _tiny_run()

    def fit(workdir, lr=1e-3):
        return harness.fit('r', loss, params0, ev, dset, steps=12, lr=lr, optim=config['optim'],
                           workdir=str(workdir), seed=0, eval_every=2)

    whole = fit(tmp_path / 'whole')
    assert harness.resume_interval(12, 2) == 4 and harness.resume_interval(4, 2) is None
    assert harness.resume_interval(12, 3) == 6 and harness.resume_interval(12, None) == 4

    class Cut(Exception):
        pass

    class CutAtStep10(harness.Evaluation):
        def after_call(self, run, step, state):
            super().after_call(run, step, state)
            if step == 10:
                raise Cut('cut off at step 10')

    for lr in (2e-3, 1e-3):   # the second: cut off after the checkpoint of step 8, with its seconds
        with monkeypatch.context() as m:
            m.setattr(harness, 'Evaluation', CutAtStep10)
            with pytest.raises(Cut):
                fit(tmp_path / 'cut', lr=lr)
    run_dir = tmp_path / 'cut' / 'runs' / 'r'
    assert sorted(os.listdir(run_dir / 'checkpoints')) == ['8'] and not (run_dir / harness.FINISHED).exists()
    kept = json.loads((run_dir / harness.PROGRESS).read_text())['clock']
    assert sorted(kept, key=int) == ['4', '8'] and kept['8'][0] >= kept['4'][0] > 0
    caplog.set_level('INFO', logger='jlearngene.train')
    again = fit(tmp_path / 'cut')
    assert 'step 8: resumed from' in caplog.text
    chex.assert_trees_all_equal(again[0], whole[0])
    assert again[1] == whole[1] and [s for s, _ in again[1]] == [2, 4, 6, 8, 10, 12]
    assert again[2] > kept['8'][0]
    assert [r['step'] for r in metrics.read_metrics(str(run_dir), kind='eval')] == [2, 4, 6, 8, 10, 12]
    record = json.loads((run_dir / harness.FINISHED).read_text())
    assert record['seconds'] == again[2] and record['cpu_seconds'] > kept['8'][1]
