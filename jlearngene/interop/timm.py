"""timm / DeiT state dicts <-> the canonical parameter tree, both ways, losslessly.

`from_timm(state_dict, **overrides) -> (cfg, params)` reads the state dict of a timm
`VisionTransformer` or a DeiT `VisionTransformerDistilled` (numpy arrays or torch tensors
under timm's key names) and returns a `ViTConfig` inferred from the shapes plus parameters
in the stacked canonical layout (`jlearngene.models.vit`). `to_timm(params, cfg)` is the
exact inverse: timm → canonical → timm gives back the same arrays bit for bit (for float16,
bfloat16 and float32 inputs; parameters are stored as float32).

Layouts handled:
  * class-token pooling (`global_pool='token'`, final `norm`), or average pooling
    (`global_pool='avg'`, with or without a class token): timm then has `fc_norm` after the
    pooling and `norm` is an Identity, which maps to our `norm` with `pool_norm='after'`;
    an avg-pool model built with `fc_norm=False` keeps `norm` before pooling
    (`pool_norm='before'`), and needs the override `pool='avg'` when it has a class token;
    timm's 'max', 'avgmax' and 'map' pools are not implemented (an `fc_norm` is read as 'avg');
  * qkv bias or none (`qkv_bias=False`); LayerScale (`init_values`, keys `ls1.gamma`/`ls2.gamma`
    -> `blocks/ls1/scale`, `blocks/ls2/scale`);
  * DeiT distillation token (`dist_token`, `head_dist`); no head (`num_classes=0`);
  * not representable (ConfigError from `to_timm` / `timm_kwargs`): a pre-logits layer
    (`representation_size`; timm 1.x has no representation layer, older timm's
    `pre_logits.fc.*` keys are named in the error when read), a non-default `attn_scale`,
    num_heads × head_dim != width, and blocks of different shapes (a StateDictError);
  * `no_embed_class=True` (DeiT-3): timm adds `pos_embed` to the patches only, which equals
    our prefix-slot `pos_embed` with zero rows for the prefix tokens. `from_timm` inserts
    those zero rows; `to_timm(..., no_embed_class=True)` removes them again
    (`has_embed_class` tells which form a state dict uses).

Shape rules: fused `attn.qkv.weight` (3D, D) has rows [q; k; v] and head h owns rows
h·Dh…(h+1)·Dh of each; it becomes q/k/v kernels (D, H, Dh) and biases (H, Dh).
`attn.proj.weight` (D, D) -> out kernel (H, Dh, D). Linear weights (out, in) are transposed
to (in, out). The conv patch embedding OIHW (D, C, p, p) becomes HWIO (p, p, C, D).

Config inference: width, channels and patch size from `patch_embed.proj.weight`; depth from
the block indices; MLP size from `fc1`; classes from `head` (0 without one); image size from
the number of `pos_embed` rows (square grid). **The head count is not visible in any shape**:
pass `num_heads=` (any ViTConfig field can be overridden), otherwise it is `width // 64`
(head dim 64, true for DeiT/ViT Ti, S, B and L). A wrong head count loads without error
but computes a different function.

Numerical conventions (what makes jlearngene's logits equal timm's):
  * GELU: timm's `nn.GELU` is the exact erf form -> `gelu='exact'` (the default; 'tanh'
    is the approximation, which `jax.nn.gelu` uses unless told otherwise).
  * LayerNorm eps: timm ViTs use 1e-6 (`partial(nn.LayerNorm, eps=1e-6)`), our default
    `ln_eps`; override `ln_eps` for models built with another norm layer.
  * Attention scale head_dim ** -0.5 on both sides.
  * Input: jlearngene takes NHWC images, timm NCHW (`images.transpose(0, 2, 3, 1)`). No
    normalisation happens inside either model: feed the same normalised pixels, e.g.
    ImageNet mean/std for DeiT weights (timm `IMAGENET_DEFAULT_MEAN/STD`) or [-1, 1] for
    the original ViT/AugReg weights (mean = std = 0.5).
  * Eval mode: DeiT distilled logits are the mean of the class and distillation heads.

Files and the checks that every converter shares (`load_state_dict`, `save_safetensors`,
`check_params`, ...) are `interop.state_dict`'s; `save_model_safetensors` writes a
converted model with its jlearngene config and timm constructor in the header.
"""
from __future__ import annotations

