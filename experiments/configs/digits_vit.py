"""The bundled `digits_vit` config under its source-tree path (the README's commands use it):
`jlearngene train --config experiments/configs/digits_vit.py` = `--config digits_vit`.
The config itself is jlearngene/experiments/configs/digits_vit.py."""
from jlearngene.experiments.configs.digits_vit import get_config  # noqa: F401
