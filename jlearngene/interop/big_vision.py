"""big_vision and original ViT / AugReg checkpoints <-> the canonical parameter tree, both ways.

`from_big_vision(npz_or_dict, cfg=None) -> (params, cfg)` reads the parameters of a Flax ViT
from google-research/big_vision (`big_vision/models/vit.py`) or google-research/
vision_transformer (`vit_jax/models_vit.py`, the released ViT and AugReg `.npz` files): a
`.npz` path, a flat dict of '/'-joined keys (what those `.npz` files hold) or the nested params
dict. It returns parameters in the stacked canonical layout (`jlearngene.models.vit`) and the
`ViTConfig`, inferred from the shapes unless `cfg` is given. `to_big_vision(params, cfg,
layout=...)` writes the flat dict back; from a checkpoint to canonical and back gives the same
arrays bit for bit (float32; float16 inputs come back as float32 of the same values).

Layouts (`LAYOUTS`, told apart by `detect_layout`):

  * 'vit': the original ViT / AugReg `.npz`. Pre-Linen module numbering inside each block
    `Transformer/encoderblock_{i}/` (`LayerNorm_0`, `MultiHeadDotProductAttention_1`,
    `LayerNorm_2`, `MlpBlock_3/Dense_{0,1}`); the position embedding is
    `Transformer/posembed_input/pos_embedding` and, with a class token, has its row (the
    token is concatenated before the embedding is added), like the canonical `pos_embed`.
  * 'big_vision': big_vision's ViT with `scan=False`. Linen numbering (`LayerNorm_0`,
    `MultiHeadDotProductAttention_0`, `LayerNorm_1`, `MlpBlock_0`) in `encoderblock_{i}`; the
    root `pos_embedding` has rows for the patches only (added before the class token).
  * 'big_vision_scan': big_vision's ViT with `scan=True`: one `Transformer/encoderblock/`
    whose leaves carry a leading depth axis, exactly the canonical stacked layout.

Shared by all: `embedding/{kernel,bias}` (the patch conv, HWIO = the canonical kernel), `cls`
(class-token pooling: big_vision `pool_type='tok'`, vit_jax `classifier='token'`),
`Transformer/encoder_norm`, `pre_logits/{kernel,bias}` when there is a representation layer
(vit_jax `representation_size`, big_vision `rep_size`: Dense + tanh between the pooled
features and the head, as in the ImageNet-21k checkpoints) = the canonical `pre_logits` with
`ViTConfig.representation_size` R, and `head/{kernel,bias}` when there are classes (the head
kernel is (R, K) after a pre-logits layer, else (D, K)). Attention kernels carry explicit
heads on both sides: query/key/value (D, H, Dh) with biases (H, Dh), out (H, Dh, D); so the
head count is read from the shapes.

Position embedding and class token in the 'big_vision' layouts: its `pos_embedding` has no
class-token row, which reads as a zero row of the canonical `pos_embed`. A canonical tree whose
class-token row is not zero is written with that row folded into the token (`cls + pos_embed[:,
0]`, what big_vision's `fix_old_checkpoints` does for old checkpoints): the same function, bit
for bit, but `from_big_vision` then gives back the folded tree. The 'vit' layout keeps the row.

Pooling: class token ('tok'), or the mean of all tokens after `encoder_norm` (big_vision
'gap', no class token) = `pool='avg', pool_norm='before'`. Not representable, with a
ConfigError from `to_big_vision`: LayerScale, distillation tokens, no q/k/v biases, average
pooling with a class token or with the norm after pooling (timm's `fc_norm`), num_heads ×
head_dim != width and a non-default `attn_scale`. Not read, named in the error: MAP pooling
(`MAPHead_0`), register tokens and position embeddings inside `Transformer` of pre-2022
big_vision code. To load a backbone without its classifier (what vit_jax's `load_pretrained`
does for fine-tuning), drop the `pre_logits/*` and `head/*` keys.

Numerics: Flax's `nn.gelu` is the tanh approximation by default and both codes use it, so an
inferred config has `gelu='tanh'`; LayerNorm eps is Flax's 1e-6; attention scale Dh ** -0.5.
Pass `cfg` to read the weights under other numerics (timm runs these checkpoints with exact
GELU). Inputs are NHWC images scaled to [-1, 1] for the released checkpoints.

Files: `load_npz` reads a `.npz` (numpy only; bad files are a StateDictError naming the file
and the reason), `save_npz` writes one that big_vision's `utils.load_params` and vit_jax's
`checkpoint.load` read.
"""
from __future__ import annotations

