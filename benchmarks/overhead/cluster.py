"""Cluster-Learngene's training-step overhead: a descendant trained through its FFN
expansion φ (the paper's trainable φ: each FFN group's representative FFN and φ are the
trainable parameters, the group's FFNs are generated in every step by
`cluster.materialize_descendant`) against the plain ViT step of the same shape.

The descendant keeps the ancestor's 3 heads per layer (ω = 1) with the official DeiT-Ti
head-centroid lists, so its FFN groups follow the paper's rule on their counts: layers
{1, 2}, {3, 4} and {10, 11} of 12 ({1, 2} of 4 in the quick case).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jlearngene.genes import cluster
from jlearngene.models import vit
from jlearngene.models.config import vit_config
from jlearngene.train import optim, tasks, trainer


def _step(loss_fn, trainable):
    """The jitted train step `(state, batch, rng) -> (state, metrics)` with the benchmarks'
    AdamW (no donation: the runner calls it repeatedly on the same arguments)."""
    opt = optim.make_optimizer(dict(lr=1e-3, schedule='constant', weight_decay=0.05,
                                    decay=('.*',), clip_norm=0.0), trainable)
    state = trainer.init_state(trainable, opt)
    return jax.jit(trainer.make_train_step(loss_fn, opt)), state


def case(quick: bool) -> dict:
    depth, width, batch = (4, 96, 16) if quick else (12, 192, 64)
    cfg = vit_config('Ti', width=width, depth=depth, image_size=32, patch_size=4, num_classes=100)
    key = jax.random.key(0)
    rng = np.random.default_rng(0)
    data = {'image': jnp.asarray(rng.standard_normal((batch, 32, 32, 3), np.float32)),
            'label': jnp.asarray(rng.integers(0, 100, (batch,)).astype(np.int32))}
    base = jax.random.key_data(jax.random.key(1))

    plain_params = vit.init(cfg, key)
    plain_fn, plain_state = _step(tasks.classification_loss(cfg), plain_params)

    gene = cluster.gene_from_model(plain_params, cfg,
                                   clusters=cluster.OFFICIAL_CENTROIDS['Ti'][:depth], ffn='paper')
    state = cluster.descendant_state(gene, cfg, key=jax.random.key(2), head='new')
    inner = tasks.classification_loss(cfg)

    def loss_fn(s, b, r):
        return inner(cluster.materialize_descendant(s), b, r)
    method_fn, method_state = _step(loss_fn, state)
    groups = cluster.gene_groups(gene)
    return {'name': 'cluster (trainable φ)',
            'shape': f'Ti-{depth} width {width} batch {batch} at 32 px, FFN groups {list(groups)}',
            'plain': (plain_fn, (plain_state, data, base)),
            'method': (method_fn, (method_state, data, base))}
