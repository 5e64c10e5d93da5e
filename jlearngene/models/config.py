"""ViT configuration: a frozen, hashable dataclass plus the table of named variants.

The config is static data: it can be a `static_argnames` argument of `jax.jit`, a dict key,
and it round-trips through `to_dict` / `from_dict` (checkpoints store it that way).
"""
from __future__ import annotations

import dataclasses
import difflib
from typing import Any
from collections.abc import Mapping

from jlearngene.ops.reference import DENSE_PRECISIONS

POOLS = ('cls', 'avg')
GELUS = ('exact', 'tanh')
DTYPES = ('float32', 'bfloat16', 'float16')
POOL_NORMS = ('before', 'after')
INIT_TRUNCATIONS = ('absolute', 'two_sigma')

# DeiT shapes (Touvron et al. 2021): width, heads, MLP size. Depth is free.
VARIANTS: dict[str, dict[str, int]] = {
    'Ti': dict(width=192, num_heads=3, mlp_dim=768),
    'S': dict(width=384, num_heads=6, mlp_dim=1536),
    'B': dict(width=768, num_heads=12, mlp_dim=3072),
    'L': dict(width=1024, num_heads=16, mlp_dim=4096),
}


class ConfigError(ValueError):
    """A model config field has an impossible value. The message names field and value."""


class ConfigTypeError(ConfigError, TypeError):
    """Something other than a `ViTConfig` was given where one is expected (e.g. a dict)."""


