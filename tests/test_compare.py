"""The comparison of every method (jlearngene/experiments/compare.py): its cost arithmetic,
its plan of shapes, its configs and a miniature run."""
import json
import os

import pytest

from jlearngene import cli
from jlearngene.experiments import compare, configs, harness


def test_break_even_is_the_cost_arithmetic():
    # U + N·c < N·c_s  <=>  N > U / (c_s - c)
    assert compare.break_even(100.0, 2.0, 7.0) == 21            # 100/5 = 20: a tie at 20
    assert compare.total_cost(100.0, 2.0, 21) < 21 * 7.0
    assert compare.total_cost(100.0, 2.0, 20) == 20 * 7.0
    assert compare.break_even(99.0, 2.0, 7.0) == 20
    assert compare.break_even(0.0, 1.0, 3.0) == 1                # no upstream: from the first
    assert compare.break_even(10.0, 3.0, 3.0) is None            # no saving per descendant
    assert compare.break_even(10.0, 4.0, 3.0) is None
    for u, c, cs in ((37.5, 1.25, 4.0), (1e12, 3e9, 8e9), (5.0, 0.0, 0.5)):
        n = compare.break_even(u, c, cs)
        assert compare.total_cost(u, c, n) < n * cs
        assert n == 1 or compare.total_cost(u, c, n - 1) >= (n - 1) * cs


def test_reach_flops_interpolates_between_evaluations():
    curve = [(0, 0.1), (10, 0.3), (20, 0.7)]
    # start 5, 2 per step: x = 5, 25, 45; 0.5 is halfway between steps 10 and 20
    assert compare.reach_flops(curve, 5.0, 2.0, 0.5) == pytest.approx(35.0)
    assert compare.reach_flops(curve, 5.0, 2.0, 0.05) == 5.0
    assert compare.reach_flops(curve, 5.0, 2.0, 0.9) is None


def _row(method, shape, acc, reach, *, made=True, extra=0.0, ft=10.0):
    if not made:
        return dict(method=method, shape=shape, made=False, reason='no')
    return dict(method=method, shape=shape, made=True, acc_init=0.1, acc=acc, params=100,
                extra_flops=extra, finetune_flops=ft, reach_flops=reach)


def test_summary_amortises_upstream_and_compares_on_the_same_shapes():
    rows = [_row('scratch', (8, 2), 0.5, 10.0), _row('scratch', (4, 2), 0.4, 8.0),
            _row('he_lg', (8, 2), 0.7, 2.0), _row('he_lg', (4, 2), None, None, made=False),
            _row('mango', (8, 2), 0.6, 4.0, extra=3.0), _row('mango', (4, 2), 0.5, 6.0, extra=1.0)]
    s = {r['method']: r for r in compare.summarise(rows, {'teacher': 30.0, 'small': 5.0},
                                                    ('scratch', 'he_lg', 'mango'))}
    assert s['he_lg']['descendants'] == 1 and s['he_lg']['shapes'] == 2
    assert s['he_lg']['upstream_flops'] == 30.0 and s['he_lg']['amortised_flops'] == 30.0 + 10.0
    assert s['he_lg']['acc_vs_scratch'] == pytest.approx(0.2)
    # He-LG against Scratch on its one shape: 30 + N·2 < N·10 from N = 4
    assert s['he_lg']['scratch_reach_flops'] == 10.0 and s['he_lg']['break_even'] == 4
    m = s['mango']
    assert m['per_descendant_flops'] == pytest.approx(12.0)        # (13 + 11) / 2
    assert m['amortised_flops'] == pytest.approx(5.0 / 2 + 12.0)
    assert m['reach_flops'] == 5.0 and m['scratch_reach_flops'] == 9.0
    assert m['break_even'] == compare.break_even(5.0, 5.0, 9.0) == 2
    assert s['scratch']['upstream_flops'] == 0.0


def test_plan_names_what_a_method_cannot_make():
    config = configs.load('compare:smoke')
    plan = compare.plan(config, 10)
    assert plan['pre_fin'][(16, 2)].width == 16
    assert "pre_fin: the gene's 'blocks/attn" in plan['pre_fin'][(12, 2)]   # its GeneError
    assert plan['imwlm'][(12, 2)].num_heads == 3                   # heads of the model's head_dim
    with pytest.raises(ValueError, match=r'pre_fin.*\(width 12, depth 2\)'):
        compare.plan(configs.load('compare:smoke', {'on_missing': 'error'}), 10)
    with pytest.raises(ValueError, match="'nosuch'"):
        compare.plan(configs.load('compare:smoke', {'methods': ('scratch', 'nosuch')}), 10)
    with pytest.raises(ValueError, match=r'\(width 10, depth 2\)'):
        compare.plan(configs.load('compare:smoke', {'shapes': ((10, 2),)}), 10)


