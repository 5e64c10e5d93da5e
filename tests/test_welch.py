"""The statistics of a study's verdicts (jlearngene/experiments/results.py): mean ± sample std
(ddof = 1) over seeds, and a difference counted only where Welch's t-test gives p < 0.05 and,
for accuracies, the gap is at least 0.5 pt."""
import dataclasses
import glob
import json
import math
import os

import numpy as np
import pytest
from scipy import stats

from jlearngene.experiments import harness
from jlearngene.experiments import results as res
from jlearngene.experiments import study

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# every committed record: the digits studies and their fashion/ variants, as they land
STUDIES = sorted(os.path.relpath(os.path.dirname(p), os.path.join(ROOT, 'experiments'))
                 for p in glob.glob(os.path.join(ROOT, 'experiments', '**', 'results.json'), recursive=True))


def test_welch_is_the_closed_form_unequal_variance_test():
    a, b = [1.0, 2.0, 3.0, 4.0], [2.0, 4.0, 6.0, 8.0, 10.0]
    # by hand: means 2.5 and 6, sample variances 5/3 and 10; se² = 5/12 + 2 = 29/12
    t = (2.5 - 6.0) / math.sqrt(29 / 12)
    df = (29 / 12) ** 2 / ((5 / 12) ** 2 / 3 + 2.0 ** 2 / 4)
    assert t == pytest.approx(-2.25144, abs=1e-5) and df == pytest.approx(5.52079, abs=1e-5)
    p = 2 * stats.t.sf(abs(t), df)
    assert res.welch(a, b) == pytest.approx(p, rel=1e-12) == pytest.approx(0.069134, abs=1e-6)
    assert res.welch(a, b) == pytest.approx(stats.ttest_ind(a, b, equal_var=False).pvalue, rel=1e-12)
    assert res.welch(b, a) == pytest.approx(p, rel=1e-12)                  # two-sided
    assert abs(res.welch(a, b) - stats.ttest_ind(a, b).pvalue) > 5e-3      # not Student's pooled test


def test_welch_has_no_p_without_two_seeds_a_side_or_with_both_sides_constant():
    assert res.welch([0.9], [0.1, 0.2, 0.3]) is None
    assert res.welch([0.1, 0.2, 0.3], [0.9]) is None
    assert res.welch([0.9, 0.9, 0.9], [0.7, 0.7, 0.7]) is None        # no spread: t undefined
    p = res.welch([0.90, 0.92, 0.94], [0.7, 0.7, 0.7])                 # one side constant: defined
    assert p == pytest.approx(2 * stats.t.sf(0.22 / (0.02 / math.sqrt(3)), 2), rel=1e-9)
    assert res.ALPHA == 0.05 and res.MIN_GAP == 0.005


def _record(name, seed, acc, *, fraction=0.5, reach=None, up_wo=10.0):
    return dict(method=name, name=name, label=name, shape=[8, 2], seed=seed, fraction=fraction,
                steps=10, steps_taken=10, step_flops=0.9, lr=1e-3, acc_init=0.1, acc=acc,
                curve=[(0, 0.1), (10, acc)], params=100, extra_flops=1.0, finetune_flops=9.0,
                target=0.795, reach_flops=reach, upstream_flops=30.0, upstream_flops_without_source=up_wo,
                plateau_step=40, converged=True)


def _results(mine, theirs, *, my_reach=None, scratch_reach=(20.0, 20.0, 20.0), fraction=0.5,
             tasks=None):
    """'tleg' (accuracies `mine`) against 'share_init' (`theirs`) at `fraction`·S, and
    Scratch's converged runs at 1.0·S; FLOPs to the target per seed as given (upstream w/o
    source 10 for tleg, 0 for Scratch); `tasks` as a two-task study's config has them."""
    my_reach = my_reach or [5.0] * len(mine)
    rows = [_record('scratch', s, 0.80, fraction=1.0, reach=r, up_wo=0.0) for s, r in enumerate(scratch_reach)]
    rows += [_record('tleg', s, a, reach=r, fraction=fraction) for s, (a, r) in enumerate(zip(mine, my_reach))]
    rows += [_record('share_init', s, a, fraction=fraction) for s, a in enumerate(theirs)]
    results = dict(config={'amortise': (1,), **({'tasks': tasks} if tasks else {})}, shapes=[[8, 2]],
                   rows=rows)
    results['summary'] = res.summarise(results, (1,))
    return results