import json
import os
import re
from typing import Any
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from jlearngene import pytree
from jlearngene.interop.state_dict import (StateDict, StateDictError, check_params, entry_problems,
                                           isqrt_exact, key_problems, problem_message, ranked_shape,
                                           save_safetensors, stacked_for_export, to_numpy,
                                           unexpected_keys, unsupported_hint)
from jlearngene.models import vit
from jlearngene.models.config import ConfigError, ViTConfig


# Keys of timm ViT variants that jlearngene's ViT does not implement, with the reason.
_UNSUPPORTED = (
    (r'reg_token', 'register tokens'),
    (r'norm_pre\..*', 'a pre-encoder LayerNorm (pre_norm=True, CLIP style)'),
    (r'blocks\.\d+\.attn\.(q_norm|k_norm)\..*', 'qk-norm'),
    (r'blocks\.\d+\.attn\.norm\..*', 'a norm inside attention (scale_attn_norm)'),
    (r'blocks\.\d+\.mlp\.norm\..*', 'a norm inside the MLP (scale_mlp_norm)'),
    (r'blocks\.\d+\.attn\.(q_bias|v_bias|relative_position.*)', 'BEiT-style attention biases'),
    (r'attn_pool\..*', 'attention pooling (global_pool="map")'),
    (r'blocks\.\d+\.mlp\.fc1_[gx]\..*|blocks\.\d+\.mlp\.w\d.*', 'a gated MLP (SwiGLU)'),
    (r'pre_logits\.fc\..*', 'a representation layer (representation_size of timm before 1.0, '
                            'which timm 1.x dropped); drop pre_logits.* and head.* to load the backbone'),
)


# ----------------------------------------------------------------------------------------
# The expected timm layout of a config.

def timm_shapes(cfg: ViTConfig, *, no_embed_class: bool = False) -> dict[str, tuple[int, ...]]:
    """The layout of the state dict of the timm model equal to a config.

    Args:
        cfg: the model's config.
        no_embed_class: `pos_embed` without the prefix-token rows (DeiT-3).

    Returns:
        The shape of each timm key, in timm's order.
    """
    d, m, k, p, c = cfg.width, cfg.mlp_dim, cfg.num_classes, cfg.patch_size, cfg.channels
    n_pos = cfg.num_patches if no_embed_class else cfg.num_tokens
    out: dict[str, tuple[int, ...]] = {}
    if cfg.class_token:
        out['cls_token'] = (1, 1, d)
    out['pos_embed'] = (1, n_pos, d)
    if cfg.distill_token:
        out['dist_token'] = (1, 1, d)
    out['patch_embed.proj.weight'] = (d, c, p, p)
    out['patch_embed.proj.bias'] = (d,)
    for i in range(cfg.depth):
        b = f'blocks.{i}.'
        out[b + 'norm1.weight'] = out[b + 'norm1.bias'] = (d,)
        out[b + 'attn.qkv.weight'] = (3 * d, d)
        if cfg.qkv_bias:
            out[b + 'attn.qkv.bias'] = (3 * d,)
        out[b + 'attn.proj.weight'] = (d, d)
        out[b + 'attn.proj.bias'] = (d,)
        if cfg.layer_scale:
            out[b + 'ls1.gamma'] = (d,)
        out[b + 'norm2.weight'] = out[b + 'norm2.bias'] = (d,)
        out[b + 'mlp.fc1.weight'] = (m, d)
        out[b + 'mlp.fc1.bias'] = (m,)
        out[b + 'mlp.fc2.weight'] = (d, m)
        out[b + 'mlp.fc2.bias'] = (d,)
        if cfg.layer_scale:
            out[b + 'ls2.gamma'] = (d,)
    norm = _final_norm_key(cfg)
    out[norm + '.weight'] = out[norm + '.bias'] = (d,)
    if k:
        out['head.weight'] = (k, d)
        out['head.bias'] = (k,)
        if cfg.distill_token:
            out['head_dist.weight'] = (k, d)
            out['head_dist.bias'] = (k,)
    return out


def _final_norm_key(cfg: ViTConfig) -> str:
    return 'fc_norm' if cfg.pool == 'avg' and cfg.pool_norm == 'after' else 'norm'


