"""A Vision Transformer as two pure functions over a canonical parameter tree.

`init(cfg, key) -> params` and `apply(params, images, cfg, ...) -> (logits, aux)`.

Canonical tree (stacked layout; L = depth, D = width, H = heads, Dh = head dim, M = MLP size,
T = prefix tokens + patches, K = classes, p = patch size, C = channels):

    patch_embed/kernel (p, p, C, D)   patch_embed/bias (D,)
    cls_token (1, 1, D)               [if cfg.class_token]
    dist_token (1, 1, D)              [if cfg.distill_token]
    pos_embed (1, T, D)               includes the prefix-token slots (timm semantics)
    blocks/norm1/{scale,bias} (L, D)
    blocks/attn/{q,k,v}/kernel (L, D, H, Dh)   blocks/attn/{q,k,v}/bias (L, H, Dh)
    blocks/attn/out/kernel (L, H, Dh, D)       blocks/attn/out/bias (L, D)
    blocks/ls1/scale (L, D)           [if cfg.layer_scale]
    blocks/norm2/{scale,bias} (L, D)
    blocks/mlp/fc1/kernel (L, D, M)  blocks/mlp/fc1/bias (L, M)
    blocks/mlp/fc2/kernel (L, M, D)  blocks/mlp/fc2/bias (L, D)
    blocks/ls2/scale (L, D)           [if cfg.layer_scale]
    norm/{scale,bias} (D,)
    pre_logits/{kernel (D, R), bias (R,)}   [if cfg.representation_size = R]
    head/{kernel (R or D, K), bias (K,)}    [if cfg.num_classes]
    head_dist/...                     [if cfg.distill_token and cfg.num_classes]

In the list layout `blocks` is a list of per-block trees without the leading L axis; blocks
may then differ in shape (e.g. head count). `apply` reads every block shape from the
parameters, so the config only fixes numerics (eps, GELU, pooling, dtype).

The dense layers' products and the attention core go through `jlearngene.ops` (`ops.dense`,
`ops.attention`), where backends may substitute faster implementations of the same math.
"""
from __future__ import annotations

import functools
import math
from typing import Any
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name

from jlearngene import compiler, ops, pytree
from jlearngene.models.config import ConfigError, ConfigTypeError, ViTConfig, expect_config

Params = dict[str, Any]
CAPTURES = ('blocks', 'attn')

# Block intermediates kept for the backward pass (outputs of matmuls, and the softmax
# where `ops.attention` keeps it under this name); see `encode`.
SAVED_IN_BLOCK = ('attn_qkv', 'attn_probs', 'attn_o', 'block_mid', 'mlp_hidden')
_SAVE_POLICY = jax.checkpoint_policies.save_only_these_names(*SAVED_IN_BLOCK)


def _static_config(cfg, what: str) -> ViTConfig:
    """`expect_config`, after a clear error for the commonest mistake: a config traced by
    `jax.jit` (it is static data, so its fields decide shapes and Python branches)."""
    if isinstance(cfg, jax.core.Tracer):
        raise ConfigTypeError(
            f"{what}: the config is a traced value: jax.jit traces every argument it is not "
            f"told is static; mark the config static, e.g. jax.jit({what}, "
            f"static_argnames='cfg')")
    return expect_config(cfg, what)


# ----------------------------------------------------------------------------------------
# Initialisation (timm / DeiT): trunc-normal(0.02) linear weights and embeddings, zero
# biases, LayerNorm ones/zeros, PyTorch-default uniform(±1/sqrt(fan_in)) patch conv.

def _trunc_normal(cfg: ViTConfig, key, shape, std=0.02):
    """A normal draw of standard deviation `std`, truncated as `cfg.init_truncation` says.

    'absolute' is timm's `trunc_normal_(std=.02)`, whose bounds a=-2, b=2 are absolute
    values: 100σ, which no float32 normal draw reaches, so it is N(0, std²) (the clip only
    states the bounds). 'two_sigma' truncates at ±2σ (std 0.88·std, |w| ≤ 2·std).
    """
    if cfg.init_truncation == 'two_sigma':
        return std * jax.random.truncated_normal(key, -2.0, 2.0, shape, jnp.float32)
    return jnp.clip(std * jax.random.normal(key, shape, jnp.float32), -2.0, 2.0)