BEATS = res.Claim('TLEG beats Share-Init', 'beats', 'tleg', 0.5, other='share_init')


def test_beats_is_reproduced_with_a_gap_and_a_small_p():
    mine, theirs = (0.95, 0.96, 0.97, 0.955, 0.965), (0.90, 0.91, 0.92, 0.905, 0.915)
    v = res.verdict(BEATS, _results(mine, theirs))
    p = stats.ttest_ind(mine, theirs, equal_var=False).pvalue
    assert v['verdict'] == 'reproduced'
    assert v['detail'] == (f'w8 L2: 0.960 ± {np.std(mine, ddof=1):.3f} vs 0.910 ± '
                           f'{np.std(theirs, ddof=1):.3f} (Δ +0.050, p {p:.3g})')
    assert '2σ' not in v['detail']


def test_beats_needs_p_below_alpha_even_with_a_big_gap():
    mine, theirs = (0.80, 0.99, 0.99), (0.85, 0.86, 0.87)             # Δ +0.067, p 0.40
    v = res.verdict(BEATS, _results(mine, theirs))
    assert v['verdict'] == 'not reproduced' and '(Δ +0.067, p 0.403)' in v['detail']


def test_beats_needs_half_a_point_even_with_a_small_p():
    mine, theirs = (0.903, 0.904, 0.905), (0.900, 0.901, 0.902)       # Δ +0.003, p 0.021
    assert res.welch(mine, theirs) < res.ALPHA
    v = res.verdict(BEATS, _results(mine, theirs))
    assert v['verdict'] == 'not reproduced' and '(Δ +0.003, p 0.0213)' in v['detail']
    # the same seeds a point apart: both conditions hold
    assert res.verdict(BEATS, _results([a + 0.01 for a in mine], theirs))['verdict'] == 'reproduced'


def test_beats_on_one_seed_is_not_testable_either_way():
    """With one seed on a side Welch's test cannot run: the claim is neither reproduced nor
    refuted (a `,quick` study), whichever way the means lie; more seeds decide it."""
    v = res.verdict(BEATS, _results((0.99,), (0.50,)))
    assert v['verdict'] == 'not testable here'
    assert v['detail'] == ("w8 L2: 0.990 ± 0.000 vs 0.500 ± 0.000 (Δ +0.490, p n/a: 1 seed against 1, "
                           "too few for Welch's test)")
    v = res.verdict(BEATS, _results((0.40,), (0.50,)))                     # behind, on one seed
    assert v['verdict'] == 'not testable here' and '(Δ -0.100, p n/a: 1 seed against 1' in v['detail']
    v = res.verdict(BEATS, _results((0.99,), (0.50, 0.51, 0.52)))          # one seed on one side
    assert v['verdict'] == 'not testable here' and 'p n/a: 1 seed against 3' in v['detail']
    # the same comparisons with seeds enough keep their verdicts
    assert res.verdict(BEATS, _results((0.99, 0.98, 0.97), (0.50, 0.51, 0.52)))['verdict'] == 'reproduced'
    v = res.verdict(BEATS, _results((0.40, 0.41, 0.42), (0.50, 0.51, 0.52)))
    assert v['verdict'] == 'not reproduced' and '(Δ -0.100, p ' in v['detail']
    v = res.verdict(BEATS, _results((0.99, 0.99), (0.50, 0.50)))           # both constant: p n/a
    assert v['verdict'] == 'not reproduced' and v['detail'].endswith('(Δ +0.490, p n/a)')