import os
import re
from typing import Any
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from jlearngene import pytree
from jlearngene.interop.state_dict import (StateDictError, check_params, entry_problems,
                                           isqrt_exact, key_problems, load_state_dict,
                                           problem_message, ranked_shape, stacked_for_export,
                                           unexpected_keys, unsupported_hint)
from jlearngene.models.config import ConfigError, ViTConfig

Checkpoint = dict[str, np.ndarray]

LAYOUTS = ('vit', 'big_vision', 'big_vision_scan')

# Module names inside an encoder block: pre-Linen numbering (one counter over all modules)
# in the original ViT .npz files, Linen numbering (one counter per module type) in big_vision.
_BLOCK_MODULES = {
    'vit': dict(ln1='LayerNorm_0', mha='MultiHeadDotProductAttention_1', ln2='LayerNorm_2',
                mlp='MlpBlock_3'),
    'big_vision': dict(ln1='LayerNorm_0', mha='MultiHeadDotProductAttention_0', ln2='LayerNorm_1',
                       mlp='MlpBlock_0'),
}
_BLOCK_MODULES['big_vision_scan'] = _BLOCK_MODULES['big_vision']

# Canonical block leaf (no 'blocks/' prefix) -> path inside an encoder block.
_BLOCK_LEAVES = {
    'norm1/scale': '{ln1}/scale', 'norm1/bias': '{ln1}/bias',
    'attn/q/kernel': '{mha}/query/kernel', 'attn/q/bias': '{mha}/query/bias',
    'attn/k/kernel': '{mha}/key/kernel', 'attn/k/bias': '{mha}/key/bias',
    'attn/v/kernel': '{mha}/value/kernel', 'attn/v/bias': '{mha}/value/bias',
    'attn/out/kernel': '{mha}/out/kernel', 'attn/out/bias': '{mha}/out/bias',
    'norm2/scale': '{ln2}/scale', 'norm2/bias': '{ln2}/bias',
    'mlp/fc1/kernel': '{mlp}/Dense_0/kernel', 'mlp/fc1/bias': '{mlp}/Dense_0/bias',
    'mlp/fc2/kernel': '{mlp}/Dense_1/kernel', 'mlp/fc2/bias': '{mlp}/Dense_1/bias',
}
# Canonical top-level leaf -> checkpoint key (pos_embed and blocks are placed per layout).
_TOP_LEAVES = {
    'patch_embed/kernel': 'embedding/kernel', 'patch_embed/bias': 'embedding/bias',
    'cls_token': 'cls',
    'norm/scale': 'Transformer/encoder_norm/scale', 'norm/bias': 'Transformer/encoder_norm/bias',
    'pre_logits/kernel': 'pre_logits/kernel', 'pre_logits/bias': 'pre_logits/bias',
    'head/kernel': 'head/kernel', 'head/bias': 'head/bias',
}
_POS_KEY = {'vit': 'Transformer/posembed_input/pos_embedding', 'big_vision': 'pos_embedding',
            'big_vision_scan': 'pos_embedding'}

# Keys of ViT variants that the canonical ViT does not implement, with the reason.
_UNSUPPORTED = (
    (r'MAPHead_0/.*|probe', 'attention pooling (pool_type="map")'),
    (r'Transformer/pos_embedding', 'a position embedding inside Transformer (pre-2022 big_vision); '
                                   'move it to the root key pos_embedding'),
    (r'reg_token|reg', 'register tokens'),
)


