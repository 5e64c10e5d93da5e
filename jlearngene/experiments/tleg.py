"""The TLEG study's own part (config: `jlearngene/experiments/configs/tleg.py`; the harness:
`jlearngene.experiments.study`).

* descendants (Scratch's too) are `genes.tleg.descendant_config` of the shape: with
  `descend.official_pool_order` they pool LN(mean(x)) with LayerNorm eps 1e-6, as the
  official Des-Net (timm `fc_norm`), while the Aux-Net pools mean(LN(x));
* the claims of TLEG (Xia et al., 2024) that the digits can test, at the spec's budgets
  (descendants 0.35·S, the Aux-Net 1.5·S).
"""
from __future__ import annotations

from jlearngene.experiments import study
from jlearngene.genes import tleg


def descendant_config(cfg, config):
    """The study's Des-Net config for a descendant shape `cfg`: `tleg.descendant_config` at that
    depth, with the official pooling order where `config['descend']['official_pool_order']`.
    """
    return tleg.descendant_config(cfg, cfg.depth,
                                  official_pool_order=bool(config['descend']['official_pool_order']))


CLAIMS = (
    study.Claim('TLEG descendants tuned 0.35·S reach Scratch(S) − 0.5 pt at every depth with at '
                'most 0.6× Scratch\'s total training FLOPs', 'reaches', 'tleg', 0.35, flops_ratio=0.6),
    study.Claim('TLEG beats Share-Init (θ_A ≡ 0) at 0.35·S', 'beats', 'tleg', 0.35, other='share_init'),
    study.Claim('TLEG beats He-LG at 0.35·S', 'beats', 'tleg', 0.35, other='he_lg'),
    study.Claim('TLEG beats Mini-Init (⌈depth/2⌉ shared parts) at 0.35·S', 'beats', 'tleg', 0.35,
                other='mini_init'),
)

STUDY = study.Study(descendant_config=descendant_config, claims=CLAIMS)
