"""The comparison of every method (config: `jlearngene/experiments/configs/compare.py`;
`jlearngene compare`): a study of the one harness (`jlearngene.experiments.study`) with no
paper claims of its own. Its result is the table of FLOPs to Scratch's converged accuracy and
the break-even number of descendants per method and shape (`results.break_even`), from which
experiments/compare/README.md builds its recommendations.
"""
from jlearngene.experiments import study

STUDY = study.Study()