def _block_key(layout: str, leaf: str, i: int | None) -> str:
    block = 'encoderblock' if layout == 'big_vision_scan' else f'encoderblock_{i}'
    return f'Transformer/{block}/' + _BLOCK_LEAVES[leaf].format(**_BLOCK_MODULES[layout])


def _check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f'unknown big_vision layout {layout!r}; expected one of {LAYOUTS}')


# ----------------------------------------------------------------------------------------
# The expected layout of a config.

def check_representable(cfg: ViTConfig) -> None:
    """Check that big_vision's / vit_jax's ViT can hold a config.

    Args:
        cfg: the config.

    Raises:
        ConfigError: naming every field of `cfg` that those models cannot hold (LayerScale, a
          distillation token, no q/k/v biases, average pooling with a class token or with the
          norm after pooling, num_heads × head_dim != width, a non-default `attn_scale`).
    """
    bad = [why for wrong, why in (
        (cfg.layer_scale, 'layer_scale=True (no LayerScale)'),
        (cfg.distill_token, 'distill_token=True (no distillation token)'),
        (not cfg.qkv_bias, 'qkv_bias=False (the attention projections always have biases)'),
        (cfg.pool == 'avg' and cfg.class_token,
         'pool=avg with class_token=True (average pooling has no class token)'),
        (cfg.pool == 'avg' and cfg.pool_norm == 'after',
         "pool_norm='after' (encoder_norm comes before the pooling)"),
        (cfg.attn_width != cfg.width, f'num_heads={cfg.num_heads} x head_dim={cfg.head_dim} != '
                                      f'width {cfg.width} (the attention width is the model width)'),
        (cfg.attn_scale is not None and cfg.attn_scale != cfg.head_dim ** -0.5,
         f'attn_scale={cfg.attn_scale} (the scale is head_dim ** -0.5)')) if wrong]
    if bad:
        raise ConfigError("big_vision's ViT cannot represent this config: " + '; '.join(bad))


def big_vision_shapes(cfg: ViTConfig, layout: str = 'big_vision') -> dict[str, tuple[int, ...]]:
    """The layout of the checkpoint of the ViT equal to a config.

    Args:
        cfg: the model's config.
        layout: one of `LAYOUTS`.

    Returns:
        The shape of each checkpoint key, in the order `to_big_vision` writes them.

    Raises:
        ValueError: `layout` is not one of `LAYOUTS`.
        ConfigError: big_vision's ViT cannot hold `cfg` (`check_representable`).
    """
    _check_layout(layout)
    check_representable(cfg)
    d, h, dh, m, k, p, c = (cfg.width, cfg.num_heads, cfg.head_dim, cfg.mlp_dim, cfg.num_classes,
                            cfg.patch_size, cfg.channels)
    block = {'norm1/scale': (d,), 'norm1/bias': (d,),
             **{f'attn/{n}/kernel': (d, h, dh) for n in 'qkv'},
             **{f'attn/{n}/bias': (h, dh) for n in 'qkv'},
             'attn/out/kernel': (h, dh, d), 'attn/out/bias': (d,),
             'norm2/scale': (d,), 'norm2/bias': (d,),
             'mlp/fc1/kernel': (d, m), 'mlp/fc1/bias': (m,),
             'mlp/fc2/kernel': (m, d), 'mlp/fc2/bias': (d,)}
    out = {'embedding/kernel': (p, p, c, d), 'embedding/bias': (d,)}
    if cfg.class_token:
        out['cls'] = (1, 1, d)
    n_pos = cfg.num_tokens if layout == 'vit' else cfg.num_patches
    out[_POS_KEY[layout]] = (1, n_pos, d)
    if layout == 'big_vision_scan':
        out.update({_block_key(layout, leaf, None): (cfg.depth,) + s for leaf, s in block.items()})
    else:
        for i in range(cfg.depth):
            out.update({_block_key(layout, leaf, i): s for leaf, s in block.items()})
    out['Transformer/encoder_norm/scale'] = out['Transformer/encoder_norm/bias'] = (d,)
    r = cfg.representation_size
    if r is not None:
        out['pre_logits/kernel'] = (d, r)
        out['pre_logits/bias'] = (r,)
    if k:
        out['head/kernel'] = (r or d, k)
        out['head/bias'] = (k,)
    return out


