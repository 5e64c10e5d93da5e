"""An upstream worth inheriting (specs/fair_studies.md, "Transfer setting"): convergence by
doubling, sweeps extended past an edge, the ceiling at Scratch's steps, every method at its
paper's budget and at Scratch's, and finished runs shared between workdirs (the store)."""
import json
import os

import pytest

from jlearngene.experiments import harness, report, results, scratch
from jlearngene.models import vit_config


def test_a_run_flat_at_the_end_of_its_schedule_but_higher_at_2n_is_not_converged():
    # each run ends flat (its cosine decayed), yet twice the steps ends 2 pt higher: not converged
    assert scratch.converged_at([(100, 0.80), (200, 0.82)], 0.005) is None
    assert scratch.converged_at([(100, 0.80), (200, 0.82), (400, 0.823)], 0.005) == 200
    assert scratch.converged_at([(100, 0.80), (200, 0.79)], 0.005) == 100    # 2n lower: converged at n
    assert scratch.converged_at([(100, 0.80)], 0.005) is None                 # no 2n run yet
    with pytest.raises(ValueError, match='n, 2n, 4n'):
        scratch.converged_at([(100, 0.8), (300, 0.9)], 0.005)
    assert scratch.plateau([(10, 0.5), (20, 0.796), (30, 0.8)], 0.005) == 20


def test_a_sweep_whose_choice_is_at_an_edge_is_extended_at_most_twice():
    best_at = lambda x0: (lambda x: -abs(x - x0))   # noqa: E731
    inside = scratch.sweep([3e-4, 1e-3, 3e-3], best_at(1e-3))
    assert inside.choice == 1e-3 and inside.extensions == [] and not inside.at_cap
    up = scratch.sweep([3e-4, 1e-3, 3e-3], best_at(5e-3))         # one step up finds it
    assert [e['value'] for e in up.extensions] == [9e-3] and up.choice == 3e-3 and not up.at_cap
    far = scratch.sweep([1e-3, 2e-3, 4e-3], best_at(1.0))         # still rising: two steps, then the cap
    assert [(e['value'], e['side']) for e in far.extensions] == [(8e-3, 'high'), (0.016, 'high')]
    assert far.choice == 0.016 and far.at_cap
    down = scratch.sweep([3e-4, 1e-3, 3e-3], best_at(1e-4))   # 9e-5 wins, at the new edge: once more
    assert [e['value'] for e in down.extensions] == [9e-5, 2.7e-5] and down.choice == 9e-5
    assert not down.at_cap
    assert scratch.sweep([5e-4], best_at(1.0)).extensions == []    # one value: no grid step
    assert json.loads(json.dumps(far.to_json()))['at_cap'] is True


class FakeRunner:
    """A study context whose runs end at an accuracy set by (lr, steps, seed): `final(lr,
    steps, seed)`; each curve rises to it and is flat over its second half, as a cosine run is."""

    def __init__(self, final, *, steps=100, max_steps=800, lrs=(1e-3, 2e-3, 4e-3)):
        self.config = {'scratch': {'lrs': lrs, 'steps': steps, 'eval_every': 10, 'plateau': 0.005,
                                   'patience': 4, 'max_steps': max_steps},
                       'optim': {'lr': 1e-3}, 'batch_size': 8, 'eval_batch_size': 8}
        self.final, self.calls, self.dset = final, [], None

    def steps(self, section, name):
        return section['steps']

    def say(self, msg):
        pass

    def fit(self, name, loss, params, ev, *, steps, lr, seed, eval_every, dset, optim, identity):
        self.calls.append((lr, seed, steps))
        top = self.final(lr, steps, seed)
        curve = [(t, top * min(1.0, 2 * t / steps)) for t in range(eval_every, steps + 1, eval_every)]
        return params, curve


CFG = vit_config('Ti', width=16, num_heads=2, mlp_dim=32, depth=1, image_size=8, patch_size=4, num_classes=3)


