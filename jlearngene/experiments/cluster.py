"""The Cluster-Learngene study's own part (config: `jlearngene/experiments/configs/cluster.py`;
the harness: `jlearngene.experiments.study`): the claims of Cluster-Learngene (Wang et al.,
NeurIPS 2024) that the digits can test, as the fair-studies spec states them."""
from __future__ import annotations

from jlearngene.experiments import study

OMEGA_1 = ((32, 6, 8),)      # the ancestor's head count: the shape the baselines make

CLAIMS = (
    study.Claim('Cluster-Learngene descendants tuned 0.5·S reach Scratch(S) − 0.5 pt at every ω',
                'reaches', 'cluster/clustered', 0.5),
    study.Claim('Cluster-Learngene (ω = 1) within 1 pt of Pre-Fin, with fewer inherited parameters',
                'close', 'cluster/clustered', 0.5, other='pre_fin', tolerance=0.01, shapes=OMEGA_1),
    study.Claim('Cluster-Learngene (ω = 1) beats He-LG', 'beats', 'cluster/clustered', 0.5,
                other='he_lg', shapes=OMEGA_1),
    study.Claim('Cluster-Learngene (ω = 1) beats Auto-LG', 'beats', 'cluster/clustered', 0.5,
                other='auto_lg', shapes=OMEGA_1),
    study.Claim('Centroid heads beat as many randomly chosen heads at every ω', 'beats',
                'cluster/clustered', 0.5, other='cluster/random'),
)

STUDY = study.Study(claims=CLAIMS)
