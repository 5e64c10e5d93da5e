"""Checks a run makes before its first step (data splits, sizes, one decoded sample), the
metrics file of a restarted run, and the non-finite-loss message without a checkpoint."""
import json
import os

import jax
import numpy as np
import pytest
from PIL import Image

from jlearngene import data
from jlearngene.commands import run
from jlearngene.experiments import configs
from jlearngene.models import init, vit_config
from jlearngene.train import hooks, metrics, optim, tasks, trainer

CFG = vit_config('Ti', width=16, num_heads=2, mlp_dim=32, depth=1, image_size=8, patch_size=4,
                 num_classes=2, channels=1)
PARAMS = jax.jit(init, static_argnums=0)(CFG, jax.random.key(0))
LOSS = tasks.classification_loss(CFG)
TX = optim.make_optimizer({'lr': 1e-3}, PARAMS, total_steps=8)
RNG = np.random.default_rng(0)
X = RNG.normal(size=(32, 8, 8, 1)).astype(np.float32)
Y = (X[..., 0].mean((1, 2)) > 0).astype(np.int32)


class Batches:
    """Endless deterministic batches with get_state/set_state; `poison` NaNs batch i."""

    def __init__(self, poison=None):
        self.i, self.poison = 0, poison

    def __next__(self):
        j = (self.i * 8) % len(X)
        b = {'image': X[j:j + 8], 'label': Y[j:j + 8]}
        if self.i == self.poison:
            b = dict(b, image=np.full_like(b['image'], np.nan))
        self.i += 1
        return b

    def get_state(self):
        return {'i': self.i}

    def set_state(self, state):
        self.i = state['i']


def _fit(workdir, steps, data=None, **kw):
    kw.setdefault('log_every', 2)
    return trainer.fit(LOSS, PARAMS, data or Batches(), TX, trainer.FitConfig(
        workdir=str(workdir), steps=steps, seed=1, progress=False, console=False,
        tensorboard=False, steps_per_call=1, **kw))


def _rows(workdir):
    with open(os.path.join(workdir, metrics.METRICS_FILE), encoding='utf-8') as f:
        return [json.loads(line) for line in f if line.strip()]


# ------------------------------------------------------------------------ data, before step 1

def _folder(root, splits=('train', 'test'), per=6):
    for split in splits:
        for c, name in enumerate(('cat', 'dog')):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(per):
                Image.fromarray(np.full((8, 8), 40 * c + i, np.uint8), 'L').save(
                    root / split / name / f'{i}.png')


def _config(root, **over):
    c = configs.load('digits_vit:folder,smoke', {'data.root': str(root), 'model.num_classes': 2})
    c.data.update(image_size=8, channels=1)
    c.model.update(image_size=8, channels=1, width=16, num_heads=2, mlp_dim=32, depth=1,
                   patch_size=4)
    c.update(dict(steps=2, log_every=1, eval_every=2, checkpoint_every=2, batch_size=8,
                  eval_batch_size=8, best_metric=''))
    c.update(over)
    return c


def _assert_nothing_ran(workdir):
    assert not os.path.exists(workdir / metrics.METRICS_FILE)
    assert not os.path.exists(workdir / 'checkpoints') or not os.listdir(workdir / 'checkpoints')


def test_missing_eval_split_is_refused_before_training(tmp_path):
    _folder(tmp_path / 'img', splits=('train',))
    with pytest.raises(data.DataError, match=r"eval_split 'test'.*does not exist"):
        run.run_classification(_config(tmp_path / 'img'), str(tmp_path / 'w'), progress=False)
    _assert_nothing_ran(tmp_path / 'w')


def test_batch_size_larger_than_the_train_split_is_refused(tmp_path):
    _folder(tmp_path / 'img')   # 12 training images
    with pytest.raises(data.DataError, match=r"'train'.*batch_size 16.*12 examples"):
        run.run_classification(_config(tmp_path / 'img', batch_size=16), str(tmp_path / 'w'),
                               progress=False)
    _assert_nothing_ran(tmp_path / 'w')


