"""The Scala study's own part (config: `jlearngene/experiments/configs/scala.py`; the harness:
`jlearngene.experiments.study`): the claims of Scala (Zhang et al., 2025) that the digits can
test, on its sub-networks as they come out of the one slimmable network (0·S), against
separately trained networks (at Scala's steps per width, the paper's comparison, and at its
FLOPs), US-Net with the same full-width warm-up, and a converged Scratch at every width.
"""
from __future__ import annotations

from jlearngene.experiments import study

SMALLEST = ((16, 4),)                                     # r = 0.25 of width 64
HALF_AND_UP = ((32, 4), (40, 4), (48, 4), (56, 4), (64, 4))   # grid widths r ≥ 0.5

CLAIMS = (
    study.Claim('Scala\'s smallest sub-network (r = 0.25) beats separate training at the same '
                'steps', 'beats', 'scala/clean', 0.0, other='separate/steps', other_fraction=1.0,
                shapes=SMALLEST),
    study.Claim('Scala\'s smallest sub-network (r = 0.25) beats US-Net\'s', 'beats', 'scala/clean', 0.0,
                other='us_net', shapes=SMALLEST),
    study.Claim('Scala is within 1 pt of separate training (same steps) at r ≥ 0.5', 'close',
                'scala/clean', 0.0, other='separate/steps', other_fraction=1.0, tolerance=0.01,
                shapes=HALF_AND_UP),
    study.Claim('US-Net at full width is within 1 pt of separate training', 'close', 'us_net', 0.0,
                other='separate/steps', other_fraction=1.0, tolerance=0.01, shapes=((64, 4),)),
)

STUDY = study.Study(claims=CLAIMS)