def timm_kwargs(cfg: ViTConfig, *, no_embed_class: bool = False) -> dict[str, Any]:
    """Constructor arguments of the timm model whose `state_dict` `to_timm` produces.

    They build `timm.models.vision_transformer.VisionTransformer(**kw)`, or
    `timm.models.deit.VisionTransformerDistilled(**kw)` when `cfg.distill_token`.
    LN eps and GELU are timm's defaults (1e-6, exact); other values need `norm_layer` /
    `act_layer` arguments that are not plain data.

    Args:
        cfg: the model's config.
        no_embed_class: the state dict's `pos_embed` has no prefix-token rows (DeiT-3).

    Returns:
        The keyword arguments, plain data.

    Raises:
        ConfigError: timm's ViT cannot hold `cfg` (a pre-logits layer, a non-default
          `attn_scale`, num_heads × head_dim != width, a distillation token without class-token
          pooling), or timm's `int(width * mlp_ratio)` does not give `mlp_dim` back.
    """
    _check_timm_representable(cfg)
    if int(cfg.width * (cfg.mlp_dim / cfg.width)) != cfg.mlp_dim:
        raise ConfigError(f'mlp_dim={cfg.mlp_dim} is not reproduced by timm mlp_ratio='
                          f'{cfg.mlp_dim / cfg.width!r} with width {cfg.width}')
    kw = dict(img_size=cfg.image_size, patch_size=cfg.patch_size, in_chans=cfg.channels,
              embed_dim=cfg.width, depth=cfg.depth, num_heads=cfg.num_heads,
              mlp_ratio=cfg.mlp_dim / cfg.width, qkv_bias=cfg.qkv_bias,
              num_classes=cfg.num_classes, no_embed_class=no_embed_class,
              init_values=1.0 if cfg.layer_scale else None)
    if not cfg.distill_token:
        kw.update(class_token=cfg.class_token, global_pool='token' if cfg.pool == 'cls' else 'avg',
                  fc_norm=cfg.pool == 'avg' and cfg.pool_norm == 'after')
    return kw


def _check_timm_representable(cfg: ViTConfig) -> None:
    """ConfigError (one line) for the configs that timm's ViT cannot hold."""
    if cfg.representation_size is not None:
        raise ConfigError(f"timm's VisionTransformer (timm 1.x) has no representation layer; this "
                          f'config has representation_size={cfg.representation_size} (a pre_logits '
                          'layer): export it with to_big_vision, or drop pre_logits and the head')
    if cfg.attn_scale is not None and cfg.attn_scale != cfg.head_dim ** -0.5:
        raise ConfigError(f"timm's attention scale is head_dim ** -0.5 = {cfg.head_dim ** -0.5!r}; "
                          f'this config has attn_scale={cfg.attn_scale!r}')
    if cfg.attn_width != cfg.width:
        raise ConfigError(f"timm's attention has head_dim = width // num_heads; this config has "
                          f'num_heads={cfg.num_heads} x head_dim={cfg.head_dim} = {cfg.attn_width} '
                          f'!= width {cfg.width}')
    if cfg.distill_token and (cfg.pool != 'cls' or not cfg.class_token):
        raise ConfigError(f"timm's VisionTransformerDistilled pools the class token; this config has "
                          f'pool={cfg.pool!r}, class_token={cfg.class_token}')


# ----------------------------------------------------------------------------------------
# Torch names and layouts of canonical leaves: timm's, and those of the official checkpoints
# of methods built on timm (`interop.lets`).


# Canonical module -> timm module. timm fuses q, k and v into `attn.qkv` (`from_timm` /
# `to_timm` split and join them); codes that keep them apart (LeTs) name them as here.
MODULES = {'patch_embed': 'patch_embed.proj', 'norm': 'norm', 'head': 'head',
           'head_dist': 'head_dist', 'norm1': 'norm1', 'attn/q': 'attn.q', 'attn/k': 'attn.k',
           'attn/v': 'attn.v', 'attn/out': 'attn.proj', 'ls1': 'ls1', 'norm2': 'norm2',
           'mlp/fc1': 'mlp.fc1', 'mlp/fc2': 'mlp.fc2', 'ls2': 'ls2'}


