"""`evaluate`: exact means over a split from per-batch sums, with and without a mesh."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jlearngene import parallel
from jlearngene.train import evaluate as evaluate_fn
from jlearngene.train.evaluate import evaluate


RNG = np.random.default_rng(0)
W = RNG.normal(size=(5, 3)).astype(np.float32)


def linear_eval(params, batch):
    """Sums over valid rows of correctness and squared error of a linear classifier."""
    logits = batch['x'] @ params['w']
    mask = batch['mask'].astype(jnp.float32)
    correct = (jnp.argmax(logits, -1) == batch['label']).astype(jnp.float32)
    err = jnp.sum(logits ** 2, -1)
    return {'accuracy': (correct * mask).sum(), 'loss': (err * mask).sum(), 'count': mask.sum()}


def _batches(sizes, valid):
    out = []
    for n, v in zip(sizes, valid):
        x = RNG.normal(size=(n, 5)).astype(np.float32)
        out.append({'x': x, 'label': RNG.integers(0, 3, n).astype(np.int32), 'mask': np.arange(n) < v})
    return out


def _reference(batches):
    x = np.concatenate([b['x'][b['mask']] for b in batches])
    y = np.concatenate([b['label'][b['mask']] for b in batches])
    logits = x @ W
    return {'accuracy': float(np.mean(np.argmax(logits, -1) == y)),
            'loss': float(np.mean(np.sum(logits ** 2, -1))), 'count': float(len(y))}


def test_means_over_the_whole_split_not_over_batches():
    batches = _batches([16, 16, 8], [16, 3, 8])     # a mostly padded middle batch
    got = evaluate(linear_eval, {'w': W}, batches)
    want = _reference(batches)
    assert got['count'] == 27.0
    np.testing.assert_allclose([got['accuracy'], got['loss']], [want['accuracy'], want['loss']], rtol=1e-5)
    # Not vacuous: the mean of per-batch means differs.
    per_batch = [_reference([b])['loss'] for b in batches]
    assert abs(np.mean(per_batch) - want['loss']) > 1e-3
    assert set(got) == {'accuracy', 'loss', 'count'}
    assert evaluate_fn is evaluate                  # the package exports the function


def test_mesh_and_jitted_give_the_same_means():
    batches = _batches([16, 8], [13, 8])
    plain = evaluate(linear_eval, {'w': W}, batches)
    mesh = parallel.make_mesh()
    calls = []
    fn = jax.jit(linear_eval)

    def jitted(params, batch):
        calls.append(batch['x'].sharding)
        return fn(params, batch)
    sharded = evaluate(linear_eval, jax.device_put({'w': W}, parallel.replicated(mesh)), batches,
                       mesh=mesh, jitted=jitted)
    assert len(calls) == 2 and all(s.spec == jax.P('data') for s in calls)
    np.testing.assert_allclose([sharded[k] for k in sorted(plain)], [plain[k] for k in sorted(plain)],
                               rtol=1e-6)


def test_refusals():
    with pytest.raises(ValueError, match='no batches'):
        evaluate(linear_eval, {'w': W}, [])
    with pytest.raises(ValueError, match=r"'count'.*\['accuracy'\]"):
        evaluate(lambda p, b: {'accuracy': jnp.sum(b['x'])}, {'w': W}, _batches([4], [4]))
    none_valid = evaluate(linear_eval, {'w': W}, _batches([4], [0]))
    assert none_valid == {'accuracy': 0.0, 'loss': 0.0, 'count': 0.0}
