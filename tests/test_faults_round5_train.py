"""Faults, round five (training modules): each test names the fault it guards against.

Optimiser fields of the wrong type (a string `freeze` split into one-letter regexes, an
`lr_mults` entry that is no pair or has no number), two processes making one new workdir,
metrics files whose rows cannot be ordered, a re-save of a kept checkpoint that deletes it
before the new one is written, `set_aside` naming an older copy, and explicit settings of
one process that start the distributed runtime."""
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from orbax.checkpoint import v1 as ocp

from jlearngene import distributed
from jlearngene.train import metrics, optim, run_checkpoint, workdir_lock
from jlearngene.train.integrity import CheckpointError


# -- optimiser config types -------------------------------------------------------------

@pytest.mark.parametrize('field, value', [
    ('freeze', 'pos_embed'), ('decay', 'kernel'), ('freeze', ('pos_embed', 3)), ('decay', None),
])
def test_freeze_and_decay_must_be_sequences_of_regexes(field, value):
    """A plain string was split into one-letter regexes: `freeze='pos_embed'` froze nothing."""
    with pytest.raises(ValueError, match=f'optimizer: {field} must be a list or tuple of regex strings'):
        optim.check({field: value})


@pytest.mark.parametrize('entry', [5, 'ab', ('head', 'x'), ('head', float('nan')), ('head', True),
                                   (3, 2.0), ('head', -1.0)])
def test_lr_mults_entries_are_checked(entry):
    """A non-sequence entry raised a TypeError from `len`; the multiplier was never checked."""
    with pytest.raises(ValueError, match='optimizer lr_mults entries must be'):
        optim.check({'lr_mults': (entry,)})


def test_lr_mults_must_be_a_sequence():
    with pytest.raises(ValueError, match='optimizer: lr_mults must be a list or tuple'):
        optim.check({'lr_mults': 'head'})


def test_sequence_fields_still_accepted():
    c = optim.check({'freeze': ['pos_embed'], 'decay': ('kernel', 'embedding'),
                     'lr_mults': [['head/.*', 10], ('cls', 0.5)]})
    assert c['freeze'] == ['pos_embed'] and c['lr_mults'][0] == ['head/.*', 10]


# -- workdir lock ------------------------------------------------------------------------

def test_two_processes_making_one_new_workdir(tmp_path, monkeypatch):
    """The process that lost the race to make the folder got a FileExistsError."""
    workdir = str(tmp_path / 'run')
    real = os.makedirs

    def other_made_it_first(path, *args, **kwargs):
        real(path)   # the other process wins the race
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, 'makedirs', other_made_it_first)
    path = workdir_lock.acquire(workdir)
    monkeypatch.setattr(os, 'makedirs', real)
    assert os.path.exists(path)
    workdir_lock.release(path)
    assert os.path.isdir(workdir)   # not made by this process: not removed with the lock


def test_workdir_that_is_a_file_still_refused(tmp_path):
    target = tmp_path / 'run'
    target.write_text('x')
    with pytest.raises(FileExistsError):
        workdir_lock.acquire(str(target))


# -- metrics file ------------------------------------------------------------------------

@pytest.mark.parametrize('rows, bad, why', [
    ([{'step': 1, 'kind': 'train'}, {'step': 1, 'kind': None}], 2, 'kind'),
    ([{'step': 1, 'kind': 'train'}, {'step': '2', 'kind': 'train'}], 2, 'step'),
    ([{'step': {'a': 1}, 'kind': 'train'}], 1, 'step'),
    ([{'step': 1, 'kind': ['train']}], 1, 'kind'),
])
def test_read_metrics_rows_that_cannot_be_ordered(tmp_path, rows, bad, why):
    """A null kind or a string step raised a TypeError from the sort (or from hashing)."""
    path = tmp_path / metrics.METRICS_FILE
    path.write_text(''.join(json.dumps(r) + '\n' for r in rows))
    with pytest.raises(ValueError, match=f'{path}:{bad}: .*{why}'):
        metrics.read_metrics(str(tmp_path))


