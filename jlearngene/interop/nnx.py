"""The ViT as a Flax NNX module: the canonical parameter tree held as `nnx.Param`s.

`ViT(cfg, rngs=nnx.Rngs(0))` draws `models.init(cfg, ...)`; `ViT(cfg, params=p)` wraps an
existing tree (a descendant from `jlearngene.genes`, a converted timm or big_vision
checkpoint). Its state is the canonical tree itself, `nnx.to_pure_dict(nnx.state(model, nnx.Param))`
has the same paths and arrays, and `model(images, ...)` is `models.apply(params, images, cfg,
...)`: the same `(logits, aux)` from the same function, so there is one model definition.

It composes inside a user's `nnx.Module` and trains with `nnx.Optimizer(model, tx,
wrt=nnx.Param)`; `canonical_params()` hands the trained tree back to the pure API (genes,
checkpoints, converters). Blocks in the list layout (shapes that differ per layer) are held as
a list; their State has integer keys, as NNX gives every list.
"""
from __future__ import annotations

from typing import Any
from collections.abc import Sequence

import jax
from flax import nnx

from jlearngene.interop.state_dict import check_params
from jlearngene.models import layout, vit
from jlearngene.models.config import ViTConfig


def _is_variable(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


class ViT(nnx.Module):
    """A Vision Transformer whose `nnx.Param` state is the canonical tree of `models.vit`.

    Give exactly one of `rngs` (a fresh init with `rngs.params()`) or `params` (a canonical
    tree, stacked or list layout; a stacked tree is checked against `cfg` and a mismatch
    is a StateDictError listing every leaf).
    """

    def __init__(self, cfg: ViTConfig, *, rngs: nnx.Rngs | None = None, params: Any = None):
        if (rngs is None) == (params is None):
            raise ValueError('ViT: give exactly one of rngs= (a fresh init) or params= '
                             '(a canonical parameter tree)')
        if params is None:
            params = vit.init(cfg, rngs.params())
        elif layout.is_stacked(params):
            check_params(params, cfg)
        self.cfg = cfg
        self.param_names = tuple(params)
        for name, sub in params.items():
            setattr(self, name, nnx.data(jax.tree.map(nnx.Param, sub)))

    def canonical_params(self) -> dict:
        """The canonical tree of the current parameter values.

        Returns:
            The parameter tree in the layout the module was built with (stacked, or blocks as a
            list), holding the `nnx.Param`s' values (traced values under a transform).
        """
        return {name: jax.tree.map(lambda v: v.get_value(), getattr(self, name), is_leaf=_is_variable)
                for name in self.param_names}

    def __call__(self, images: jax.Array, *, train: bool = False, rng: jax.Array | None = None,
                 capture: Sequence[str] = ()) -> tuple[jax.Array, dict]:
        """`models.apply` on the module's parameters: `(logits, aux)` for NHWC `images`;
        `rng` drives dropout and stochastic depth when `train=True`."""
        return vit.apply(self.canonical_params(), images, self.cfg, train=train, rng=rng,
                         capture=capture)