_TENSORS = {'kernel': 'weight', 'scale': 'weight', 'bias': 'bias'}


def torch_name(path: str, *, norm: str = 'norm') -> str:
    """timm's name of a canonical leaf.

    Args:
        path: a block leaf without its layer index ('attn/out/kernel' -> 'attn.proj.weight',
          'ls1/scale' -> 'ls1.gamma') or a top-level one ('patch_embed/kernel' ->
          'patch_embed.proj.weight').
        norm: the final norm's module: 'norm', or 'fc_norm' after average pooling with
          `pool_norm='after'`.

    Returns:
        The '.'-joined torch name.

    Raises:
        StateDictError: `path` is not a canonical ViT leaf that timm names (`MODULES`).
    """
    module, tensor = path.rsplit('/', 1)
    if module not in MODULES or tensor not in _TENSORS:
        raise StateDictError(f'{path!r} is not a canonical ViT leaf that timm names')
    name = norm if module == 'norm' else MODULES[module]
    return f"{name}.{'gamma' if module in ('ls1', 'ls2') else _TENSORS[tensor]}"


def to_torch(path: str, x: np.ndarray) -> np.ndarray:
    """A canonical leaf in torch's layout.

    Linear kernels (in, out) become (out, in), with the heads of q/k/v (D, H, Dh) and out
    (H, Dh, D) flattened; the patch kernel HWIO becomes OIHW; q/k/v biases (H, Dh) flat.

    Args:
        path: the leaf's canonical path (as for `torch_name`).
        x: the leaf, without a layers axis.

    Returns:
        The tensor as timm holds it (a view where numpy gives one).
    """
    if path == 'patch_embed/kernel':
        return x.transpose(3, 2, 0, 1)
    if path.endswith(('q/kernel', 'k/kernel', 'v/kernel')):
        return x.reshape(x.shape[0], -1).T
    if path.endswith(('q/bias', 'k/bias', 'v/bias')):
        return x.reshape(-1)
    if path.endswith('out/kernel'):
        return x.reshape(-1, x.shape[-1]).T
    return x.T if path.endswith('kernel') else x


def from_torch(path: str, w: np.ndarray, head_dim: int) -> np.ndarray:
    """The inverse of `to_torch`: a torch tensor as a canonical leaf.

    Args:
        path: the leaf's canonical path (as for `torch_name`).
        w: the tensor in torch's layout, as a numpy array.
        head_dim: the head size that q/k/v and out are split into.

    Returns:
        The leaf in the canonical layout, without a layers axis.
    """
    if path == 'patch_embed/kernel':
        return w.transpose(2, 3, 1, 0)
    if path.endswith(('q/kernel', 'k/kernel', 'v/kernel')):
        return w.T.reshape(w.shape[1], -1, head_dim)
    if path.endswith(('q/bias', 'k/bias', 'v/bias')):
        return w.reshape(-1, head_dim)
    if path.endswith('out/kernel'):
        return w.T.reshape(-1, head_dim, w.shape[0])
    return w.T if path.endswith('kernel') else w


# ----------------------------------------------------------------------------------------
# timm -> canonical.

def has_embed_class(state_dict: Mapping[str, Any], cfg: ViTConfig) -> bool:
    """Whether `pos_embed` has rows for the prefix tokens (timm default) or only for the patches.

    Args:
        state_dict: a timm state dict with a `pos_embed` of shape (1, rows, D).
        cfg: the model's config.

    Returns:
        False where `cfg` has prefix tokens and `pos_embed` has one row per patch only
        (`no_embed_class=True`, DeiT-3); else True.
    """
    n_pos = int(np.shape(state_dict['pos_embed'])[1])
    return not (cfg.num_prefix_tokens and n_pos == cfg.num_patches)


def infer_config(state_dict: Mapping[str, Any], **overrides: Any) -> ViTConfig:
    """The `ViTConfig` of a timm ViT/DeiT state dict, from its keys and shapes.

    Args:
        state_dict: {timm key: array or tensor}.
        **overrides: `ViTConfig` fields that win over what the shapes give (e.g. `num_heads`,
          which no shape shows and defaults to `width // 64`).

    Returns:
        The config.

    Raises:
        StateDictError: the config cannot be inferred; the message lists every problem.
        ConfigError: an override is not a `ViTConfig` field.
    """
    cfg, problems = _infer(state_dict, overrides)
    if problems:
        raise StateDictError(problem_message('cannot infer a ViT config from the timm state dict',
                                              problems))
    return cfg