def test_cli_errors_are_one_line(tmp_path, capsys):
    rc = cli.main(['compare', '--config', 'compare:smoke', "--config.methods=('scratch','nosuch')",
                   '--workdir', str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and "'nosuch'" in err[0]
    rc = cli.main(['compare', '--config', 'compare:smoke', '--config.on_missing=error',
                   '--workdir', str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and 'pre_fin' in err[0] and '(width 12, depth 2)' in err[0]


def test_configs_resolve_and_paper_shapes_are_consistent():
    digits = configs.load('compare')
    assert configs.load('compare:digits').to_dict() == digits.to_dict()
    assert set(digits.methods) >= {'scratch', 'tleg', 'letra', 'cluster', 'scala', 'mango'}
    paper = configs.load('compare:paper')
    assert paper.data.name == 'tfds' and paper.model.image_size == 224
    plan = compare.plan(paper, 1000)
    made = {m: sorted(s for s, c in p.items() if not isinstance(c, str)) for m, p in plan.items()}
    assert made['scratch'] == made['letra'] == made['imwlm'] == sorted(map(tuple, paper.shapes))
    assert made['tleg'] == made['he_lg'] == [(768, 6), (768, 12)]   # the Aux-Net's width only
    assert made['scala'] == [(384, 12), (576, 12), (768, 12)]       # every width, its depth only
    assert (768, 6) not in made['mango']                            # growth never removes layers
    assert plan['scala'][(576, 12)].num_heads == 12                 # Scala keeps every head
    assert plan['letra'][(576, 12)].head_dim == 64
    with pytest.raises(ValueError, match='data_dir'):
        harness.run(configs.load('compare:paper', {'compile_cache': False}), '/nonexistent', quiet=True)


@pytest.mark.slow
def test_smoke_run_writes_one_table_and_the_plots(tmp_path):
    # one shape: every run shares the teacher's compiled programs
    config = configs.load('compare:smoke', {'shapes': ((16, 2),)})
    results = harness.run(config, str(tmp_path), quiet=True)
    table = results['table'].splitlines()
    head = [c.strip() for c in table[0].strip('|').split('|')]
    assert head[:5] == ['method', 'made', 'acc. init (mean)', 'acc. tuned (mean)', 'Δ tuned vs Scratch']
    assert head[5].startswith('w16 L2 (')
    assert head[6:] == ['Params (M, mean)', 'S-Params (M)', 'upstream (GFLOPs)',
                        'per descendant (GFLOPs)', 'amortised per descendant (GFLOPs)',
                        "to Scratch's acc. per descendant (GFLOPs)", 'beats Scratch from N =']
    body = [line for line in table[2:] if line.startswith('| ')]
    assert [line.split('|')[1].strip() for line in body] == ['Scratch', 'Pre-Fin', 'IMwLM']
    s = {r['method']: r for r in results['summary']}
    up = results['upstream']
    assert s['pre_fin']['upstream_flops'] == s['imwlm']['upstream_flops'] == up['teacher'] > 0
    assert s['scratch']['upstream_flops'] == 0 and s['scratch']['s_params'] == 0
    assert s['imwlm']['amortised_flops'] == pytest.approx(up['teacher'] + s['imwlm']['per_descendant_flops'])
    assert s['pre_fin']['s_params'] == results['rows'][0]['params']        # the whole teacher
    for name in ('results.md', 'results.json', 'accuracy_vs_flops.png', 'break_even.png'):
        assert os.path.getsize(tmp_path / name) > 0
    saved = json.loads((tmp_path / 'results.json').read_text())
    assert [r['method'] for r in saved['rows']] == ['scratch', 'pre_fin', 'imwlm']

    # a shape a method cannot make is a table cell with its reason below the table
    rows = [dict(r) for r in results['rows']]
    rows[1] = dict(method='pre_fin', label='Pre-Fin', shape=(16, 2), made=False, reason='too wide')
    cut = dict(results, rows=rows, summary=compare.summarise(rows, up, results['methods']))
    for r in cut['summary']:
        r['s_params'] = 0
    text = compare.markdown(cut)
    assert 'cannot (1)' in text.splitlines()[3] and '1. Pre-Fin at w16 L2: too wide' in text