def init_block(cfg: ViTConfig, key: jax.Array, *, num_heads: int | None = None,
               mlp_dim: int | None = None) -> Params:
    """One encoder block (no layers axis); `num_heads`/`mlp_dim` override the config's.

    The q/k/v kernels are (D, H, cfg.head_dim) and the output kernel (H, cfg.head_dim, D):
    another head count keeps the head size, so H × head_dim may differ from the width.

    Args:
        cfg: the model's config (width, head size, biases, LayerScale, init truncation).
        key: the PRNG key of the kernels.
        num_heads: the block's head count H; None (or 0) means `cfg.num_heads`.
        mlp_dim: the block's MLP size M; None (or 0) means `cfg.mlp_dim`.

    Returns:
        The block's float32 tree, holding `norm1`, `attn` (`q`, `k`, `v`, `out`), `norm2`, `mlp`
        (`fc1`, `fc2`) and, with `cfg.layer_scale`, `ls1` and `ls2` (gains 1e-5). Kernels are
        trunc-normal(0.02), biases zero (q/k/v biases only with `cfg.qkv_bias`).

    Raises:
        ConfigTypeError: `cfg` is not a `ViTConfig`, or is traced by `jax.jit`.
    """
    _static_config(cfg, 'init_block')
    d, h, dh = cfg.width, num_heads or cfg.num_heads, cfg.head_dim
    m = mlp_dim or cfg.mlp_dim
    kq, kk, kv, ko, k1, k2 = jax.random.split(key, 6)
    ones, zeros = jnp.ones((d,), jnp.float32), jnp.zeros((d,), jnp.float32)
    normal = functools.partial(_trunc_normal, cfg)

    def proj(k):
        p = {'kernel': normal(k, (d, h, dh))}
        if cfg.qkv_bias:
            p['bias'] = jnp.zeros((h, dh), jnp.float32)
        return p

    block = {
        'norm1': {'scale': ones, 'bias': zeros},
        'attn': {'q': proj(kq), 'k': proj(kk), 'v': proj(kv),
                 'out': {'kernel': normal(ko, (h, dh, d)), 'bias': zeros}},
        'norm2': {'scale': ones, 'bias': zeros},
        'mlp': {'fc1': {'kernel': normal(k1, (d, m)), 'bias': jnp.zeros((m,), jnp.float32)},
                'fc2': {'kernel': normal(k2, (m, d)), 'bias': zeros}},
    }
    if cfg.layer_scale:
        block['ls1'] = {'scale': jnp.full((d,), 1e-5, jnp.float32)}
        block['ls2'] = {'scale': jnp.full((d,), 1e-5, jnp.float32)}
    return block


def init_head(cfg: ViTConfig, key: jax.Array, num_classes: int | None = None) -> Params:
    """A classifier head; it reads the pre-logits layer's R outputs when the config has one.

    Args:
        cfg: the model's config.
        key: the PRNG key of the kernel.
        num_classes: the head's class count K; None means `cfg.num_classes`.

    Returns:
        A float32 dict with 'kernel', (R or D, K) trunc-normal(0.02), and 'bias', (K,) zeros.

    Raises:
        ConfigTypeError: `cfg` is not a `ViTConfig`, or is traced by `jax.jit`.
    """
    _static_config(cfg, 'init_head')
    k = cfg.num_classes if num_classes is None else num_classes
    fan_in = cfg.representation_size or cfg.width
    return {'kernel': _trunc_normal(cfg, key, (fan_in, k)), 'bias': jnp.zeros((k,), jnp.float32)}


def init_pre_logits(cfg: ViTConfig, key: jax.Array) -> Params:
    """The pre-logits layer Dense (D -> R) of `cfg.representation_size` = R.

    Args:
        cfg: the model's config; its `representation_size` is R.
        key: the PRNG key of the kernel.

    Returns:
        A float32 dict with 'kernel', (D, R) timm-style trunc-normal(0.02), and 'bias', (R,) zeros.

    Raises:
        ConfigTypeError: `cfg` is not a `ViTConfig`, or is traced by `jax.jit`.
        ValueError: `cfg.representation_size` is None (the config has no such layer).
    """
    r = _static_config(cfg, 'init_pre_logits').representation_size
    if r is None:
        raise ValueError('init_pre_logits: the config has representation_size=None (no layer)')
    return {'kernel': _trunc_normal(cfg, key, (cfg.width, r)), 'bias': jnp.zeros((r,), jnp.float32)}


def init_embeddings(cfg: ViTConfig, key: jax.Array) -> Params:
    """Everything outside the blocks: patch/position embeddings, prefix tokens, final norm,
    pre-logits layer, heads.

    Args:
        cfg: the model's config.
        key: the PRNG key of every draw here.

    Returns:
        The top-level float32 entries of the canonical tree, namely `patch_embed` (kernel and
        bias uniform ±1/√(p·p·C), PyTorch's conv default), `pos_embed` (trunc-normal(0.02)),
        `norm` (ones, zeros), and `cls_token`, `dist_token`, `pre_logits`, `head` and
        `head_dist` where the config has them (`init_pre_logits`, `init_head`).

    Raises:
        ConfigTypeError: `cfg` is not a `ViTConfig`, or is traced by `jax.jit`.
    """
    _static_config(cfg, 'init_embeddings')
    kp, kb, kc, kd, kpos, kh, khd = jax.random.split(key, 7)
    fan_in = cfg.patch_size * cfg.patch_size * cfg.channels
    bound = fan_in ** -0.5
    p, d = cfg.patch_size, cfg.width
    params: Params = {
        'patch_embed': {
            'kernel': jax.random.uniform(kp, (p, p, cfg.channels, d), jnp.float32, -bound, bound),
            'bias': jax.random.uniform(kb, (d,), jnp.float32, -bound, bound)},
        'pos_embed': _trunc_normal(cfg, kpos, (1, cfg.num_tokens, d)),
        'norm': {'scale': jnp.ones((d,), jnp.float32), 'bias': jnp.zeros((d,), jnp.float32)},
    }
    if cfg.class_token:
        params['cls_token'] = _trunc_normal(cfg, kc, (1, 1, d))
    if cfg.distill_token:
        params['dist_token'] = _trunc_normal(cfg, kd, (1, 1, d))
    if cfg.representation_size is not None:
        # Its own key derived from `key`: the other draws stay those of a model without it.
        params['pre_logits'] = init_pre_logits(cfg, jax.random.fold_in(key, 7))
    if cfg.num_classes:
        params['head'] = init_head(cfg, kh)
        if cfg.distill_token:
            params['head_dist'] = init_head(cfg, khd)
    return params


