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

from jlearngene.genes import cluster
from jlearngene.models import vit
from jlearngene.models.config import vit_config
from jlearngene.train import tasks

import overhead   # benchmarks/overhead, beside the runner


def case(quick: bool) -> dict:
    depth, width, batch = (4, 96, 16) if quick else (12, 192, 64)
    cfg = vit_config('Ti', width=width, depth=depth, image_size=32, patch_size=4, num_classes=100)
    key = jax.random.key(0)
    plain_params = vit.init(cfg, key)
    plain = overhead.train_step(tasks.classification_loss(cfg), plain_params, cfg, batch)

    gene = cluster.gene_from_model(plain_params, cfg,
                                   clusters=cluster.OFFICIAL_CENTROIDS['Ti'][:depth], ffn='paper')
    state = cluster.descendant_state(gene, cfg, key=jax.random.key(2), head='new')
    inner = tasks.classification_loss(cfg)

    def loss_fn(s, b, r):
        return inner(cluster.materialize_descendant(s), b, r)
    groups = cluster.gene_groups(gene)
    return {'name': 'cluster (trainable φ)',
            'shape': f'Ti-{depth} width {width} batch {batch} at 32 px, FFN groups {list(groups)}',
            'plain': plain, 'method': overhead.train_step(loss_fn, state, cfg, batch)}
