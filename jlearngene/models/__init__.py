"""ViT model: config, init/apply, layouts and logical axes."""
from jlearngene.models.config import VARIANTS, ConfigError, ViTConfig, model_config, validate, vit_config
from jlearngene.models.layout import (Axes, axes, axis_size, depth_of, is_stacked, leaf_axes,
                                      stack_blocks, unstack_blocks)
from jlearngene.models.vit import CAPTURES, apply, init, init_block, init_embeddings, init_head

__all__ = [
    'VARIANTS', 'ConfigError', 'ViTConfig', 'model_config', 'validate', 'vit_config', 'Axes', 'axes',
    'axis_size', 'depth_of', 'is_stacked', 'leaf_axes', 'stack_blocks', 'unstack_blocks',
    'CAPTURES', 'apply', 'init', 'init_block', 'init_embeddings', 'init_head',
]