def test_a_shape_with_one_seed_decides_nothing_beside_tested_shapes():
    """A claim over shapes is decided at the shapes Welch's test can run at; a one-seed
    shape is listed beside them."""
    results = _results((0.95, 0.96, 0.97), (0.90, 0.91, 0.92))
    wide = [dict(r, shape=[16, 2]) for r in results['rows'] if r['seed'] == 0]
    results['rows'] += wide
    results['shapes'] = [[8, 2], [16, 2]]
    results['summary'] = res.summarise(results, (1,))
    v = res.verdict(BEATS, results)
    assert v['verdict'] == 'reproduced'
    assert v['detail'].split('; ')[1] == ("w16 L2: 0.950 ± 0.000 vs 0.900 ± 0.000 (Δ +0.050, p n/a: "
                                          "1 seed against 1, too few for Welch's test)")
    for r in results['rows']:                     # behind at the tested shape: not reproduced
        if r['name'] == 'tleg' and r['shape'] == [8, 2]:
            r['acc'] -= 0.2
    results['summary'] = res.summarise(results, (1,))
    assert res.verdict(BEATS, results)['verdict'] == 'not reproduced'


def test_an_untuned_claim_is_not_testable_where_descendants_learn_a_new_task():
    """At 0·S a descendant on a new task has a freshly drawn head, so an accuracy claim there
    compares chance with chance; after tuning, and on the ancestor's own task, it is tested."""
    untuned = res.Claim('TLEG beats Share-Init untuned', 'beats', 'tleg', 0.0, other='share_init')
    mine, theirs = (0.30, 0.31, 0.32), (0.18, 0.19, 0.20)
    assert res.verdict(untuned, _results(mine, theirs, fraction=0.0))['verdict'] == 'reproduced'
    new_task = dict(ancestor=[0, 1], descendant=[2, 3, 4, 5, 6])
    v = res.verdict(untuned, _results(mine, theirs, fraction=0.0, tasks=new_task))
    assert v['verdict'] == 'not testable here'
    assert v['detail'].endswith('every row is near chance: 0.190–0.310 (chance 0.200)')
    assert res.verdict(BEATS, _results(mine, theirs, tasks=new_task))['verdict'] == 'reproduced'


def test_close_keeps_its_tolerance_and_prints_the_sample_std():
    close = res.Claim('x', 'close', 'tleg', 0.5, other='share_init', tolerance=0.01)
    v = res.verdict(close, _results((0.79, 0.80, 0.81), (0.805, 0.805, 0.805)))
    assert v['verdict'] == 'reproduced'                                    # 0.005 below: within 0.01
    assert v['detail'] == 'w8 L2: 0.800 ± 0.010 vs 0.805 ± 0.000 (Δ -0.005, tolerance 0.010)'