def test_scratch_doubles_until_twice_the_steps_gains_less_than_half_a_point():
    # every run flat at its end; 2 pt more per doubling up to 400 steps, then nothing
    runner = FakeRunner(lambda lr, n, seed: 0.7 + 0.02 * min(n, 400) / 100 - abs(lr - 2e-3))
    out = scratch.baseline(runner, {(16, 1): CFG}, [0, 1])[(16, 1)]
    assert runner.calls[:3] == [(1e-3, 0, 100), (2e-3, 0, 100), (4e-3, 0, 100)]
    assert out['steps'] == 400 and out['converged'] and out['lr'] == 2e-3
    chain = out['doubling'][0]
    assert [n for n, _, _ in chain] == [100, 200, 400, 800]       # 400 converged: its 800 run checks it
    assert chain[-1][1] - chain[-2][1] < 0.005 and chain[1][1] - chain[0][1] >= 0.005
    assert out['runs'][1]['converged_at'] == 400 and out['runs'][1]['steps'] == 400
    assert [s['steps'] for s in out['sweeps']] == [100, 400]     # the sweep read again at 400
    # the plateau rule alone would have called the 100-step run converged (flat at its end)
    assert scratch.plateau(runner.fit('x', None, None, None, steps=100, lr=2e-3, seed=0, eval_every=10,
                                      dset=None, optim=None, identity=None)[1], 0.005) == 50


def test_scratch_stops_doubling_at_the_cap_and_says_so():
    runner = FakeRunner(lambda lr, n, seed: min(0.99, 0.5 + 0.1 * n / 100), max_steps=400)
    out = scratch.baseline(runner, {(16, 1): CFG}, [0])[(16, 1)]
    assert not out['converged'] and out['steps'] == 400 and out['runs'][0]['converged_at'] is None
    assert '**no**' in report.doubling_text(out)


def test_scratch_sweeps_extend_past_an_edge_and_are_read_again_at_the_converged_length():
    # at 100 steps 8e-3 is best (one step past the sweep's top), but it still gains 4 pt at 200
    # steps, where 2e-3 is best: read again at 200 steps, the choice moves down
    def final(lr, n, seed):
        best = 8e-3 if n <= 100 else 2e-3
        return 0.5 + 0.1 * min(n, 200) / 100 - 10 * abs(lr - best)
    runner = FakeRunner(final)
    out = scratch.baseline(runner, {(16, 1): CFG}, [0])[(16, 1)]
    first, again = out['sweeps']
    assert [e['value'] for e in first['extensions']] == [8e-3, 0.016] and first['choice'] == 8e-3
    assert not first['at_cap']
    assert again['steps'] == 200 and again['choice'] == 2e-3      # around 8e-3: 4e-3, 8e-3, 0.016
    assert [e['value'] for e in again['extensions']] == [2e-3, 1e-3]   # at the edge: extended down
    assert out['lr'] == 2e-3 and out['converged'] and out['steps'] == 200


def test_one_seed_needing_longer_sets_the_steps_of_every_seed():
    # seed 1 gains a point a doubling up to 400 steps; seeds 0 and 2 are converged at 100
    gain = lambda n, seed: 0.01 * {100: 0, 200: 1}.get(n, 2) if seed == 1 else 0.0   # noqa: E731
    runner = FakeRunner(lambda lr, n, seed: 0.9 + gain(n, seed) - abs(lr - 2e-3))
    out = scratch.baseline(runner, {(16, 1): CFG}, [0, 1, 2])[(16, 1)]
    assert {s: r['steps'] for s, r in out['runs'].items()} == {0: 400, 1: 400, 2: 400}
    assert {s: r['converged_at'] for s, r in out['runs'].items()} == {0: 100, 1: 400, 2: 400}
    assert (2e-3, 0, 400) in runner.calls            # seed 0 trained again at seed 1's steps
    assert out['converged']


def _run(name, shape, seed, acc, *, fraction=0.35, budget=None, curve=None):
    r = dict(name=name, method=name, label=name, shape=list(shape), seed=seed, fraction=fraction,
             steps=100, steps_taken=100, acc=acc, acc_init=0.2, curve=curve or [[0, 0.2], [100, acc]],
             params=1, extra_flops=0.0, step_flops=1.0, finetune_flops=100.0, upstream=[])
    if budget:
        r['budget'] = budget
    return r