def _init(cfg: ViTConfig, key: jax.Array) -> Params:
    """Random parameters in the stacked layout (blocks on a leading `layers` axis).

    One compiled program per config (run eagerly, the draws would compile a program per
    operation and shape: most of the time a small model's initialisation takes); small
    models compile quickly on CPU (`compiler.run_once_jit`)."""
    k_emb, k_blocks = jax.random.split(key)
    params = init_embeddings(cfg, k_emb)
    params['blocks'] = jax.vmap(lambda k: init_block(cfg, k))(jax.random.split(k_blocks, cfg.depth))
    return params


def block_elements(cfg: ViTConfig) -> int:
    """The blocks' kernel values of `cfg` (the size of an initialisation, roughly).

    Args:
        cfg: the model's config.

    Returns:
        `depth × width × (4 × attn_width + 2 × mlp_dim)`, an int.
    """
    return cfg.depth * cfg.width * (4 * cfg.attn_width + 2 * cfg.mlp_dim)


_init_jit = compiler.run_once_jit(_init, lambda cfg, key: block_elements(cfg), static_argnums=0)


def init(cfg: ViTConfig, key: jax.Array) -> Params:
    """Random parameters of the ViT `cfg`, as timm/DeiT initialises one.

    One compiled program per config (run eagerly, the draws would compile a program per
    operation and shape: most of the time a small model's initialisation takes); small
    models compile quickly on CPU (`compiler.run_once_jit`).

    Args:
        cfg: the model's config.
        key: the PRNG key.

    Returns:
        The canonical parameter tree (stacked layout), float32.
    """
    return _init_jit(_static_config(cfg, 'init'), key)


# ----------------------------------------------------------------------------------------
# Trace-time checks of the inputs against the config (shapes only: free under jit).

@functools.lru_cache(maxsize=256)
def param_shapes(cfg: ViTConfig) -> Mapping[str, tuple[int, ...]]:
    """{path: shape} of `init(cfg)` (stacked layout), from `jax.eval_shape` (nothing is allocated).

    Computed once per config (an LRU cache): do not mutate the returned dict.

    Args:
        cfg: the model's config.

    Returns:
        A dict from every leaf's '/'-joined path to its shape tuple, the kernels first.
    """
    return _shape_table(jax.eval_shape(lambda: _init(cfg, jax.random.key(0))))


@functools.lru_cache(maxsize=1024)
def _block_shapes(cfg: ViTConfig, num_heads: int, mlp_dim: int) -> Mapping[str, tuple[int, ...]]:
    """{path: shape} of one list-layout block of `num_heads` heads and MLP size `mlp_dim`."""
    return _shape_table(jax.eval_shape(lambda: init_block(cfg, jax.random.key(0),
                                                          num_heads=num_heads, mlp_dim=mlp_dim)))


def _shape_table(tree: Any) -> dict[str, tuple[int, ...]]:
    """{path: shape}, kernels first: a kernel shows most of the config's sizes (a stacked
    q kernel is (L, D, H, Dh)), so the first mismatch reported is the most telling."""
    flat = [(p, tuple(x.shape)) for p, x in pytree.flatten(tree).items()]
    return dict(sorted(flat, key=lambda item: not item[0].endswith('kernel')))


# The config field that decides whether a leaf exists (for missing / unexpected leaves).
_PRESENCE_FIELD = (('cls_token', 'class_token'), ('dist_token', 'distill_token'),
                   ('head_dist', 'distill_token'), ('pre_logits', 'representation_size'),
                   ('head', 'num_classes'), ('ls1', 'layer_scale'), ('ls2', 'layer_scale'),
                   ('bias', 'qkv_bias'))


def _config_summary(cfg: ViTConfig, path: str | None = None) -> str:
    fields = ['width', 'depth', 'num_heads', 'head_dim', 'mlp_dim', 'image_size', 'patch_size',
              'channels', 'num_classes']
    if path is not None:
        parts = path.split('/')
        for name, field in _PRESENCE_FIELD:
            if name in parts and (name != 'bias' or 'attn' in parts and 'out' not in parts):
                if field not in fields:
                    fields.append(field)
                break
    return 'ViTConfig(' + ', '.join(f'{f}={getattr(cfg, f)!r}' for f in fields) + ')'


def _compare(got: Mapping[str, Any], want: Mapping[str, tuple[int, ...]], cfg: ViTConfig,
             what: str, prefix: str = '') -> None:
    """ConfigError naming the first leaf of `want` that `got` lacks or shapes differently,
    then the first leaf of `got` that `want` does not have."""
    for path, shape in want.items():
        name = prefix + path
        if path not in got:
            raise ConfigError(f"{what}: the config does not match the parameters: '{name}' is "
                              f'missing; {_config_summary(cfg, name)} expects shape {shape}')
        actual = tuple(np.shape(got[path]))
        if actual != shape:
            raise ConfigError(f"{what}: the config does not match the parameters: '{name}' has "
                              f'shape {actual} but {_config_summary(cfg)} expects {shape}')
    for path, leaf in got.items():
        if path not in want:
            name = prefix + path
            raise ConfigError(f"{what}: the config does not match the parameters: '{name}' "
                              f'(shape {tuple(np.shape(leaf))}) is not a parameter of '
                              f'{_config_summary(cfg, name)}')