def test_cheaper_compares_the_flops_per_seed_with_welch():
    cheaper = res.Claim('TLEG cheaper', 'cheaper', 'tleg', 0.5)
    accs = (0.9, 0.9, 0.9)
    # per seed 4, 5, 6 + 10 = 14, 15, 16 against Scratch's 19, 20, 21: p 0.0066, 0.75×
    results = _results(accs, accs, my_reach=(4.0, 5.0, 6.0), scratch_reach=(19.0, 20.0, 21.0))
    p = stats.ttest_ind([14.0, 15.0, 16.0], [19.0, 20.0, 21.0], equal_var=False).pvalue
    v = res.verdict(cheaper, results)
    assert v['verdict'] == 'reproduced'
    assert v['detail'] == f'w8 L2: 1.5e-08 ± 1e-09 vs 2e-08 ± 1e-09 GFLOPs to the target (0.75×, p {p:.3g})'
    assert res.verdict(dataclasses.replace(cheaper, flops_ratio=0.7), results)['verdict'] == 'not reproduced'
    # lower on average, but the seeds overlap: p 0.086 (no minimum gap for FLOPs either way)
    noisy = _results(accs, accs, my_reach=(0.0, 8.0, 4.0), scratch_reach=(20.0, 21.0, 22.0))
    v = res.verdict(cheaper, noisy)
    assert v['verdict'] == 'not reproduced' and '(0.67×, p 0.0859)' in v['detail']
    # the same FLOPs on every seed on both sides: p n/a
    flat = _results(accs, accs, my_reach=(5.0,) * 3, scratch_reach=(20.0,) * 3)
    v = res.verdict(cheaper, flat)
    assert v['verdict'] == 'not reproduced' and '(0.75×, p n/a)' in v['detail']
    # more FLOPs with a small p: not cheaper
    dear = _results(accs, accs, my_reach=(14.0, 15.0, 16.0), scratch_reach=(9.0, 10.0, 11.0))
    assert res.welch([24.0, 25.0, 26.0], [9.0, 10.0, 11.0]) < res.ALPHA
    assert res.verdict(cheaper, dear)['verdict'] == 'not reproduced'
    # one seed a side: Welch's test cannot run, so neither cheaper nor not
    for mine, theirs in (((4.0,), (19.0,)), ((14.0,), (9.0,))):
        one = _results((0.9,), (0.9,), my_reach=mine, scratch_reach=theirs)
        v = res.verdict(cheaper, one)
        assert v['verdict'] == 'not testable here'
        assert v['detail'].endswith("p n/a: 1 seed against 1, too few for Welch's test)")
    # one seed that never reached the target: a missed target, which needs no test
    missed = _results((0.9,), (0.9,), my_reach=(5.0,), scratch_reach=(19.0,))
    next(r for r in missed['rows'] if r['name'] == 'tleg')['reach_flops'] = None
    missed['summary'] = res.summarise(missed, (1,))
    assert res.verdict(cheaper, missed)['verdict'] == 'not reproduced'
    # the other row at the target before any training (a function-preserving growth): no ratio
    free = _results(accs, accs, my_reach=(0.0,) * 3, scratch_reach=(0.0,) * 3)
    v = res.verdict(cheaper, free)
    assert v['verdict'] == 'not reproduced' and '(scratch there from the start, p n/a)' in v['detail']


def test_summaries_use_the_sample_std_and_zero_for_one_seed():
    results = _results((0.90, 0.92, 0.97), (0.5,))
    s = {x['name']: x for x in results['summary']}
    assert s['tleg']['std'] == pytest.approx(np.std([0.90, 0.92, 0.97], ddof=1))
    assert s['tleg']['std'] != pytest.approx(np.std([0.90, 0.92, 0.97]))
    assert s['share_init']['std'] == 0.0 and s['share_init']['seeds'] == 1
    json.dumps(results['summary'], allow_nan=False)                        # no NaN in the record
    assert res._mean_std([0.1, 0.3]) == (pytest.approx(0.2), pytest.approx(math.sqrt(0.02)))


@pytest.mark.parametrize('name', STUDIES)
def test_the_committed_records_hold_the_rules_summary_and_verdicts(name):
    with open(os.path.join(ROOT, 'experiments', name, 'results.json'), encoding='utf-8') as f:
        recorded = json.load(f)
    claims = harness.module(recorded['config']['experiment']).STUDY.claims
    again = study.finish(json.loads(json.dumps(recorded)), claims)
    subs = recorded.get('budgets', {'': recorded})
    for key, sub in subs.items():
        fresh = again['budgets'][key] if key else again
        assert fresh['verdicts'] == sub.get('verdicts', [])
        assert len(fresh['summary']) == len(sub['summary'])
        for s, r in zip(fresh['summary'], sub['summary']):
            assert s['std'] == pytest.approx(r['std'], abs=1e-12)
        assert not any('2σ' in v['detail'] for v in fresh['verdicts'])