def _record(rows):
    return dict(config={'experiment': 'tleg', 'target_gap': 0.005, 'amortise': [1], 'batch_size': 8,
                        'scratch': {'lrs': [1e-3, 2e-3, 4e-3]}},
                shapes=[[64, 3]], seeds=[0, 1, 2], rows_spec=['tleg', 'ceiling'], labels={}, cannot={},
                reference={}, scratch={'w64_d3': dict(acc=0.80, std=0.0, S=100, lr=1e-3)},
                upstream_flops={}, info={}, rows=rows)


def test_the_ceiling_share_is_read_at_scratchs_steps_and_the_p_at_the_paper_budget():
    rows = [dict(_run('scratch', (64, 3), s, a, fraction=1.0), lr=1e-3, plateau_step=80, converged=True)
            for s, a in enumerate((0.80, 0.81, 0.79))]
    rows += [_run('tleg', (64, 3), s, a) for s, a in enumerate((0.70, 0.71, 0.69))]            # paper: below
    rows += [_run('tleg', (64, 3), s, a, fraction=1.4, budget='equal') for s, a in enumerate((0.84, 0.85, 0.83))]
    rows += [_run('ceiling', (64, 3), s, a, fraction=1.4, budget='equal') for s, a in enumerate((0.88, 0.89, 0.87))]
    done = results.finish(_record(rows), [])
    tleg, ceil = (next(e for e in results.versus_scratch(done) if e['name'] == n) for n in ('tleg', 'ceiling'))
    assert tleg['fraction'] == 0.35 and tleg['delta'] == pytest.approx(-0.10)
    assert tleg['equal']['delta'] == pytest.approx(0.04) and tleg['ceiling_share'] == pytest.approx(0.5)
    assert ceil['equal']['delta'] == ceil['delta'] == pytest.approx(0.08) and ceil['ceiling_share'] == 1.0
    table = '\n'.join(report.headline(done))
    assert '| w64 L3 | tleg | 0.35·S | 0.7000 ± 0.0100 |' in table and '+0.50 |' in table
    # two summaries, one per budget, and the paper claims read the paper budget only
    assert sorted((s['name'], s['budget']) for s in done['summary']) == [
        ('ceiling', 'equal'), ('scratch', 'paper'), ('tleg', 'equal'), ('tleg', 'paper')]
    claim = results.Claim('TLEG reaches Scratch', 'reaches', 'tleg', 0.35)
    assert results.verdict(claim, done)['verdict'] == 'not reproduced'


def test_a_store_shares_a_finished_run_between_workdirs(tmp_path, monkeypatch):
    """The same model asked for in another workdir is copied from the store, not trained."""
    import jax

    from jlearngene.models import init
    from jlearngene.train import tasks
    config = {'data': {'name': 'digits', 'image_size': 8, 'splits': {'train': 'half_train', 'test': 'half_test'}},
              'batch_size': 16, 'eval_batch_size': 64, 'seed': 0}
    dset = harness.Data(config)
    cfg = vit_config('Ti', width=16, num_heads=2, mlp_dim=32, depth=1, image_size=8, patch_size=4,
                     num_classes=dset.num_classes, channels=1)
    store = str(tmp_path / 'store')

    def fit(workdir):
        reused = []
        out = harness.fit('scratch_w16_d1_lr0.001_s0', tasks.classification_loss(cfg), init(cfg, jax.random.key(0)),
                          harness.eval_fn(cfg), dset, steps=3, lr=1e-3, optim={'lr': 1e-3}, workdir=workdir,
                          seed=0, eval_every=None, identity={'model': cfg.to_dict()}, reused=reused, store=store)
        return out, reused

    (p1, c1, _), reused = fit(str(tmp_path / 'a'))
    assert not reused and len(os.listdir(store)) == 1
    (p2, c2, _), reused = fit(str(tmp_path / 'b'))
    assert reused == ['scratch_w16_d1_lr0.001_s0'] and c1 == c2
    assert os.path.exists(tmp_path / 'b' / 'runs' / 'scratch_w16_d1_lr0.001_s0' / harness.FINISHED)
    import numpy as np
    assert all(np.array_equal(np.asarray(a), np.asarray(b))
               for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p2)))