# ----------------------------------------------------------------------------------------
# Reading.

def flat_checkpoint(tree: Mapping[str, Any]) -> Checkpoint:
    """A checkpoint as one flat dict of numpy arrays.

    Args:
        tree: a flat dict of '/'-joined keys, or a nested params dict (a FrozenDict too).

    Returns:
        A dict of '/'-joined key to numpy array.
    """
    if any(isinstance(v, Mapping) for v in tree.values()):
        tree = traverse_util.flatten_dict(dict(tree), sep='/')
    return {str(k): np.asarray(v) for k, v in tree.items()}


def detect_layout(tree: Mapping[str, Any]) -> str:
    """Which of `LAYOUTS` a checkpoint uses.

    Args:
        tree: the checkpoint, flat or nested.

    Returns:
        'big_vision_scan' when it has a stacked `Transformer/encoderblock`, 'vit' when its
        blocks use the pre-Linen names or its position embedding is
        `Transformer/posembed_input/pos_embedding`, else 'big_vision'.
    """
    keys = list(flat_checkpoint(tree))
    if any(k.startswith('Transformer/encoderblock/') for k in keys):
        return 'big_vision_scan'
    if _POS_KEY['vit'] in keys or any(
            re.match(r'Transformer/encoderblock_\d+/(MultiHeadDotProductAttention_1|MlpBlock_3)/', k)
            for k in keys):
        return 'vit'
    return 'big_vision'


def infer_config(tree: Mapping[str, Any], layout: str | None = None) -> ViTConfig:
    """The `ViTConfig` of a big_vision / vit_jax checkpoint, from its keys and shapes.

    GELU is 'tanh' and LayerNorm eps 1e-6, Flax's defaults.

    Args:
        tree: the checkpoint, flat or nested.
        layout: one of `LAYOUTS`; `None` (default): `detect_layout`.

    Returns:
        The config.

    Raises:
        StateDictError: the checkpoint has no big_vision key at all, or the config cannot be
          inferred (the message lists every problem).
        ValueError: `layout` is not one of `LAYOUTS`.
    """
    ckpt = flat_checkpoint(tree)
    _check_not_foreign(ckpt)
    cfg, problems = _infer(ckpt, layout or detect_layout(ckpt))
    if problems:
        raise StateDictError(problem_message('cannot infer a ViT config from the big_vision '
                                              'checkpoint', problems))
    return cfg


def _check_not_foreign(ckpt: Checkpoint) -> None:
    """One-line StateDictError for a checkpoint without a single big_vision key (another
    format's, e.g. a timm state dict's '.'-joined keys): a list of every missing key would
    not say so."""
    known = set(_TOP_LEAVES.values()) | set(_POS_KEY.values())
    if any('/' in k or k in known for k in ckpt):
        return
    keys = sorted(ckpt)
    shown = ', '.join(repr(k) for k in keys[:3])
    shown += f', ... ({len(keys)} in all)' if len(keys) > 3 else ''
    timm = any(k.startswith(('patch_embed.', 'blocks.')) or k in ('pos_embed', 'cls_token')
               for k in keys)
    raise StateDictError(
        "not a big_vision / ViT checkpoint: it has none of big_vision's keys (embedding/kernel, "
        f"Transformer/..., head/kernel) but {shown or 'no keys at all'}"
        + ('; these are a timm state dict\'s keys (read it with jlearngene.interop.timm)'
           if timm else ''))


