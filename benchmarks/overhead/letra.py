"""LeTra: the Aux-Net step (gene -> letra.materialize -> apply) against the plain step of the
Aux-Net's shape. The learngene has the official ratio: a third of DeiT-Ti's heads (1 of 3,
width 64) and half its depth."""
import jax

from jlearngene.genes import letra
from jlearngene.train import tasks

import overhead   # benchmarks/overhead, beside the runner


def case(quick: bool) -> dict:
    cfg, batch = overhead.config(quick)
    inner = tasks.classification_loss(cfg)

    def loss_fn(gene, b, rng):
        return inner(letra.materialize(gene, None, cfg), b, rng)

    gene = letra.init_gene(cfg, jax.random.key(0))
    return dict(name='letra', shape=overhead.describe(cfg, batch), plain=overhead.plain(cfg, batch),
                method=overhead.train_step(loss_fn, gene, cfg, batch))
