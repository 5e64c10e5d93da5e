"""jlearngene: initialise Vision Transformers of many sizes from a learngene, in JAX.

Parameters are plain pytrees (see `jlearngene.models.vit` for the canonical tree) and every
method is a pure function on them. Every subpackage and module (`jlg.genes`, `jlg.data`,
`jlg.train`, ...) and the model names below are imported on first use, so that the command
line (`jlearngene.cli`) starts, and handles its signals, before jax is imported.
"""
import importlib
import pkgutil

# Every subpackage and module of the package, found on disk (nothing is imported here).
_MODULES = tuple(sorted(m.name for m in pkgutil.iter_modules(__path__)
                        if not m.name.startswith('_')))
_FROM_MODELS = ('ViTConfig', 'apply', 'axes', 'init', 'stack_blocks', 'unstack_blocks', 'vit_config')

__version__ = '0.1.0'
__all__ = [*_MODULES, *_FROM_MODELS, '__version__']


def __getattr__(name: str):
    if name in _MODULES:
        return importlib.import_module(f'jlearngene.{name}')
    if name in _FROM_MODELS:
        return getattr(importlib.import_module('jlearngene.models'), name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__():
    return sorted(set(globals()) | set(__all__))