def _infer(ckpt: Checkpoint, layout: str) -> tuple[ViTConfig | None, list[str]]:
    _check_layout(layout)
    shape = {k: tuple(v.shape) for k, v in ckpt.items()}
    problems: list[str] = []
    f: dict[str, Any] = dict(gelu='tanh', ln_eps=1e-6, qkv_bias=True)

    emb = shape.get('embedding/kernel')
    if emb is None:
        problems.append('missing embedding/kernel (gives width, channels and patch size)')
    elif len(emb) != 4 or emb[0] != emb[1]:
        problems.append(f'embedding/kernel has shape {emb}; expected (p, p, C, D) with square patches')
    else:
        f.update(patch_size=emb[0], channels=emb[2], width=emb[3])

    if layout == 'big_vision_scan':
        lead = shape.get(_block_key(layout, 'norm1/scale', None))
        if lead:
            f['depth'] = lead[0]
        else:
            problems.append(f"missing {_block_key(layout, 'norm1/scale', None)} (gives the depth)")
        first = None
    else:
        idx = {int(mt.group(1)) for key in ckpt if (mt := re.match(r'Transformer/encoderblock_(\d+)/', key))}
        if idx:
            f['depth'] = max(idx) + 1
        else:
            problems.append('no encoder blocks (Transformer/encoderblock_<i>/...) found')
        first = 0
    n_lead = int(layout == 'big_vision_scan')
    q = ranked_shape(shape, _block_key(layout, 'attn/q/kernel', first), 3 + n_lead,
                     'the heads as (D, H, Dh)', problems)
    if q:
        f.update(num_heads=q[n_lead + 1], head_dim=q[n_lead + 2])
    fc1 = ranked_shape(shape, _block_key(layout, 'mlp/fc1/kernel', first), 2 + n_lead,
                       'mlp_dim as (D, M)', problems)
    if fc1:
        f['mlp_dim'] = fc1[-1]

    f['class_token'] = 'cls' in ckpt
    f['pool'] = 'cls' if f['class_token'] else 'avg'
    rep = shape.get('pre_logits/kernel')
    if rep is not None:
        if len(rep) != 2:
            problems.append(f'pre_logits/kernel has shape {rep}; expected (D, R) for a '
                            'pre-logits layer of size R')
        else:
            f['representation_size'] = rep[1]
    head = shape.get('head/kernel')
    f['num_classes'] = head[1] if head is not None and len(head) == 2 else 0

    pos = ranked_shape(shape, _POS_KEY[layout], 3, 'the image size as (1, tokens, D)', problems)
    if pos and 'patch_size' in f:
        n_prefix = int(f['class_token']) if layout == 'vit' else 0
        grid = isqrt_exact(pos[1] - n_prefix)
        if not grid:
            problems.append(f'{_POS_KEY[layout]} has {pos[1]} rows: {pos[1]} - {n_prefix} class-token '
                            f'rows is not a square patch grid (layout {layout}: '
                            f'{"with" if n_prefix else "without"} a class-token row)')
        else:
            f['image_size'] = grid * f['patch_size']
    if problems:
        return None, problems
    try:
        return ViTConfig(**f), []
    except ConfigError as e:
        return None, [f'inferred config is invalid: {e}']


def check_checkpoint(tree: Mapping[str, Any], cfg: ViTConfig, layout: str | None = None) -> None:
    """Check a big_vision / vit_jax checkpoint against the layout of a config.

    Args:
        tree: the checkpoint, flat or nested.
        cfg: the model's config.
        layout: one of `LAYOUTS`; `None` (default): `detect_layout`.

    Raises:
        StateDictError: listing every key that is missing, unexpected (with the reason when a
          known ViT variant has it) or of the wrong shape or a non-float dtype, and a pre-logits
          layer that only one of checkpoint and config has.
        ValueError: `layout` is not one of `LAYOUTS`.
        ConfigError: big_vision's ViT cannot hold `cfg` (`check_representable`).
    """
    ckpt = flat_checkpoint(tree)
    layout = layout or detect_layout(ckpt)
    want = big_vision_shapes(cfg, layout)
    problems = key_problems(ckpt, want, _UNSUPPORTED)
    rep = ckpt.get('pre_logits/kernel')
    if (rep is not None) != (cfg.representation_size is not None):
        problems.append(
            f'the checkpoint has a pre-logits layer (pre_logits/kernel of shape {rep.shape}) but '
            'the config has representation_size=None' if rep is not None else
            f'the config has representation_size={cfg.representation_size} but the checkpoint '
            'has no pre-logits layer (pre_logits/kernel)')
    problems += entry_problems(ckpt, want, lambda a: np.issubdtype(a.dtype, np.floating))
    if problems:
        desc = (f'layout={layout} width={cfg.width} depth={cfg.depth} heads={cfg.num_heads} '
                f'mlp_dim={cfg.mlp_dim} patch={cfg.patch_size} image={cfg.image_size} '
                f'classes={cfg.num_classes} representation_size={cfg.representation_size} '
                f'pool={cfg.pool} class_token={cfg.class_token}')
        raise StateDictError(problem_message(f'big_vision checkpoint does not match the ViT layout '
                                              f'({desc})', problems))