@pytest.mark.parametrize('split', ['train', 'test'])
def test_an_undecodable_first_sample_is_refused_before_training(tmp_path, split):
    _folder(tmp_path / 'img')
    path = tmp_path / 'img' / split / 'cat' / '0.png'
    noise = np.random.default_rng(0).integers(0, 256, (16, 16), dtype=np.uint8)
    Image.fromarray(noise, 'L').save(path)
    path.write_bytes(path.read_bytes()[:200])   # the header survives, the pixels do not
    with pytest.raises(data.DataError, match=rf"'{split}'.*0\.png"):
        run.run_classification(_config(tmp_path / 'img'), str(tmp_path / 'w'), progress=False)
    _assert_nothing_ran(tmp_path / 'w')


def test_good_folder_trains_and_evaluates(tmp_path):
    _folder(tmp_path / 'img')
    _, hist = run.run_classification(_config(tmp_path / 'img'), str(tmp_path / 'w'),
                                     progress=False)
    assert [r['step'] for r in hist['eval']] == [2] and hist['eval'][0]['eval/count'] == 12


# ------------------------------------------------------------------------ metrics.jsonl

def test_restart_from_step_zero_drops_the_earlier_attempts_rows(tmp_path):
    # An attempt killed before its first checkpoint logged steps 1..3.
    with open(tmp_path / metrics.METRICS_FILE, 'w', encoding='utf-8') as f:
        for step in (1, 2, 3):
            f.write(json.dumps({'step': step, 'kind': 'train', 'time': 0.0, 'loss': 9.0}) + '\n')
    _fit(tmp_path, 4)
    rows = _rows(tmp_path)
    assert [r['step'] for r in rows] == [2, 4] and all(r['loss'] != 9.0 for r in rows)


def test_resume_keeps_rows_up_to_the_checkpoint_and_drops_later_ones(tmp_path):
    _fit(tmp_path, 4)                      # rows 2, 4; final checkpoint at 4
    kept = _rows(tmp_path)
    with open(tmp_path / metrics.METRICS_FILE, 'a', encoding='utf-8') as f:   # killed at 5
        f.write(json.dumps({'step': 5, 'kind': 'train', 'time': 0.0, 'loss': 9.0}) + '\n')
    _fit(tmp_path, 6)
    rows = _rows(tmp_path)
    assert [r['step'] for r in rows] == [2, 4, 6]
    assert rows[:2] == kept


def test_truncate_keeps_rows_at_the_step_and_drops_unparsable_lines(tmp_path):
    path = tmp_path / metrics.METRICS_FILE
    path.write_text('{"step": 1, "kind": "train"}\n{"step": 2, "kind": "eval"}\nnot json\n'
                    '{"step": 3, "kind": "train"}\n{"step": 2, "kind": "train"}\n'
                    '{"step": 3, "kind": "tr')
    assert metrics.truncate_after(str(tmp_path), 2) == 1
    assert path.read_text() == ('{"step": 1, "kind": "train"}\n{"step": 2, "kind": "eval"}\n'
                                '{"step": 2, "kind": "train"}\n')
    assert metrics.truncate_after(str(tmp_path / 'none'), 0) == 0


# ------------------------------------------------------------------------ non-finite loss

def test_nan_before_any_checkpoint_says_none_was_saved(tmp_path):
    with pytest.raises(hooks.NonFiniteLossError) as exc:
        _fit(tmp_path, 4, data=Batches(poison=0), log_every=1)
    msg = str(exc.value)
    assert 'step 1' in msg and 'no checkpoint' in msg.lower() and 'None' not in msg


def test_eval_batch_size_that_does_not_split_over_the_devices_is_refused(tmp_path):
    _folder(tmp_path / 'img')
    n = jax.device_count()
    with pytest.raises(data.DataError, match=rf"eval_split 'test'.*eval_batch_size {n + 1}.*{n}"):
        run.run_classification(_config(tmp_path / 'img', eval_batch_size=n + 1),
                                 str(tmp_path / 'w'), progress=False)
    _assert_nothing_ran(tmp_path / 'w')