def test_every_method_row_trains_at_its_paper_budget_and_at_scratchs_steps_the_ceiling_at_scratchs_only():
    from types import SimpleNamespace

    from jlearngene.experiments import recipes, study
    ctx = SimpleNamespace(config={'descend': {'fractions': (0.35,), 'lr': 1e-3, 'equal_budget': True}},
                          base={(64, 3): {'steps': 2400, 'S': 1700}})
    ctx.default_budgets = lambda S: harness.Context.default_budgets(ctx, S)
    row = lambda method: recipes.Row(name=method, method=method, recipe=recipes.for_method(method),  # noqa: E731
                                     variant={}, gene={}, descend={})
    assert study._budgets(ctx, row('tleg'), (64, 3), 1700, None) == [
        (0.35, 595, 1e-3, 'paper'), (1.412, 2400, 1e-3, 'equal')]
    assert study._budgets(ctx, row('ceiling'), (64, 3), 1700, None) == [(1.412, 2400, 1e-3, 'equal')]
    ctx.config['descend']['equal_budget'] = False      # the same-task and digits studies: paper budgets only
    assert study._budgets(ctx, row('tleg'), (64, 3), 1700, None) == [(0.35, 595, 1e-3, 'paper')]
    assert study._budgets(ctx, row('ceiling'), (64, 3), 1700, None) == [(1.412, 2400, 1e-3, 'equal')]


def test_a_run_on_changed_data_trains_again_and_the_stale_run_is_kept_in_superseded(tmp_path, monkeypatch, caplog):
    """Fashion-MNIST files replaced by the same counts with shuffled labels are other data."""
    import jax
    import numpy as np
    from helpers import write_fashion_files

    from jlearngene.data import fashion
    from jlearngene.models import init
    from jlearngene.train import tasks
    folder = write_fashion_files(tmp_path / 'fashion', per_class=3, test_per_class=2)
    monkeypatch.delenv(fashion.ENV_VAR, raising=False)
    config = {'data': {'name': 'fashion_mnist', 'root': str(folder), 'image_size': 28},
              'batch_size': 8, 'eval_batch_size': 16, 'seed': 0}
    cfg = vit_config('Ti', width=16, num_heads=2, mlp_dim=32, depth=1, image_size=28, patch_size=14,
                     num_classes=10, channels=1)

    def fit():
        reused = []
        harness.fit('run', tasks.classification_loss(cfg), init(cfg, jax.random.key(0)), harness.eval_fn(cfg),
                    harness.Data(config), steps=2, lr=1e-3, optim={'lr': 1e-3}, workdir=str(tmp_path / 'w'),
                    seed=0, eval_every=None, reused=reused)
        return reused

    assert fit() == [] and fit() == ['run']
    labels = folder / fashion.FILES['train'][1]
    raw = bytearray(labels.read_bytes())
    raw[8:] = np.random.default_rng(1).permutation(np.frombuffer(bytes(raw[8:]), np.uint8)).tobytes()
    labels.write_bytes(bytes(raw))
    with caplog.at_level('WARNING'):
        assert fit() == []
    assert os.path.exists(tmp_path / 'w' / 'superseded' / 'run' / harness.FINISHED)
    assert any('other data (fashion_mnist' in r.getMessage() for r in caplog.records)


def test_a_ceiling_not_above_scratch_is_said_as_a_finding():
    rows = [dict(_run('scratch', (64, 3), s, a, fraction=1.0), lr=1e-3, plateau_step=80, converged=True)
            for s, a in enumerate((0.80, 0.81, 0.79))]
    rows += [_run('ceiling', (64, 3), s, a, fraction=1.4, budget='equal') for s, a in enumerate((0.78, 0.79, 0.77))]
    done = results.finish(_record(rows), [])
    line = report.ceiling_lines(done)[0]
    assert line.startswith('The ceiling is not above converged Scratch at w64 L3 (Δ -0.0200')
    rows[-3:] = [_run('ceiling', (64, 3), s, a, fraction=1.4, budget='equal') for s, a in enumerate((0.88, 0.89, 0.87))]
    assert report.ceiling_lines(results.finish(_record(rows), [])) == []