def from_big_vision(npz_or_dict: str | os.PathLike | Mapping[str, Any],
                    cfg: ViTConfig | None = None) -> tuple[dict, ViTConfig]:
    """big_vision / vit_jax checkpoint -> canonical parameters and config.

    The layout is detected (`detect_layout`). Without `cfg` the config is inferred from the
    shapes (`infer_config`); with it, the checkpoint must have exactly its shapes.

    Args:
        npz_or_dict: a `.npz` path (`load_npz`), or a flat or nested params dict.
        cfg: the model's config; `None` (default): inferred.

    Returns:
        `(params, cfg)`, with params in the stacked canonical layout as float32 jax arrays.

    Raises:
        StateDictError: the file cannot be read, the checkpoint has no big_vision key, or
          keys are missing, unexpected or mis-shaped (all reported together).
        FileNotFoundError: there is no file at the path.
        ConfigError: big_vision's ViT cannot hold the given `cfg` (`check_representable`).
    """
    ckpt = (load_npz(npz_or_dict) if isinstance(npz_or_dict, (str, os.PathLike))
            else flat_checkpoint(npz_or_dict))
    _check_not_foreign(ckpt)
    layout = detect_layout(ckpt)
    if cfg is None:
        cfg, problems = _infer(ckpt, layout)
        if problems:
            # Also list keys that no layout has, so one message shows everything.
            known = set(_TOP_LEAVES.values()) | set(_POS_KEY.values())
            strange = sorted(k for k in ckpt if unsupported_hint(k, _UNSUPPORTED) or not (
                k in known or k.startswith('Transformer/encoderblock')))
            problems += unexpected_keys(strange, _UNSUPPORTED)
            raise StateDictError(problem_message(f'cannot convert the big_vision checkpoint '
                                                  f'(layout {layout})', problems))
    check_checkpoint(ckpt, cfg, layout)
    return jax.tree.map(jnp.asarray, _canonical(ckpt, cfg, layout)), cfg


def _canonical(ckpt: Checkpoint, cfg: ViTConfig, layout: str) -> dict:
    """Pure numpy conversion of a checked checkpoint (float32 output)."""
    f32 = lambda x: np.asarray(x, np.float32)  # noqa: E731
    flat = {path: f32(ckpt[key]) for path, key in _TOP_LEAVES.items() if key in ckpt}
    pos = f32(ckpt[_POS_KEY[layout]])
    if cfg.class_token and layout != 'vit':
        pos = np.concatenate([np.zeros((1, 1, cfg.width), np.float32), pos], axis=1)
    flat['pos_embed'] = pos
    for leaf in _BLOCK_LEAVES:
        if layout == 'big_vision_scan':
            flat['blocks/' + leaf] = f32(ckpt[_block_key(layout, leaf, None)])
        else:
            flat['blocks/' + leaf] = np.stack([f32(ckpt[_block_key(layout, leaf, i)])
                                               for i in range(cfg.depth)])
    return jax.tree.map(np.ascontiguousarray, traverse_util.unflatten_dict(flat, sep='/'))


# ----------------------------------------------------------------------------------------
# Writing.

