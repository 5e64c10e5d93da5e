"""The LeTra study's own part (config: `jlearngene/experiments/configs/letra.py`; the harness:
`jlearngene.experiments.study`): the claims of LeTra (Feng et al., 2025) that the digits can
test, at the spec's budgets (descendants at 0 and 0.05·S, the Aux-Net 3.2·S). Its
descendants differ in width and depth; the selection strategies are `variants` of one method.
"""
from __future__ import annotations

from jlearngene.experiments import study

CLAIMS = (
    study.Claim('LeTra descendants (continuous selection) tuned 0.05·S reach Scratch(S) − 0.5 pt '
                'at every shape with less total training FLOPs than Scratch', 'reaches',
                'letra/continuous', 0.05, flops_ratio=1.0),
    study.Claim('LeTra beats IMwLM weight selection without tuning (0·S)', 'beats',
                'letra/continuous', 0.0, other='imwlm'),
    study.Claim('LeTra beats IMwLM weight selection after 0.05·S', 'beats', 'letra/continuous', 0.05,
                other='imwlm'),
    study.Claim('continuous selection beats random selection after 0.05·S', 'beats',
                'letra/continuous', 0.05, other='letra/random'),
)

STUDY = study.Study(claims=CLAIMS)
