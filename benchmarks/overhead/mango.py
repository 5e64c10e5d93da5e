"""Mango's operator-training step (grow the large model from the frozen small one by the
staged ring contraction, then its training step) against the plain training step of the
large model, at the same shape.

The large model is the benchmark's shape (`overhead.config`: DeiT-Ti, 12 layers, at 32 px,
patch 4, batch 64, 100 classes; or JLEARNGENE_OVERHEAD_SHAPE), grown from half its width,
MLP and depth with its head count at ring rank 4 (quick: 4 layers from 2, rank 2).
`remat=False`: the contraction's intermediates are kept for the backward pass, the faster
choice at these sizes.
"""
import jax

from jlearngene.genes import mango
from jlearngene.models import init
from jlearngene.train import tasks

import overhead   # benchmarks/overhead, beside the runner


def case(quick: bool) -> dict:
    large, batch = overhead.config(quick)
    small = large.replace(width=large.width // 2, mlp_dim=large.mlp_dim // 2,
                          depth=large.depth // 2)
    rank = 2 if quick else 4
    inner = tasks.classification_loss(large)

    def operator_loss(trainable, b, r):
        grown = mango.grow(trainable['operator'], jax.lax.stop_gradient(trainable['small']),
                           large, remat=False)
        return inner(grown, b, r)

    key = jax.random.key(0)
    trainable = {'operator': mango.init_operator(small, large, rank, key),
                 'small': init(small, key)}
    return dict(name='mango',
                shape=(f'{overhead.describe(large, batch)}, grown from width {small.width} '
                       f'depth {small.depth} at R={rank}'),
                plain=overhead.plain(large, batch),
                method=overhead.train_step(operator_loss, trainable, large, batch,
                                           freeze=('small/.*',)))