def _infer(sd: Mapping[str, Any], overrides: Mapping[str, Any]) -> tuple[ViTConfig | None, list[str]]:
    known = set(ViTConfig.__dataclass_fields__)
    bad = sorted(set(overrides) - known)
    if bad:
        raise ConfigError(f'from_timm got unknown override(s) {bad}; overrides are ViTConfig fields: '
                          f'{sorted(known)}')
    shape = {k: tuple(np.shape(v)) for k, v in sd.items()}
    problems: list[str] = []
    f: dict[str, Any] = {}

    pe = shape.get('patch_embed.proj.weight')
    if pe is None:
        problems.append('missing patch_embed.proj.weight (gives width, channels and patch size)')
    elif len(pe) != 4 or pe[2] != pe[3]:
        problems.append(f'patch_embed.proj.weight has shape {pe}; expected (D, C, p, p) with square patches')
    else:
        f.update(width=pe[0], channels=pe[1], patch_size=pe[2])

    idx = {int(m.group(1)) for k in sd if (m := re.match(r'blocks\.(\d+)\.', k))}
    if not idx:
        problems.append('no encoder blocks (blocks.<i>.*) found')
    else:
        f['depth'] = max(idx) + 1
        fc1 = ranked_shape(shape, 'blocks.0.mlp.fc1.weight', 2, 'mlp_dim as (M, D)', problems)
        if fc1:
            f['mlp_dim'] = fc1[0]
        f['qkv_bias'] = any(re.fullmatch(r'blocks\.\d+\.attn\.qkv\.bias', k) for k in sd)
        f['layer_scale'] = any(re.fullmatch(r'blocks\.\d+\.ls[12]\.gamma', k) for k in sd)

    f['distill_token'] = 'dist_token' in sd
    class_token = 'cls_token' in sd
    f['pool'] = overrides.get('pool', 'avg' if ('fc_norm.weight' in sd or not class_token) else 'cls')
    f['class_token'] = overrides.get('class_token', class_token)
    f['pool_norm'] = 'after' if 'fc_norm.weight' in sd else 'before'
    head = shape.get('head.weight')
    f['num_classes'] = head[0] if head is not None and len(head) == 2 else 0

    pos = ranked_shape(shape, 'pos_embed', 3, 'the image size as (1, prefix tokens + patches, D)',
                       problems)
    if pos and 'patch_size' in f:
        n_prefix = int(bool(f['class_token'])) + int(f['distill_token'])
        grid = isqrt_exact(pos[1] - n_prefix)
        if grid is None and n_prefix:
            grid = isqrt_exact(pos[1])  # no_embed_class: position rows for the patches only
        if not grid:
            problems.append(f'pos_embed has {pos[1]} rows: neither {pos[1]} nor {pos[1]} - {n_prefix} '
                            'prefix tokens is a square patch grid')
        else:
            f['image_size'] = grid * f['patch_size']

    width = overrides.get('width', f.get('width'))
    if 'num_heads' not in overrides and width is not None:
        if width % 64:
            problems.append(f'width {width} is not a multiple of 64, so the head count cannot default '
                            'to head_dim 64: pass num_heads=')
        else:
            f['num_heads'] = width // 64
    if problems:
        return None, problems
    f.update(overrides)
    try:
        return ViTConfig(**f), []
    except ConfigError as e:
        return None, [f'inferred config is invalid: {e}']