def _block_sizes(block: Any, cfg: ViTConfig) -> tuple[int, int]:
    """(heads, MLP size) of one list-layout block, the config's where the block lacks them."""
    def size(get, default):
        try:
            return int(np.shape(get())[1])
        except (KeyError, TypeError, IndexError):
            return default
    return (size(lambda: block['attn']['q']['kernel'], cfg.num_heads),
            size(lambda: block['mlp']['fc1']['kernel'], cfg.mlp_dim))


def check_params(params: Any, cfg: ViTConfig, what: str = 'apply') -> None:
    """ConfigError unless `params` (arrays, tracers or `jax.ShapeDtypeStruct`s) has the
    leaves and shapes of `init(cfg)`; the message names the first mismatching leaf with its
    shape and the config's. Shapes only: it costs nothing at run time under `jax.jit`.

    Stacked layout: every leaf exactly as `init(cfg)`. List layout: `cfg.depth` blocks.
    Blocks that all share one head count and MLP size have the config's (`num_heads`,
    `mlp_dim`). Blocks that differ among themselves (Cluster-Learngene's per-layer heads,
    MatFormer's Mix'n'Match) each have the leaves of `init_block(cfg, num_heads=h,
    mlp_dim=m)` for their own h and m, which `apply` reads from the parameters (a config
    holds one value of each). Width, head size, depth and every leaf outside the blocks are
    the config's.

    Args:
        params: the parameters to check, either layout.
        cfg: the config they should match.
        what: the caller's name, to start error messages.

    Raises:
        ConfigError: `params` is not a mapping, a list of blocks is not `cfg.depth` long, or a
          leaf is missing, extra or of another shape than `cfg` gives (the first named); its
          subclass ConfigTypeError when `cfg` is not a `ViTConfig` or is traced by `jax.jit`.
    """
    cfg = _static_config(cfg, what)
    if not isinstance(params, Mapping):
        raise ConfigError(f'{what}: params must be a canonical parameter dict (from init), '
                          f'got {type(params).__name__}')
    want = param_shapes(cfg)
    blocks = params.get('blocks')
    if isinstance(blocks, (list, tuple)):
        if len(blocks) != cfg.depth:
            raise ConfigError(f"{what}: the config does not match the parameters: 'blocks' "
                              f'holds {len(blocks)} blocks (list layout) but '
                              f'{_config_summary(cfg)} has depth={cfg.depth}')
        sizes = [_block_sizes(block, cfg) for block in blocks]
        if len(set(sizes)) == 1:   # uniform blocks: the config states their sizes
            sizes = [(cfg.num_heads, cfg.mlp_dim)] * len(blocks)
        for i, (block, (heads, mlp_dim)) in enumerate(zip(blocks, sizes)):
            _compare(pytree.flatten(block), _block_shapes(cfg, heads, mlp_dim), cfg, what,
                     prefix=f'blocks/{i}/')
        params = {k: v for k, v in params.items() if k != 'blocks'}
        want = {p: s for p, s in want.items() if not p.startswith('blocks/')}
    _compare(pytree.flatten(params), want, cfg, what)


