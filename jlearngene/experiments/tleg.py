"""The TLEG experiment's method part (config: `jlearngene/experiments/configs/tleg.py`).

What it changes in the harness's defaults:

* descendants are `genes.tleg.descendant_config` of the model section: with
  `descend.official_pool_order` they pool LN(mean(x)) with LayerNorm eps 1e-6, as the
  official Des-Net (timm `fc_norm`), while the Aux-Net pools mean(LN(x));
* TLEG and Share-Init descendants inherit the gene's head (same task, as the paper does on
  ImageNet), so their S-Params include it;
* He-LG inherits the teacher's last k layers with k = `method_options.he_lg.k`, or
  k = ⌈L_d / 2⌉ with k = 0 (the paper: the last 3 of 6), at most the teacher's depth; its
  label shows k.
"""
from __future__ import annotations

import math

from jlearngene.experiments import harness
from jlearngene.genes import tleg


def descendant_config(cfg, config):
    return tleg.descendant_config(cfg, cfg.depth,
                                  official_pool_order=bool(config['descend']['official_pool_order']))


def _inherit_head(options, depth, teacher):
    return {**options, 'descend': {**options['descend'], 'head': 'inherit'}}


def _he_lg_k(options, depth, teacher):
    if depth is None:
        return options
    k = options['gene'].get('k') or math.ceil(depth / 2)
    return {**options, 'gene': {**options['gene'], 'k': min(k, teacher.depth)}}


_ADJUST = {'tleg': _inherit_head, 'share_init': _inherit_head, 'he_lg': _he_lg_k}


def options(method, depth, config, teacher):
    base = harness.config_options(method, depth, config, teacher)
    adjust = _ADJUST.get(method.name)
    return adjust(base, depth, teacher) if adjust else base


def label(method, options):
    k = options['gene'].get('k')
    return f'{method.label} (k={k})' if k else method.label


PART = harness.Part(descendant_config=descendant_config, options=options, label=label)