def check_state_dict(state_dict: Mapping[str, Any], cfg: ViTConfig, *,
                     no_embed_class: bool | None = None) -> None:
    """Check a timm state dict against the layout of a config.

    Args:
        state_dict: {timm key: array or tensor}.
        cfg: the model's config.
        no_embed_class: whether `pos_embed` lacks the prefix-token rows; `None` (default): read
          from its shape (`has_embed_class`).

    Raises:
        StateDictError: listing ALL missing, unexpected, wrongly shaped and non-float entries.
    """
    if no_embed_class is None:
        no_embed_class = (np.ndim(state_dict.get('pos_embed')) == 3
                          and not has_embed_class(state_dict, cfg))
    want = timm_shapes(cfg, no_embed_class=no_embed_class)
    problems = key_problems(state_dict, want, _UNSUPPORTED) + entry_problems(state_dict, want)
    if problems:
        desc = (f'width={cfg.width} depth={cfg.depth} heads={cfg.num_heads} mlp_dim={cfg.mlp_dim} '
                f'patch={cfg.patch_size} image={cfg.image_size} classes={cfg.num_classes} pool={cfg.pool} '
                f'class_token={cfg.class_token} distill_token={cfg.distill_token} qkv_bias={cfg.qkv_bias} '
                f'layer_scale={cfg.layer_scale}')
        raise StateDictError(problem_message(f'timm state dict does not match the ViT layout ({desc})',
                                              problems))


def from_timm(state_dict: Mapping[str, Any], **overrides: Any) -> tuple[ViTConfig, dict]:
    """timm/DeiT state dict -> config and canonical parameters.

    The config is inferred from the shapes (see the module docstring: the head count is
    `width // 64` unless `num_heads=` is given). To load a backbone without its classifier,
    drop the `head.*` (and `head_dist.*`) keys first.

    Args:
        state_dict: {timm key: numpy array or torch tensor}.
        **overrides: `ViTConfig` fields to set (`num_heads`, `ln_eps`, `gelu`, `pool`, `dtype`,
          `drop_path`, ...).

    Returns:
        `(cfg, params)`, with params in the stacked canonical layout as float32 jax arrays.

    Raises:
        StateDictError: overrides that contradict the shapes, and any missing, unexpected or
          mis-shaped key, reported together.
        ConfigError: an override is not a `ViTConfig` field.
    """
    cfg, problems = _infer(state_dict, overrides)
    if problems:
        # Also list keys that no timm ViT layout has, so one message shows everything.
        problems += unexpected_keys(sorted(k for k in state_dict
                                           if unsupported_hint(k, _UNSUPPORTED)
                                           or not _VIT_KEY.fullmatch(k)), _UNSUPPORTED)
        raise StateDictError(problem_message('cannot convert the timm state dict', problems))
    check_state_dict(state_dict, cfg)
    sd = {k: to_numpy(v) for k, v in state_dict.items()}
    return cfg, jax.tree.map(jnp.asarray, _canonical(sd, cfg))


_VIT_KEY = re.compile(
    r'(cls_token|dist_token|pos_embed|patch_embed\.proj\.(weight|bias)|(norm|fc_norm|head|head_dist)'
    r'\.(weight|bias)|blocks\.\d+\.(norm1|norm2|attn\.qkv|attn\.proj|mlp\.fc1|mlp\.fc2)\.(weight|bias)'
    r'|blocks\.\d+\.ls[12]\.gamma)')


def _canonical(sd: StateDict, cfg: ViTConfig) -> dict:
    """Pure numpy conversion of a checked state dict (float32 output)."""
    f32 = lambda x: np.asarray(x, np.float32)  # noqa: E731
    d, dh, norm = cfg.width, cfg.head_dim, _final_norm_key(cfg)
    want = jax.eval_shape(lambda: vit.init(cfg.replace(depth=1), jax.random.key(0)))
    top = {path: from_torch(path, f32(sd[torch_name(path, norm=norm)]), dh)
           for path in pytree.flatten({k: want[k] for k in MODULES if k in want})}
    pos = f32(sd['pos_embed'])
    if not has_embed_class(sd, cfg):
        pos = np.concatenate([np.zeros((1, cfg.num_prefix_tokens, d), np.float32), pos], axis=1)
    top['pos_embed'] = pos
    for name in ('cls_token', 'dist_token'):
        if name in sd:
            top[name] = f32(sd[name])

    def leaf(i: int, path: str) -> np.ndarray:   # the block leaf `path` of layer i
        module, tensor = path.rsplit('/', 1)
        if module in ('attn/q', 'attn/k', 'attn/v'):     # rows [q; k; v] of attn.qkv
            s = 'qkv'.index(module[-1])
            w = f32(sd[f'blocks.{i}.attn.qkv.{_TENSORS[tensor]}'])[s * d:(s + 1) * d]
        else:
            w = f32(sd[f'blocks.{i}.{torch_name(path)}'])
        return from_torch(path, w, dh)

    for path in pytree.flatten(want['blocks']):
        top['blocks/' + path] = np.stack([leaf(i, path) for i in range(cfg.depth)])
    return jax.tree.map(np.ascontiguousarray, pytree.unflatten(top))