def check_images(images: Any, cfg: ViTConfig, what: str = 'apply') -> None:
    """ValueError unless `images` is a rank-4 NHWC batch of real floating values with the
    config's channel count (the spatial size is checked by `embed`, against the patch size
    and `pos_embed`). Integer, bool and complex images are refused, not cast: raw uint8
    pixels would run unnormalised (0..255 where the model expects the pipelines'
    `(x / 255 - mean) / std`), a complex batch would lose its imaginary part.

    Args:
        images: the batch, an array-like (or anything with `dtype` and `shape`).
        cfg: the model's config (`channels`; `image_size` for the message).
        what: the caller's name, to start error messages.

    Raises:
        ValueError: the images' dtype is not a real floating type, or their shape is not
          (batch, height, width, `cfg.channels`); the message hints at a missing batch axis or
          an NCHW batch where it sees one.
    """
    dtype = np.dtype(images.dtype if hasattr(images, 'dtype') else np.asarray(images).dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        hint = ('scale and normalise pixels as the data pipelines do, (x / 255 - mean) / std '
                'as float32' if jnp.issubdtype(dtype, jnp.integer) or dtype == np.bool_
                else 'pass real floating images')
        raise ValueError(f'{what}: images are {dtype.name}, not a floating type; {hint}')
    shape = tuple(np.shape(images))
    c = cfg.channels
    if len(shape) == 4 and shape[-1] == c:
        return
    hint = ''
    if len(shape) == 3 and shape[-1] == c:
        hint = '; a single image needs a batch axis: images[None]'
    elif len(shape) == 4 and shape[1] == c:
        hint = '; these look like NCHW: use images.transpose(0, 2, 3, 1)'
    raise ValueError(f'{what}: expected NHWC images of shape (batch, {cfg.image_size}, '
                     f'{cfg.image_size}, {c}) (H, W, C from the config: image_size='
                     f'{cfg.image_size}, channels={c}), got shape {shape}{hint}')


# ----------------------------------------------------------------------------------------
# Forward pass.

def layer_norm(x: jax.Array, p: Params, eps: float) -> jax.Array:
    """LayerNorm over the last axis, statistics in float32.

    Args:
        x: (..., D) activations, any floating dtype.
        p: {'scale': (D,), 'bias': (D,)}.
        eps: added to the variance.

    Returns:
        The normalised, scaled and shifted `x`, of its shape and dtype.
    """
    x32 = x.astype(jnp.float32)
    mean = x32.mean(-1, keepdims=True)
    var = jnp.square(x32 - mean).mean(-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + eps)
    return (y * p['scale'] + p['bias']).astype(x.dtype)


@jax.custom_jvp
def gelu_exact(x: jax.Array) -> jax.Array:
    """Exact (erf) GELU, x·Φ(x) = x·(1 + erf(x/√2))/2 (the formula of torch's nn.GELU).

    Written with `erf` rather than jax.nn.gelu's `erfc`: XLA:CPU expands erfc into several
    unfused loops while erf is one cheap polynomial. The custom derivative Φ(x) + x·φ(x)
    shares Φ with the activation and is one fused elementwise expression; under the
    encoder's save policy it is recomputed from the saved pre-activation in the backward
    pass, fused with the multiply by the incoming gradient.

    Args:
        x: an array of a floating dtype.

    Returns:
        GELU(x), of `x`'s shape and dtype.
    """
    return x * (0.5 + 0.5 * jax.lax.erf(x * jnp.asarray(_SQRT_HALF, x.dtype)))


@gelu_exact.defjvp
def _gelu_exact_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    cdf = 0.5 + 0.5 * jax.lax.erf(x * jnp.asarray(_SQRT_HALF, x.dtype))
    pdf = jnp.exp(-0.5 * x * x) * jnp.asarray(_INV_SQRT_2PI, x.dtype)
    return x * cdf, t * (cdf + x * pdf)


_SQRT_HALF = 0.7071067811865476      # 1/√2
_INV_SQRT_2PI = 0.3989422804014327   # 1/√(2π)


def gelu(x: jax.Array, kind: str) -> jax.Array:
    """GELU of `x`, exact or the tanh approximation.

    Args:
        x: an array of a floating dtype.
        kind: 'tanh' for the tanh approximation (Flax's, big_vision's); anything else gives the
          exact erf form (timm's `nn.GELU`, `gelu_exact`).

    Returns:
        GELU(x), of `x`'s shape and dtype.
    """
    if kind == 'tanh':
        return jax.nn.gelu(x, approximate=True)
    return gelu_exact(x)


def _dense(x, p, n_in=1, precision='float32'):
    """A dense layer over the last `n_in` axes of x (kernel axes: n_in inputs, then outputs)."""
    kernel = p['kernel'].astype(x.dtype)
    k = math.prod(kernel.shape[:n_in])
    lead, out = x.shape[:x.ndim - n_in], kernel.shape[n_in:]
    y = ops.dense(x.reshape(-1, k), kernel.reshape(k, -1), precision)
    if 'bias' in p:
        y = y + p['bias'].astype(x.dtype).reshape(-1)
    return y.reshape(lead + out)


def _drop_path(x, rate, key):
    """Stochastic depth: drop the whole residual branch per sample."""
    keep = 1.0 - rate
    mask = jax.random.bernoulli(key, keep, (x.shape[0],) + (1,) * (x.ndim - 1))
    return jnp.where(mask, x / jnp.maximum(keep, 1e-12), 0.0).astype(x.dtype)


def _dropout(x, rate, key):
    if rate == 0.0:
        return x
    keep = 1.0 - rate
    mask = jax.random.bernoulli(key, keep, x.shape)
    return jnp.where(mask, x / keep, 0.0).astype(x.dtype)


def attention(p: Params, x: jax.Array, n_queries: int | None = None,
              precision: str = 'float32', need_probs: bool = False,
              scale: float | None = None):
    """Multi-head self-attention with explicit heads.

    q, k, v = x·W_q, x·W_k, x·W_v (+ biases), per head (B, T, H, Dh); the core is
    softmax(scale·q·kᵀ)·v (`ops.attention`), then the output projection over (H, Dh).

    Args:
        p: the block's `attn` parameters: `q`, `k`, `v` (kernel (D, H, Dh), optional bias
          (H, Dh)) and `out` (kernel (H, Dh, D), bias (D,)).
        x: (B, T, D) tokens, already normalised.
        n_queries: compute the output only for the first `n_queries` tokens (all tokens still
          serve as keys and values): what the last block needs when only the class token is
          read. None: every token.
        precision: the operand precision of the q/k/v and output projections (`ops.dense`);
          the core keeps `x.dtype`.
        need_probs: return the attention probabilities.
        scale: the factor of q·kᵀ; None means 1/√Dh.

    Returns:
        The pair `(output, probs)`, with output (B, Tq, D), Tq = `n_queries` or T, and probs
        the attention probabilities (B, H, Tq, T) when `need_probs`, else None.

    Raises:
        ValueError: some but not all of q, k and v have biases.
    """
    head_dim = p['q']['kernel'].shape[-1]
    names = 'qkv' if n_queries is None else 'kv'
    # One (D, n·H·Dh) projection instead of n: a bigger matmul, and one matmul each for the
    # input and weight gradients in the backward pass.
    fused = {'kernel': jnp.stack([p[n]['kernel'] for n in names], axis=1)}   # (D, n, H, Dh)
    if all('bias' in p[n] for n in 'qkv'):
        fused['bias'] = jnp.stack([p[n]['bias'] for n in names])
    elif any('bias' in p[n] for n in 'qkv'):
        raise ValueError('attention: q, k and v must all have biases or none')
    qkv = checkpoint_name(_dense(x, fused, precision=precision), 'attn_qkv')  # (B, T, n, H, Dh)
    # `split`, not slices: its derivative is one concatenate of the parts' gradients, where
    # the slices' would be zero-padded full-size arrays summed.
    parts = [t.squeeze(2) for t in jnp.split(qkv, len(names), axis=2)]
    if n_queries is None:
        q, k, v = parts
    else:
        (k, v), q = parts, checkpoint_name(
            _dense(x[:, :n_queries], p['q'], precision=precision), 'attn_qkv')
    scale = head_dim ** -0.5 if scale is None else scale
    o, probs = ops.attention(q, k, v, scale, need_probs=need_probs,
                             probs_name='attn_probs')
    o = checkpoint_name(o, 'attn_o')
    return _dense(o, p['out'], n_in=2, precision=precision), probs


def mlp(p: Params, x: jax.Array, gelu_kind: str, precision: str = 'float32') -> jax.Array:
    """The MLP of one block: fc2(GELU(fc1(x))).

    Args:
        p: the block's `mlp` parameters (`fc1`, `fc2`).
        x: (..., width) activations.
        gelu_kind: 'exact' or 'tanh' (`gelu`).
        precision: the dense layers' operand precision ('float32' or 'bfloat16').

    Returns:
        (..., width) activations.
    """
    h = checkpoint_name(_dense(x, p['fc1'], precision=precision), 'mlp_hidden')
    return _dense(gelu(h, gelu_kind), p['fc2'], precision=precision)


def check_rng(cfg: ViTConfig, what: str = 'apply') -> None:
    """ValueError when training under `cfg` draws random numbers (dropout or stochastic
    depth) but no PRNG key was given: without one they would be skipped silently.

    Callers call it for `train=True` without a key; it reads only the config.

    Args:
        cfg: the model's config (`dropout`, `drop_path`).
        what: the caller's name, to start the error message.

    Raises:
        ValueError: `cfg.dropout` or `cfg.drop_path` is not zero.
    """
    rates = [f'{f}={getattr(cfg, f)}' for f in ('dropout', 'drop_path') if getattr(cfg, f)]
    if rates:
        raise ValueError(f"{what}(train=True): the config has {' and '.join(rates)} but no rng "
                         'was given, so they would be skipped; pass rng=jax.random.key(...) '
                         '(or train=False to evaluate)')


def _branch(y, p, scale_name, cfg, drop_rate, keys, stochastic):
    """Dropout, LayerScale and stochastic depth of one residual branch."""
    if stochastic:
        y = _dropout(y, cfg.dropout, keys[0])
    if scale_name in p:
        y = y * p[scale_name]['scale'].astype(y.dtype)
    if stochastic and cfg.drop_path:
        y = _drop_path(y, drop_rate, keys[1])
    return y


def block_apply(p: Params, x: jax.Array, cfg: ViTConfig, *, drop_rate=0.0, key=None,
                train: bool = False, n_out: int | None = None,
                need_probs: bool = False) -> tuple[jax.Array, jax.Array | None]:
    """One pre-norm encoder block: x + attn(LN(x)), then x + MLP(LN(x)).

    Args:
        p: one block's parameters (no layers axis).
        x: (B, T, D) tokens.
        cfg: the model's config, for numerics (`ln_eps`, `gelu`, `dense_precision`,
          `attn_scale`, `dropout`, `drop_path`).
        drop_rate: this block's stochastic-depth rate (used when `train` with a `key` and
          `cfg.drop_path` is not zero).
        key: the PRNG key of dropout and stochastic depth; None draws nothing.
        train: training mode: dropout and stochastic depth where `key` is given.
        n_out: return only the first `n_out` tokens, computing nothing for the others beyond
          their keys and values; None: every token.
        need_probs: also return the attention probabilities.

    Returns:
        The pair `(tokens, probs)`, with tokens (B, n_out or T, D) and probs
        (B, H, n_out or T, T) when `need_probs`, else None.

    Raises:
        ValueError: `train` without `key` while the config has dropout or stochastic depth
          (`check_rng`).
    """
    if train and key is None:
        check_rng(cfg, 'block_apply')
    stochastic = train and key is not None
    keys = jax.random.split(key, 4) if stochastic else [None] * 4
    y, probs = attention(p['attn'], layer_norm(x, p['norm1'], cfg.ln_eps), n_out,
                         cfg.dense_precision, need_probs, cfg.attn_scale)
    if n_out is not None:
        x = x[:, :n_out]
    x = checkpoint_name(x + _branch(y, p, 'ls1', cfg, drop_rate, keys[:2], stochastic), 'block_mid')
    y = mlp(p['mlp'], layer_norm(x, p['norm2'], cfg.ln_eps), cfg.gelu, cfg.dense_precision)
    return x + _branch(y, p, 'ls2', cfg, drop_rate, keys[2:], stochastic), probs


def embed(params: Params, images: jax.Array, cfg: ViTConfig) -> jax.Array:
    """Patchify (a reshape + one matmul, equal to the strided conv), add prefix tokens and
    position embeddings.

    Args:
        params: canonical parameters (the patch size is read from `patch_embed/kernel`).
        images: (B, H, W, C) NHWC images.
        cfg: the model's config (`dtype`).

    Returns:
        (B, T, D) tokens in `cfg.dtype`, the prefix tokens followed by the patches row by row.

    Raises:
        ValueError: H or W is not a multiple of the patch size, or `pos_embed` does not have
          one position per token.
    """
    b, hgt, wid, c = images.shape
    kernel = params['patch_embed']['kernel']
    p = kernel.shape[0]
    if hgt % p or wid % p:
        raise ValueError(f'image size {hgt}x{wid} is not divisible by the patch size {p}')
    dtype = jnp.dtype(cfg.dtype)
    x = images.astype(dtype).reshape(b, hgt // p, p, wid // p, p, c)
    x = x.transpose(0, 1, 3, 2, 4, 5).reshape(b, (hgt // p) * (wid // p), p * p * c)
    x = x @ kernel.reshape(p * p * c, -1).astype(dtype) + params['patch_embed']['bias'].astype(dtype)
    n_patches = x.shape[1]
    prefix = [params[n] for n in ('cls_token', 'dist_token') if n in params]
    if prefix:
        prefix = jnp.concatenate(prefix, axis=1).astype(dtype)
        x = jnp.concatenate([jnp.broadcast_to(prefix, (b,) + prefix.shape[1:]), x], axis=1)
    pos = params['pos_embed']
    if pos.shape[1] != x.shape[1]:
        raise ValueError(f'pos_embed has {pos.shape[1]} positions but the input gives {x.shape[1]} '
                         f'tokens ({n_patches} patches of {hgt}x{wid} images)')
    return x + pos.astype(dtype)


def encode(blocks, x: jax.Array, cfg: ViTConfig, *, train=False, rng=None,
           capture: Sequence[str] = (), n_out: int | None = None) -> tuple[jax.Array, dict[str, Any]]:
    """Run the encoder blocks in either layout; stacked blocks run under one `lax.scan`.

    Args:
        blocks: `params['blocks']`, stacked (a dict) or a list of blocks.
        x: (B, T, D) embedded tokens (`embed`).
        cfg: the model's config: numerics, `drop_path` (the last block's rate, linear from 0
          at the first) and `remat`.
        train: training mode: dropout and stochastic depth, where `rng` is given.
        rng: the PRNG key, split once per block; None draws nothing.
        capture: what to report in `aux`: 'blocks' and/or 'attn' (other names are ignored;
          `apply` checks them).
        n_out: compute the last block's output only for the first `n_out` tokens, equal to those
          tokens of the full output; None: all. Not combinable with `capture`, which reports
          every block in full.

    Returns:
        The pair `(tokens, aux)`, with tokens (B, T or n_out, D). aux holds 'blocks' (every block's
        output, (L, B, T, D)) and 'attn' (probabilities, (L, B, H, T, T)) where captured,
        lists in the list layout when blocks differ in shape.

    Raises:
        ValueError: `n_out` with a `capture`; or `train` without `rng` while the config has
          dropout or stochastic depth (`check_rng`).
    """
    if train and rng is None:
        check_rng(cfg, 'encode')
    want_blocks, want_attn = 'blocks' in capture, 'attn' in capture
    if n_out is not None and (want_blocks or want_attn):
        raise ValueError(f'encode: n_out={n_out} drops tokens that capture={tuple(capture)} reports')
    stacked = isinstance(blocks, dict)
    depth = jax.tree.leaves(blocks)[0].shape[0] if stacked else len(blocks)
    rates = jnp.linspace(0.0, cfg.drop_path, depth, dtype=jnp.float32)   # [0.] for one block
    keys = jax.random.split(rng, depth) if (train and rng is not None) else None

    def checkpointed(n):
        # Under differentiation a block keeps only the SAVED_IN_BLOCK tensors for its
        # backward pass and recomputes the cheap elementwise rest (LayerNorms, GELU, bias
        # adds): with layers in a `lax.scan` every saved tensor is copied into a (depth, ...)
        # stack and back, which costs more than recomputing it. `cfg.remat` saves nothing.
        step = functools.partial(block_apply, cfg=cfg, train=train, n_out=n,
                                 need_probs=want_attn)
        return jax.checkpoint(step, prevent_cse=False, policy=None if cfg.remat else _SAVE_POLICY)

    step = checkpointed(None)
    last_step = step if n_out is None else checkpointed(n_out)
    aux: dict[str, Any] = {}
    per_layer = (blocks, rates, keys)
    if stacked:
        def body(h, xs):
            p, rate, key = xs
            h, probs = step(p, h, drop_rate=rate, key=key)
            return h, (h if want_blocks else None, probs if want_attn else None)
        if n_out is None:
            x, (outs, probs) = jax.lax.scan(body, x, per_layer)
        else:   # all but the last block in the scan, the last one pruned
            if depth > 1:
                x, _ = jax.lax.scan(body, x, jax.tree.map(lambda a: a[:-1], per_layer))
            p, rate, key = jax.tree.map(lambda a: a[-1], per_layer)
            x, _ = last_step(p, x, drop_rate=rate, key=key)
    else:
        outs, probs = [], []
        for i, p in enumerate(blocks):
            fn = last_step if i == depth - 1 else step
            x, pr = fn(p, x, drop_rate=rates[i], key=None if keys is None else keys[i])
            outs.append(x)
            probs.append(pr)
        outs = _stack_if_same(outs) if want_blocks else None
        probs = _stack_if_same(probs) if want_attn else None
    if want_blocks:
        aux['blocks'] = outs
    if want_attn:
        aux['attn'] = probs
    return x, aux


def _stack_if_same(xs):
    if xs and all(x.shape == xs[0].shape for x in xs):
        return jnp.stack(xs)
    return xs


def _n_prefix(params: Params) -> int:
    return sum(n in params for n in ('cls_token', 'dist_token'))


def pool(params: Params, x: jax.Array, cfg: ViTConfig) -> jax.Array:
    """Final LayerNorm and pooling to one feature vector per image (the head's input, or the
    pre-logits layer's when the model has one).

    Args:
        params: canonical parameters (`norm`; the prefix tokens present are skipped for 'avg').
        x: (B, T, D) tokens of the last block (for 'cls' pooling, the first token suffices).
        cfg: the model's config: `pool` ('cls': the normalised class token; 'avg': the mean
          of the patch tokens), `pool_norm` and `ln_eps`.

    Returns:
        (B, D) features, in `x`'s dtype.
    """
    if cfg.pool == 'cls':
        return layer_norm(x[:, 0], params['norm'], cfg.ln_eps)
    patches = x[:, _n_prefix(params):]
    if cfg.pool_norm == 'after':
        return layer_norm(patches.mean(axis=1), params['norm'], cfg.ln_eps)
    return layer_norm(patches, params['norm'], cfg.ln_eps).mean(axis=1)


def apply(params: Params, images: jax.Array, cfg: ViTConfig, *, train: bool = False,
          rng: jax.Array | None = None, capture: Sequence[str] = ()) -> tuple[jax.Array, dict]:
    """The forward pass of the ViT `cfg` on NHWC `images`.

    With class-token pooling and no `capture`, the last block computes only the prefix tokens
    that the heads read (keys and values still come from every token): the same logits for
    ≈1/depth less work. Both checks below read shapes and dtypes only, at trace time.

    Args:
        params: canonical parameters of `cfg`, stacked or list layout.
        images: (batch, height, width, `cfg.channels`) floating values.
        cfg: the model's config; it must match the parameters' shapes (`check_params`).
        train: training mode (dropout and stochastic depth at the config's rates).
        rng: the PRNG key that drives dropout and stochastic depth; required with `train=True`
          and either rate above 0, else unused.
        capture: what to add to `aux`: 'blocks' (per-block token outputs, (L, B, T, D)) and
          'attn' (attention probabilities, (L, B, H, T, T)); lists in the list layout when
          blocks differ in shape.

    Returns:
        The pair `(logits, aux)`. `aux['pre_logits']`, always present, is what the head
        reads (the pooled features, or with a `pre_logits` layer its output tanh(features·W +
        b)); without a head it is also the returned output. With a distillation token, `aux['logits_cls']`
        and `aux['logits_dist']` hold both heads (`head_dist` reads the normalised distillation token,
        the token after the class token or the first one without a class token), and `logits` is
        their mean in evaluation and the class head when `train=True` (DeiT semantics).

    Raises:
        ConfigError: `cfg` does not match the parameters' shapes (the first differing leaf
          named).
        ValueError: the images are not NHWC floating values with `cfg.channels` channels
          (integer, bool and complex images are never cast), or `train=True` needs a `rng`.
    """
    cfg = _static_config(cfg, 'apply')
    check_params(params, cfg, 'apply')
    check_images(images, cfg, 'apply')
    for name in capture:
        if name not in CAPTURES:
            raise ValueError(f'unknown capture {name!r}; expected a subset of {CAPTURES}')
    if train and rng is None:
        check_rng(cfg, 'apply')
    x = embed(params, images, cfg)
    # Class-token pooling reads only the prefix tokens of the last block: compute just those.
    n_out = _n_prefix(params) if cfg.pool == 'cls' and not capture else None
    x, aux = encode(params['blocks'], x, cfg, train=train, rng=rng, capture=capture, n_out=n_out)
    feats = pool(params, x, cfg)
    if 'pre_logits' in params:
        feats = jnp.tanh(_dense(feats, params['pre_logits'], precision=cfg.dense_precision))
    aux['pre_logits'] = feats
    if 'head' not in params:
        return feats, aux
    logits = _dense(feats, params['head'], precision=cfg.dense_precision)
    if 'dist_token' in params and 'head_dist' in params:
        # The distillation token follows the class token where there is one, else comes first.
        dist_feats = layer_norm(x[:, int('cls_token' in params)], params['norm'], cfg.ln_eps)
        logits_dist = _dense(dist_feats, params['head_dist'], precision=cfg.dense_precision)
        aux['logits_cls'], aux['logits_dist'] = logits, logits_dist
        if not train:
            logits = (logits + logits_dist) / 2
    return logits.astype(jnp.float32), aux
