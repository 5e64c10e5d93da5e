"""The official LeTra Aux-Net state dict (eddiexia98/LeTs `lets.py`) <-> a LeTra gene, both
ways, bit for bit.

`from_lets(state_dict, head_dim=64) -> gene` reads the state dict (numpy arrays or anything
`np.asarray` reads) into a gene of `jlearngene.genes.letra`; `to_lets(gene)` writes it back
as numpy arrays in torch layouts.

The names are timm's (`timm.torch_name`, q/k/v apart as LeTs keeps them), with dots as
underscores where LeTs flattens a module's tensors into the Aux-Net:

* the learngene: `__sm_` + its top-level tensors (`__sm_patch_embed_proj_weight`, the
  final norm `__sm_fc_norm_weight`, the optional head `__sm_head_weight`) and `__sm_{j}_` +
  the tensors of learngene layer j (`__sm_0_attn_q_weight`, `__sm_0_mlp_fc1_bias`; q/k/v
  biases optional, `qkv_bias=False`);
* the width matrices: E `patch_embed.trans_width_emb.trans_weight`, C
  `trans_width_cls.trans_weight`, per learngene layer j `blocks.{j}.trans_width_{q,k,v,ffn}
  .trans_weight`;
* the depth coefficients of set o, owned by Aux layer 2o: `blocks.{2o}.{timm module}
  .trans_depth_weight.trans_{weight,bias}` (`attn.q`, `attn.proj`, `mlp.fc1`, ...);
* `pos_embed`: the Aux-Net's position embedding.

Layouts are timm's (`timm.to_torch` / `timm.from_torch`). The state dict does not record
the head size: `head_dim` (official 64) splits q/k/v into heads. Unknown or missing names
are a `StateDictError`; a state dict whose shapes do not make a gene, a `GeneError`.
"""
from __future__ import annotations

import re
from typing import Any
from collections.abc import Mapping

import jax
import numpy as np

from jlearngene import pytree
from jlearngene.genes import letra
from jlearngene.interop.state_dict import StateDictError
from jlearngene.interop.timm import from_torch, to_torch, torch_name

Gene = dict[str, Any]

# LeTs' names of the per-layer width matrices Q_j, K_j, V_j, M_j; E and C are top-level.
_WIDTH = {'q': 'trans_width_q', 'k': 'trans_width_k', 'v': 'trans_width_v',
          'mlp': 'trans_width_ffn'}
_TOP_WIDTH = {'embed': 'patch_embed.trans_width_emb.trans_weight',   # E
              'head': 'trans_width_cls.trans_weight'}                 # C
_TOP_LEAVES = ('patch_embed/kernel', 'patch_embed/bias', 'norm/scale', 'norm/bias',
               'head/kernel', 'head/bias')
_OPTIONAL = ('head/kernel', 'head/bias', 'attn/q/bias', 'attn/k/bias', 'attn/v/bias')
# Depth-coefficient module -> its timm module (the modules of `letra.LEAF_MODULES`).
_DEPTH_MODULES = {module: torch_name(path).rsplit('.', 1)[0]
                  for path, (module, _) in letra.LEAF_MODULES.items()}


def _top_name(path: str) -> str:
    return '__sm_' + torch_name(path, norm='fc_norm').replace('.', '_')


def _layer_name(j: int, path: str) -> str:
    return f'__sm_{j}_' + torch_name(path).replace('.', '_')


def _depth_name(o: int, module: str, kind: str) -> str:
    return f'blocks.{2 * o}.{_DEPTH_MODULES[module]}.trans_depth_weight.trans_{kind}'