# ----------------------------------------------------------------------------------------
# canonical -> timm.

def to_timm(params: Any, cfg: ViTConfig, *, no_embed_class: bool = False,
            dtype: Any = np.float32) -> StateDict:
    """Canonical parameters -> timm state dict of numpy arrays.

    Rebuild the model with `timm_kwargs(cfg)` and `model.load_state_dict(...)` (after
    `torch.from_numpy`).

    Args:
        params: canonical parameters, stacked or list layout.
        cfg: their config.
        no_embed_class: write the DeiT-3 position embedding without prefix rows (they must then
          be zero).
        dtype: the arrays' dtype (default float32).

    Returns:
        A dict of timm key to numpy array, in timm's order (`timm_shapes`); writable copies.

    Raises:
        ConfigError: timm cannot hold `cfg` (num_heads × head_dim != width, a non-default
          `attn_scale`, a pre-logits layer, a distillation token without class-token pooling).
        StateDictError: blocks of different shapes, parameters that do not fit `cfg`, or
          `no_embed_class` with non-zero prefix rows.
    """
    _check_timm_representable(cfg)
    params = stacked_for_export(params, "timm's VisionTransformer")
    check_params(params, cfg)
    p = jax.tree.map(lambda x: np.asarray(jax.device_get(x)), params)
    out: dict[str, np.ndarray] = {}
    if cfg.class_token:
        out['cls_token'] = p['cls_token']
    pos = p['pos_embed']
    if no_embed_class and cfg.num_prefix_tokens:
        n = cfg.num_prefix_tokens
        if np.any(pos[:, :n] != 0):
            raise StateDictError('no_embed_class=True drops the prefix-token rows of pos_embed, but they '
                                 'are not zero here: this model is not a no_embed_class model')
        pos = pos[:, n:]
    out['pos_embed'] = pos
    if cfg.distill_token:
        out['dist_token'] = p['dist_token']
    norm = _final_norm_key(cfg)
    for path, x in pytree.flatten({k: p[k] for k in MODULES if k in p}).items():
        out[torch_name(path, norm=norm)] = to_torch(path, x)
    blocks = pytree.flatten(p['blocks'])
    for i in range(cfg.depth):
        b = f'blocks.{i}.'
        for path, x in blocks.items():
            if not path.startswith(('attn/q/', 'attn/k/', 'attn/v/')):
                out[b + torch_name(path)] = to_torch(path, x[i])
        for tensor in ('kernel', 'bias') if cfg.qkv_bias else ('kernel',):   # rows [q; k; v]
            out[b + f'attn.qkv.{_TENSORS[tensor]}'] = np.concatenate(
                [to_torch(f'attn/{n}/{tensor}', blocks[f'attn/{n}/{tensor}'][i]) for n in 'qkv'])
    # timm's order; writable copies
    return {k: np.array(out[k], dtype=dtype, order='C')
            for k in timm_shapes(cfg, no_embed_class=no_embed_class)}


# ----------------------------------------------------------------------------------------
# A converted model's file.

def save_model_safetensors(state_dict: Mapping[str, Any], path: str | os.PathLike, cfg: ViTConfig,
                           kwargs: Mapping[str, Any]) -> str:
    """`save_safetensors` of a jlearngene model's state dict, with its description in the header.

    The header holds its config (which `jlearngene convert --from-timm` reads back), timm's
    class and constructor `kwargs`.

    Args:
        state_dict: the timm state dict (`to_timm`).
        path: the output file, ending in `.safetensors`.
        cfg: the model's config.
        kwargs: timm's constructor arguments (`timm_kwargs`), JSON-serialisable.

    Returns:
        `path`, as a str.

    Raises:
        ValueError: `path` does not end in `.safetensors`.
    """
    cls = 'VisionTransformerDistilled' if cfg.distill_token else 'VisionTransformer'
    return save_safetensors(state_dict, path, metadata={
        'jlearngene_config': json.dumps(cfg.to_dict()), 'timm_class': cls, 'timm_kwargs': json.dumps(kwargs)})