def to_big_vision(params: Any, cfg: ViTConfig, *, layout: str = 'big_vision',
                  dtype: Any = np.float32) -> Checkpoint:
    """Canonical parameters -> flat checkpoint of big_vision's / vit_jax's ViT.

    `save_npz` writes it; `traverse_util.unflatten_dict(ckpt, sep='/')` gives the nested params
    of big_vision's `Model` ('big_vision' layouts: `pool_type='tok'` or 'gap', `scan=` as the
    layout says) or of vit_jax's `VisionTransformer` ('vit': `classifier='token'` or 'gap',
    after `flax.training.checkpoints.convert_pre_linen`, as its `checkpoint.load` does). In
    the 'big_vision' layouts a non-zero class-token row of `pos_embed` is folded into `cls`.

    Args:
        params: canonical parameters, stacked or list layout.
        cfg: their config.
        layout: one of `LAYOUTS` (see the module docstring).
        dtype: the arrays' dtype (default float32).

    Returns:
        A dict of '/'-joined key to numpy array, in `big_vision_shapes`' order; writable copies.

    Raises:
        ValueError: `layout` is not one of `LAYOUTS`.
        ConfigError: those models cannot hold `cfg` (`check_representable`).
        StateDictError: blocks of different shapes (list layout, e.g. per-layer head counts),
          or parameters that do not fit `cfg` (every one listed).
    """
    _check_layout(layout)
    check_representable(cfg)
    params = stacked_for_export(params, "big_vision's ViT")
    check_params(params, cfg)
    flat = {k: np.asarray(jax.device_get(v)) for k, v in pytree.flatten(params).items()}
    out = {key: flat[path] for path, key in _TOP_LEAVES.items() if path in flat}
    pos = flat['pos_embed']
    if cfg.class_token and layout != 'vit':
        row, pos = pos[:, :1], pos[:, 1:]
        if np.any(row != 0):   # a zero row is skipped: cls + 0 would turn -0.0 into +0.0
            out['cls'] = out['cls'] + row
    out[_POS_KEY[layout]] = pos
    for leaf in _BLOCK_LEAVES:
        x = flat['blocks/' + leaf]
        if layout == 'big_vision_scan':
            out[_block_key(layout, leaf, None)] = x
        else:
            out.update({_block_key(layout, leaf, i): x[i] for i in range(cfg.depth)})
    order = big_vision_shapes(cfg, layout)
    return {k: np.array(out[k], dtype=dtype, order='C') for k in order}   # writable copies


# ----------------------------------------------------------------------------------------
# Files.

def load_npz(path: str | os.PathLike) -> Checkpoint:
    """Read a big_vision / vit_jax `.npz` checkpoint into a flat dict (numpy only).

    Args:
        path: the `.npz` file.

    Returns:
        A dict of '/'-joined key to numpy array; bfloat16 arrays become float32 (`load_state_dict`).

    Raises:
        StateDictError: `path` does not end in `.npz`, or the file is not a readable `.npz`
          (the message names it and the reason).
        FileNotFoundError: there is no file at `path`.
    """
    path = os.fspath(path)
    if not path.lower().endswith('.npz'):
        raise StateDictError(f'{path!r}: big_vision checkpoints are read from .npz files')
    return load_state_dict(path)


def save_npz(checkpoint: Mapping[str, Any], path: str | os.PathLike) -> str:
    """Write a checkpoint to an uncompressed `.npz` with '/'-joined keys.

    That is the format of the released ViT / AugReg files. The file is renamed into place once
    complete; missing parent folders are made.

    Args:
        checkpoint: a flat or nested checkpoint (`to_big_vision`).
        path: the output file; its name must end in `.npz`.

    Returns:
        `path`, as a str.

    Raises:
        ValueError: `path` does not end in `.npz`.
        OSError: the file cannot be written (named by `train.files.write_file`).
    """
    path = os.fspath(path)
    if not path.endswith('.npz'):
        raise ValueError(f'{path!r}: the output file name must end in .npz')
    from jlearngene.train import files
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    flat = flat_checkpoint(checkpoint)
    return files.write_file(path, lambda tmp: np.savez(tmp, **flat))
