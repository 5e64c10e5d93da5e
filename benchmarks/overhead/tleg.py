"""TLEG: the Aux-Net step (gene -> tleg.expand -> apply) against the plain step."""
import jax

from jlearngene.genes import tleg
from jlearngene.train import tasks

import overhead   # benchmarks/overhead, beside the runner


def case(quick: bool) -> dict:
    cfg, batch = overhead.config(quick)
    inner = tasks.classification_loss(cfg)

    def loss_fn(gene, b, rng):
        return inner(tleg.expand(gene, cfg.depth), b, rng)

    return dict(name='tleg', shape=overhead.describe(cfg, batch), plain=overhead.plain(cfg, batch),
                method=overhead.train_step(loss_fn, tleg.init_gene(cfg, jax.random.key(0)), cfg,
                                           batch))