def from_lets(state_dict: Mapping[str, Any], *, head_dim: int = 64) -> Gene:
    """A LeTra gene from the official Aux-Net's state dict (see the module docstring).

    Args:
        state_dict: {LeTs name: numpy array, or anything `np.asarray` reads}.
        head_dim: the head size that q/k/v are split into (official: 64); no shape records it.

    Returns:
        The gene, in `jlearngene.genes.letra`'s layout (numpy arrays).

    Raises:
        StateDictError: a required name is missing, per-layer tensors differ in shape, the
          coefficient sets are not at Aux layers 0, 2, 4, ..., or some names are unknown.
        GeneError: the shapes do not make a LeTra gene (`letra.sizes`).
    """
    sd = {k: np.asarray(v) for k, v in state_dict.items()}
    used: set[str] = set()

    def take(name):
        if name not in sd:
            raise StateDictError(f'interop.lets: the state dict has no {name!r}')
        used.add(name)
        return sd[name]

    def stack(names):
        arrays = [take(n) for n in names]
        shapes = [a.shape for a in arrays]
        if len(set(shapes)) > 1:
            raise StateDictError(f'interop.lets: {names[0]!r} ... {names[-1]!r} have shapes '
                                 f'{shapes}; one per layer, they must agree')
        return np.stack(arrays)

    n_layers = len({int(m.group(1)) for k in sd for m in [re.match(r'__sm_(\d+)_', k)] if m})
    learngene = {path: from_torch(path, take(_top_name(path)), head_dim) for path in _TOP_LEAVES
                 if _top_name(path) in sd or path not in _OPTIONAL}
    blocks = {}
    for path in letra.LEAF_MODULES:
        if _layer_name(0, path) in sd or path not in _OPTIONAL:
            w = stack([_layer_name(j, path) for j in range(n_layers)])
            blocks[path] = np.stack([from_torch(path, x, head_dim) for x in w])
    learngene = pytree.unflatten(learngene)
    learngene['blocks'] = pytree.unflatten(blocks)
    width = {n: take(name) for n, name in _TOP_WIDTH.items() if name in sd}
    for n, name in _WIDTH.items():
        if f'blocks.0.{name}.trans_weight' in sd:
            width[n] = stack([f'blocks.{j}.{name}.trans_weight' for j in range(n_layers)])
    owners = sorted({int(m.group(1)) for k in sd
                     for m in [re.match(r'blocks\.(\d+)\.norm1\.trans_depth_weight\.', k)] if m})
    if owners != list(range(0, 2 * len(owners), 2)):
        raise StateDictError(f'interop.lets: coefficient sets at Aux layers {owners}; expected '
                             'every even layer 0, 2, ... (layers 2k and 2k+1 share one)')
    depth: dict[str, Any] = {}
    for module in letra.MODULES:
        for kind in ('weight', 'bias'):
            if _depth_name(0, module, kind) in sd:
                depth.setdefault(module, {})[kind] = stack(
                    [_depth_name(o, module, kind) for o in range(len(owners))])
    gene = {'learngene': learngene, 'width': width, 'depth': depth, 'pos_embed': take('pos_embed')}
    unknown = sorted(set(sd) - used)
    if unknown:
        raise StateDictError(f'interop.lets: {len(unknown)} unknown name(s), e.g. {unknown[:3]}')
    letra.sizes(gene)
    return gene


def to_lets(gene: Gene) -> dict[str, np.ndarray]:
    """The official Aux-Net state dict of a LeTra gene; the inverse of `from_lets`, bit for bit.

    Args:
        gene: a LeTra gene (arrays of any kind).

    Returns:
        A dict of LeTs name to numpy array, in torch layouts.

    Raises:
        StateDictError: the learngene has a class token (the official learngene has none).
        GeneError: `gene` is no LeTra gene, or its parts disagree (`letra.sizes`).
    """
    s = letra.sizes(gene)
    lg = gene['learngene']
    if 'cls_token' in lg:
        raise StateDictError('interop.lets: the official learngene has no class token')
    flat = {k: np.asarray(v) for k, v in pytree.flatten(jax.device_get(lg)).items()}
    sd = {_top_name(path): np.ascontiguousarray(to_torch(path, flat[path]))
          for path in _TOP_LEAVES if path in flat}
    for j in range(s.depth):
        for path in letra.LEAF_MODULES:
            if f'blocks/{path}' in flat:
                sd[_layer_name(j, path)] = np.ascontiguousarray(to_torch(path, flat[f'blocks/{path}'][j]))
    w = {k: np.asarray(v) for k, v in jax.device_get(gene['width']).items()}
    sd.update({name: w[n] for n, name in _TOP_WIDTH.items() if n in w})
    for n, name in _WIDTH.items():
        for j in range(s.depth if n in w else 0):
            sd[f'blocks.{j}.{name}.trans_weight'] = w[n][j]
    for module, coefs in jax.device_get(gene['depth']).items():
        for kind, c in coefs.items():
            for o in range(s.sets):
                sd[_depth_name(o, module, kind)] = np.asarray(c)[o]
    sd['pos_embed'] = np.asarray(gene['pos_embed'])
    return sd
