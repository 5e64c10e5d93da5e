"""The Mango study's own part (config: `jlearngene/experiments/configs/mango.py`; the harness:
`jlearngene.experiments.study`): the claims of Mango (Pan et al., 2024) and of the growth
methods it compares with, as FLOPs to Scratch's converged accuracy (every grown model stops
at the target; the operators' training counted, the small model's reported apart).
"""
from __future__ import annotations

from jlearngene.experiments import study

CLAIMS = (
    study.Claim('Mango (R=1) reaches Scratch(S) − 0.5 pt with fewer training FLOPs than Scratch',
                'cheaper', 'mango/1', 1.0),
    study.Claim('Mango saves about three quarters of the FLOPs to Scratch\'s accuracy (≤ 0.3×; '
                'the paper: 76 %)', 'cheaper', 'mango/1', 1.0, flops_ratio=0.3),
    study.Claim('Mango (R=1) reaches the target with fewer FLOPs than LiGO', 'cheaper', 'mango/1', 1.0,
                other='ligo'),
    study.Claim('LiGO reaches the target with fewer FLOPs than bert2BERT', 'cheaper', 'ligo', 1.0,
                other='bert2bert'),
    study.Claim('bert2BERT reaches the target with fewer FLOPs than Net2Net', 'cheaper', 'bert2bert', 1.0,
                other='net2net'),
)

STUDY = study.Study(claims=CLAIMS)