@dataclasses.dataclass(frozen=True)
class ViTConfig:
    """Shape and numerics of a Vision Transformer.

    Attributes:
      image_size, patch_size, channels: input geometry (square images, NHWC).
      width, depth, num_heads, mlp_dim: encoder shape (DeiT-Ti is 192/12/3/768).
      head_dim: size of one attention head; None (the default) means width // num_heads.
        Set it when num_heads × head_dim differs from width: Cluster-Learngene keeps
        head_dim while the head count changes, Scala keeps the head count while head_dim
        shrinks. Resolved in `__post_init__`, so `cfg.head_dim` is always an integer;
        `replace` derives it again from new width/num_heads unless it is given or was set
        to something other than width // num_heads.
      attn_scale: the factor of q·kᵀ in attention; None (the default) means
        head_dim ** -0.5 of each block's heads. Scala's official sub-networks keep the full
        model's scale while head_dim shrinks.
      num_classes: classifier outputs; 0 means no head (features only).
      representation_size: size R of a pre-logits layer between the pooled features and
        the head, Dense (D -> R) then tanh (the original ViT's `representation_size`,
        big_vision's `rep_size`, as in the ImageNet-21k checkpoints); None (the default)
        means none: the head reads the pooled features. The layer belongs to the
        classifier: methods inherit or draw it with the head. Not with `distill_token`
        (DeiT's heads read the tokens directly).
      pool: 'cls' reads the class token, 'avg' averages the patch tokens.
      class_token: whether a class token is prepended; defaults to `pool == 'cls'`.
      distill_token: DeiT distillation token with its own head (`head_dist`).
      pool_norm: where the final LayerNorm sits for 'avg' pooling: 'before' pooling
        (mean of normalised tokens, TLEG's Aux-Net) or 'after' (timm's `fc_norm`).
        For 'cls' pooling both are the same function.
      ln_eps: LayerNorm epsilon (timm and flax default 1e-6).
      gelu: 'exact' (erf, timm's nn.GELU) or 'tanh' (faster approximation).
      dtype: computation dtype; parameters are always stored in float32.
      dense_precision: operand precision of the dense layers' matmuls (q/k/v/out
        projections, MLP, heads). 'float32' is exact. 'bfloat16' rounds both operands to
        bfloat16 and accumulates in float32, as TPUs do by default; activations, LayerNorm,
        softmax, GELU and the attention products keep `dtype`. Its speed on a CPU is
        XLA:CPU's (`python benchmarks/run.py --extra-rows bf16dense` measures it).
        With 'bfloat16' the dense layers (`jlearngene.ops.dense`) have a custom VJP: no
        forward mode (`jax.jvp`).
      qkv_bias: attention q/k/v projections carry biases (timm default True).
      layer_scale: LayerScale (`ls1`, `ls2` per-channel gains, DeiT-3) is present.
      drop_path: stochastic depth rate of the last block (linear from 0), used when train=True.
      dropout: dropout after attention/MLP projections, used when train=True.
      remat: rematerialise each block in the backward pass (saves memory, costs time).
      init_truncation: how `models.vit.init` truncates its normal(std 0.02) draws (linear
        kernels, position embeddings, prefix tokens). 'absolute' (default) is timm's
        `trunc_normal_(std=.02)`, as all the official codes run it: the bounds ±2 are
        absolute values, 100σ, so the draws are N(0, 0.02²) (std 0.0200, |w| up to ~0.1).
        'two_sigma' truncates at ±2σ = ±0.04 (std 0.0176).
    """
    image_size: int = 224
    patch_size: int = 16
    channels: int = 3
    width: int = 192
    depth: int = 12
    num_heads: int = 3
    mlp_dim: int = 768
    head_dim: int | None = None
    attn_scale: float | None = None
    num_classes: int = 1000
    representation_size: int | None = None
    pool: str = 'cls'
    class_token: bool | None = None
    distill_token: bool = False
    pool_norm: str = 'before'
    ln_eps: float = 1e-6
    gelu: str = 'exact'
    dtype: str = 'float32'
    dense_precision: str = 'float32'
    qkv_bias: bool = True
    layer_scale: bool = False
    drop_path: float = 0.0
    dropout: float = 0.0
    remat: bool = False
    init_truncation: str = 'absolute'

    def __post_init__(self):
        if self.class_token is None:
            object.__setattr__(self, 'class_token', self.pool == 'cls')
        if self.head_dim is None:
            _check(_positive_int(self.num_heads), 'num_heads', self.num_heads,
                   'must be a positive integer')
            _check(_positive_int(self.width), 'width', self.width, 'must be a positive integer')
            _check(self.width % self.num_heads == 0, 'width', self.width,
                   f'must be divisible by num_heads={self.num_heads} (or set head_dim)')
            object.__setattr__(self, 'head_dim', self.width // self.num_heads)
        validate(self)

    # Derived sizes -------------------------------------------------------------------
    @property
    def attn_width(self) -> int:
        """The width of the q/k/v projections' outputs, num_heads × head_dim."""
        return self.num_heads * self.head_dim

    @property
    def num_patches(self) -> int:
        """The number of patch tokens, (image_size // patch_size)²."""
        return (self.image_size // self.patch_size) ** 2

    @property
    def num_prefix_tokens(self) -> int:
        """The number of tokens before the patches (the class and distillation tokens, where present)."""
        return int(self.class_token) + int(self.distill_token)

    @property
    def num_tokens(self) -> int:
        """The number of tokens of a sequence, prefix tokens and patches."""
        return self.num_patches + self.num_prefix_tokens

    def replace(self, **changes: Any) -> ViTConfig:
        """A copy with some fields changed, validated again.

        Changing `pool` alone derives `class_token` again; changing `width` or `num_heads` alone
        derives `head_dim` again when it was `width // num_heads`.

        Args:
            **changes: new values of `ViTConfig` fields.

        Returns:
            The new config.

        Raises:
            ConfigError: a name in `changes` is not a field of ViTConfig, or a value is invalid
              (`validate`).
        """
        _check_fields(changes, 'ViTConfig has no field(s)')
        if 'pool' in changes and 'class_token' not in changes:
            changes['class_token'] = None
        if ('head_dim' not in changes and ('width' in changes or 'num_heads' in changes)
                and self.head_dim * self.num_heads == self.width):
            changes['head_dim'] = None
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (what `from_dict` reads, JSON-serialisable).

        Returns:
            A dict from every field's name to its value, `head_dim` and `class_token` resolved.
        """
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ViTConfig:
        """A config from `to_dict`'s output (e.g. read back from JSON).

        Args:
            d: the fields.

        Returns:
            The validated config.

        Raises:
            ConfigError: `d` names a field ViTConfig does not have, or a value is invalid.
        """
        _check_fields(d, 'ViTConfig has no field(s)')
        return cls(**dict(d))

    def diff(self, other: ViTConfig) -> dict[str, tuple[Any, Any]]:
        """Fields whose values differ.

        Args:
            other: the config to compare with.

        Returns:
            A dict from the name of every field whose values differ to `(self_value, other_value)`;
            empty when equal.
        """
        a, b = self.to_dict(), other.to_dict()
        return {k: (a[k], b[k]) for k in a if a[k] != b[k]}


def expect_config(cfg: Any, what: str) -> ViTConfig:
    """`cfg` itself when it is a `ViTConfig`.

    Args:
        cfg: what was given as a config.
        what: the start of the error message (the caller's name).

    Returns:
        `cfg`, unchanged.

    Raises:
        ConfigTypeError: `cfg` is not a `ViTConfig` (e.g. a dict); the message says how to make one.
    """
    if isinstance(cfg, ViTConfig):
        return cfg
    how = ("ViTConfig.from_dict(d) (or vit_config('Ti', **fields))" if isinstance(cfg, Mapping)
           else "vit_config('Ti', **fields), ViTConfig(...) or ViTConfig.from_dict(d)")
    raise ConfigTypeError(f'{what}: expected a ViTConfig, got {type(cfg).__name__}; make one '
                          f'with {how}')


def _check_fields(names, problem: str) -> None:
    """ConfigError `<problem> [unknown] (did you mean ...?); known fields: [...]` unless
    every name is a field; the closest field is named for each misspelt one."""
    known = {f.name for f in dataclasses.fields(ViTConfig)}
    unknown = sorted(set(names) - known)
    if unknown:
        close = {u: closest_field(u) for u in unknown}
        hint = ', '.join(f'{c!r} for {u!r}' for u, c in close.items() if c)
        raise ConfigError(f'{problem} {unknown}' + (f' (did you mean {hint}?)' if hint else '')
                          + f'; known fields: {sorted(known)}')


def closest_field(name: str) -> str | None:
    """The ViTConfig field a misspelt name most likely means.

    Args:
        name: a field name that ViTConfig may not have.

    Returns:
        difflib's closest field name, or None where none is close.
    """
    close = difflib.get_close_matches(name, [f.name for f in dataclasses.fields(ViTConfig)], n=1)
    return close[0] if close else None


def no_field(name: str) -> str:
    """The error text for a field that ViTConfig lacks, with the closest one.

    Args:
        name: the unknown field's name.

    Returns:
        "ViTConfig has no field 'name'", with " (did you mean 'x'?)" where `closest_field`
        finds one.
    """
    close = closest_field(name)
    return f'ViTConfig has no field {name!r}' + (f' (did you mean {close!r}?)' if close else '')


def _check(cond: bool, field: str, value: Any, why: str) -> None:
    if not cond:
        raise ConfigError(f'ViTConfig.{field}={value!r}: {why}')


def _positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def validate(cfg: ViTConfig) -> None:
    """Raise ConfigError naming the first impossible field.

    Args:
        cfg: the config to check (`ViTConfig.__post_init__` calls this for every config).

    Raises:
        ConfigError: a size is not a positive integer, `num_classes` not a non-negative integer,
          `representation_size` is not positive or comes with `distill_token`, `image_size`
          is not a multiple of `patch_size`, a choice field (`pool`, `gelu`, `dtype`,
          `dense_precision`, `init_truncation`, `pool_norm`) has an unknown value, `pool='cls'`
          lacks a class token, or `attn_scale`, `ln_eps`, `drop_path` or `dropout` is out of range.
    """
    for name in ('image_size', 'patch_size', 'channels', 'width', 'depth', 'num_heads',
                 'mlp_dim', 'head_dim'):
        v = getattr(cfg, name)
        _check(_positive_int(v), name, v, 'must be a positive integer')
    _check(isinstance(cfg.num_classes, int) and cfg.num_classes >= 0, 'num_classes',
           cfg.num_classes, 'must be a non-negative integer (0 = no head)')
    _check(cfg.representation_size is None or _positive_int(cfg.representation_size),
           'representation_size', cfg.representation_size,
           'must be a positive integer or None (no pre-logits layer)')
    _check(not (cfg.representation_size is not None and cfg.distill_token), 'representation_size',
           cfg.representation_size, 'a pre-logits layer is not combinable with distill_token=True')
    _check(cfg.image_size % cfg.patch_size == 0, 'image_size', cfg.image_size,
           f'must be divisible by patch_size={cfg.patch_size}')
    for name, choices in (('pool', POOLS), ('gelu', GELUS), ('dtype', DTYPES),
                          ('dense_precision', DENSE_PRECISIONS),
                          ('init_truncation', INIT_TRUNCATIONS), ('pool_norm', POOL_NORMS)):
        v = getattr(cfg, name)
        _check(v in choices, name, v, f'unknown {name}, expected one of {choices}')
    _check(not (cfg.pool == 'cls' and not cfg.class_token), 'class_token', cfg.class_token,
           "pool='cls' needs a class token")
    _check(cfg.attn_scale is None or (isinstance(cfg.attn_scale, (int, float))
                                      and cfg.attn_scale > 0), 'attn_scale', cfg.attn_scale,
           'must be a positive number or None (head_dim ** -0.5)')
    _check(cfg.ln_eps > 0, 'ln_eps', cfg.ln_eps, 'must be positive')
    _check(0.0 <= cfg.drop_path < 1.0, 'drop_path', cfg.drop_path, 'must be in [0, 1)')
    _check(0.0 <= cfg.dropout < 1.0, 'dropout', cfg.dropout, 'must be in [0, 1)')


def vit_config(variant: str = 'Ti', **overrides: Any) -> ViTConfig:
    """A named DeiT-shaped config ('Ti', 'S', 'B', 'L'), optionally with a patch size ('S/16').

    Args:
        variant: the name, optionally '/patch' (`VARIANTS` lists the names).
        **overrides: any field of `ViTConfig`, e.g. `vit_config('S', depth=6,
          num_classes=10, image_size=32, patch_size=4)`.

    Returns:
        The validated config.

    Raises:
        ConfigError: an unknown variant, a patch size that is not an integer, an unknown
          field, or values that do not fit together (`validate`).
    """
    name, _, patch = variant.partition('/')
    if name not in VARIANTS:
        raise ConfigError(f'unknown ViT variant {variant!r}; known variants: {sorted(VARIANTS)} '
                          "(optionally with '/patch', e.g. 'S/16')")
    fields = dict(VARIANTS[name])
    if patch:
        if not patch.isdigit():
            raise ConfigError(f'variant {variant!r}: patch size {patch!r} is not an integer')
        fields['patch_size'] = int(patch)
    fields.update(overrides)
    _check_fields(overrides, 'vit_config got unknown field(s)')
    return ViTConfig(**fields)


def model_config(section: Mapping[str, Any], **overrides: Any) -> ViTConfig:
    """The ViTConfig of a config file's `model` section: the one reading of a model section,
    for runs, studies and commands.

    Args:
        section: the `model` section, a ConfigDict or a mapping: `variant` (default 'Ti', see
          `vit_config`) plus any ViTConfig fields.
        **overrides: fields set over the section's (a study's depth and class count).

    Returns:
        The validated config.

    Raises:
        ConfigError: an unknown variant or field, or invalid values (`vit_config`).
    """
    d = dict(section.to_dict() if hasattr(section, 'to_dict') else section)
    d.update(overrides)
    return vit_config(d.pop('variant', 'Ti'), **d)