def test_read_metrics_good_rows_unchanged(tmp_path):
    path = tmp_path / metrics.METRICS_FILE
    rows = [{'step': 2, 'kind': 'train'}, {'step': 1, 'kind': 'eval'}, {'step': 1}]
    path.write_text(''.join(json.dumps(r) + '\n' for r in rows))
    assert [r['step'] for r in metrics.read_metrics(str(tmp_path))] == [1, 1, 2]


# -- run checkpoints ---------------------------------------------------------------------

def _state(v):
    return {'params': {'w': jnp.full((3,), v, jnp.float32)}, 'step': jnp.int32(int(v))}


def test_resave_failure_keeps_the_kept_checkpoint(tmp_path, monkeypatch):
    """A re-save of a kept step deleted it first: a failed write left neither."""
    with run_checkpoint.RunCheckpointer(tmp_path / 'c') as ck:
        ck.save(5, _state(1.0), metrics={'acc': 1.0})

    def fail(*args, **kwargs):
        raise OSError(28, 'No space left on device')

    monkeypatch.setattr(ocp.training.Checkpointer, 'save_checkpointables', fail)
    ck = run_checkpoint.RunCheckpointer(tmp_path / 'c')
    with pytest.raises(CheckpointError, match='could not be written'):
        ck.save(5, _state(2.0))
    ck.close()
    monkeypatch.undo()
    with run_checkpoint.RunCheckpointer(tmp_path / 'c') as ck:
        assert ck.steps() == [5]
        state, _ = ck.restore(_state(0.0), 5)
        np.testing.assert_array_equal(state['params']['w'], np.ones(3))
    assert sorted(os.listdir(tmp_path / 'c')) == ['5']   # no temporary left beside it


def test_resave_replaces_the_kept_checkpoint(tmp_path):
    with run_checkpoint.RunCheckpointer(tmp_path / 'c', best_metric='acc') as ck:
        ck.save(4, _state(1.0), metrics={'acc': 0.9})
        ck.save(5, _state(1.0), metrics={'acc': 0.1})
        ck.save(5, _state(2.0), metrics={'acc': 0.95}, data_state={'pos': 7})
        assert ck.steps() == [4, 5] and ck.best_step() == 5
        state, meta = ck.restore(_state(0.0), 5)
        np.testing.assert_array_equal(state['params']['w'], np.full(3, 2.0))
        assert meta['data_state'] == {'pos': 7}
        ck.save(6, _state(3.0))   # the checkpointer goes on saving as before
        assert ck.steps() == [5, 6]
    assert sorted(os.listdir(tmp_path / 'c')) == ['5', '6']


def test_set_aside_names_where_the_other_process_moved_it(tmp_path, monkeypatch):
    """With `<step>` already aside, the branch for a checkpoint moved first by another process
    returned `.unreadable/<step>`, the older copy."""
    ck = run_checkpoint.RunCheckpointer(tmp_path / 'c')
    ck.save(3, _state(1.0))
    aside = str(tmp_path / 'c') + '.unreadable'
    os.makedirs(os.path.join(aside, '3'))   # an older copy set aside before
    real = shutil.move

    def moved_first(src, dst):
        real(src, dst)   # the other process of the run, which chose the same name
        raise FileNotFoundError(src)

    monkeypatch.setattr(shutil, 'move', moved_first)
    assert ck.set_aside(3) == os.path.join(aside, '3-2')
    ck.close()


# -- distributed -------------------------------------------------------------------------

def test_explicit_single_process_starts_no_runtime(monkeypatch):
    """`num_processes=1` gave a multi-process Setup, so `initialize` started the runtime."""
    def started(*args, **kwargs):
        raise AssertionError('jax.distributed.initialize called for one process')

    monkeypatch.setattr(jax.distributed, 'initialize', started)
    setup = distributed.resolve('127.0.0.1:9', 1, 0)
    assert setup.source == 'args' and not setup.multi_process
    assert distributed.initialize('127.0.0.1:9', 1, 0) == distributed.Setup('single')
    assert distributed.resolve('127.0.0.1:9', 2, 1).multi_process
