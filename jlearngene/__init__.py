"""jlearngene: initialise Vision Transformers of many sizes from a learngene, in JAX.

Parameters are plain pytrees (see `jlearngene.models.vit` for the canonical tree) and every
method is a pure function on them.
"""
from jlearngene import diagnostics, models, pytree
from jlearngene.models import ViTConfig, apply, axes, init, stack_blocks, unstack_blocks, vit_config

__version__ = '0.1.0'
__all__ = ['diagnostics', 'models', 'pytree', 'ViTConfig', 'apply', 'axes', 'init', 'stack_blocks',
           'unstack_blocks', 'vit_config', '__version__']
