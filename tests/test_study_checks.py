"""A study that cannot run is refused before it trains, in one line (the study-level fields
`study.check` reads), and a study counts each run read back from an earlier process once."""
import os

import pytest

from jlearngene.experiments import configs, harness, study


def fashion(**overrides):
    c = configs.load('tleg:fashion')
    c.unlock()
    for key, value in overrides.items():
        node = c
        *path, leaf = key.split('.')
        for part in path:
            node = node[part]
        node[leaf] = value
    return c


@pytest.mark.parametrize('key, value, says', [
    ('tasks.ancestor', (), r'tasks.ancestor=\(\); give the class numbers'),
    ('tasks.descendant', (), r'tasks.descendant=\(\); give the class numbers'),
    ('tasks.descendant', (4, 5, 6, 7, 8), r'share the classes \[4\]'),
    ('tasks.ancestor', (0, 1, 1), 'repeats a class'),
    ('labels.fractions', (0.1, 0.1), 'repeats a label budget'),
    ('labels.fractions', (0.01, 0.010000001), 'repeats a label budget'),    # both render as 0.01
    ('labels.fractions', (0.01, 1.5), r'in \(0, 1\]'),
    ('labels.seeds', (0, 1), 'give a tuple of seeds per label budget'),
    ('scratch.lrs', (1e-3, 1e-3, 2e-3), 'repeats a value'),
    ('scratch.lrs', (1e-3, -2e-3, 4e-3), 'give positive numbers'),
    ('scratch.weight_decays', (0.05, 0.05), 'repeats a value'),
    ('descend.lrs', (3e-4, 1e-3, 'x'), 'give positive numbers'),
])
def test_a_study_level_contradiction_is_one_line_before_anything_runs(tmp_path, key, value, says):
    with pytest.raises(ValueError, match=says) as e:
        study.run_experiment(fashion(**{key: value}), str(tmp_path / 'w'), quiet=True)
    assert '\n' not in str(e.value)
    assert not os.path.exists(tmp_path / 'w')


def test_the_bundled_transfer_configs_pass_the_checks():
    for name in ('tleg', 'letra', 'cluster', 'compare'):
        study.check(configs.load(f'{name}:fashion'))


def test_a_run_is_counted_reused_once_and_only_when_an_earlier_process_finished_it(tmp_path):
    """Within one process a run trained and asked for again is not 'reused'; across processes
    each run read back counts once, however often it is asked for."""
    import jax

    from jlearngene.models import init, vit_config
    from jlearngene.train import tasks
    c = configs.load('tleg:smoke')
    ctx = harness.Context(harness.plain(c), str(tmp_path), quiet=True)
    cfg = vit_config('Ti', width=16, num_heads=2, mlp_dim=32, depth=1, image_size=16, patch_size=8,
                     num_classes=ctx.K, channels=1)

    def ask(ctx):
        ctx.fit('r', tasks.classification_loss(cfg), init(cfg, jax.random.key(0)), harness.eval_fn(cfg),
                steps=2, lr=1e-3, seed=0)

    ask(ctx), ask(ctx)
    assert ctx.reused == [] and ctx.trained == {'r'}
    later = harness.Context(harness.plain(c), str(tmp_path), quiet=True)    # a later process
    ask(later), ask(later)
    assert later.reused == ['r'] and later.trained == set()


def test_a_plain_run_and_a_study_never_share_a_workdir(tmp_path):
    from jlearngene.commands import run
    study_dir, plain_dir = tmp_path / 's', tmp_path / 'p'
    c = configs.load('tleg:smoke')
    study_dir.mkdir()
    harness.claim_workdir(str(study_dir), harness.plain(c))
    with pytest.raises(ValueError, match='belongs to a study'):
        run.run_classification(configs.load('digits_vit', {'steps': 1}), str(study_dir))
    plain_dir.mkdir()
    (plain_dir / 'metrics.jsonl').write_text('')
    with pytest.raises(ValueError, match=r'holds a training run \(metrics.jsonl\), not a study'):
        study.run_experiment(c, str(plain_dir), quiet=True)


@pytest.mark.parametrize('headline', [False, True])
def test_render_refuses_a_results_json_that_is_a_fifo_instead_of_blocking(tmp_path, capsys, headline):
    from jlearngene import cli
    os.mkfifo(tmp_path / 'results.json')
    assert cli.main(['render'] + (['--headline'] if headline else []) + [str(tmp_path)]) != 0
    assert 'is not a regular file' in capsys.readouterr().err
