"""The one seam between the model's math and backend-specific speed paths.

The model (`jlearngene.models.vit`) computes its dense layers and its attention core through
two functions:

    dense(x, w, precision='float32') -> x @ w            x (N, K), w (K, M)
    attention(q, k, v, scale, *, need_probs=False, probs_name=None) -> (o, probs | None)
        q (B, Tq, H, Dh), k and v (B, T, H, Dh); o (B, Tq, H, Dh), probs (B, H, Tq, T)

Each call first offers the work to the enabled backends of jax's default platform, in the
order they registered; a backend's function returns `NotImplemented` to decline (a shape,
dtype or device it does not cover), and the reference implementation (`ops.reference`,
plain jax: `x @ w`, `jax.nn.dot_product_attention`) computes whatever no backend takes.
CPUs and TPUs run the reference, with XLA's own kernels; GPUs run it but for the attention
calls the GPU backend takes.

A backend is a module that calls `register(Backend(...))` when imported (`unregister(name)`
removes one); the built-in ones are listed in `BUILTIN_BACKENDS` and imported with this
package. `ops.gpu` is the GPU backend: cuDNN's fused attention for bfloat16/float16 calls
that need no probabilities. Removing a backend is deleting its module and its name in
`BUILTIN_BACKENDS`; nothing in the model refers to one.

Switches, all read when a function is traced (a function jitted before keeps its choice):
  * JLEARNGENE_BACKENDS: 'all' (default), 'reference' (no backend: every platform runs the
    reference), or a comma-separated list of backend names to enable (e.g. 'gpu').
  * `with ops.use_reference(): ...` turns every backend off inside the block.
  * A backend's own finer switches (the GPU backend: JLEARNGENE_GPU_CUDNN_ATTENTION=0).
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import threading
from typing import Any
from collections.abc import Callable, Iterator

import jax

from jlearngene.ops import reference
from jlearngene.ops.reference import DENSE_PRECISIONS

ENV_SWITCH = 'JLEARNGENE_BACKENDS'
BUILTIN_BACKENDS = ('jlearngene.ops.gpu',)


@dataclasses.dataclass(frozen=True)
class Backend:
    """A set of speed paths for one jax platform ('cpu', 'gpu', 'tpu').

    dense(x, w, precision) and attention(q, k, v, scale, need_probs, probs_name) have the
    signatures and results of the module-level functions, or return `NotImplemented` to
    leave a call to the next backend or the reference. enabled() is the backend's own
    switch, read at trace time.
    """
    name: str
    platform: str
    dense: Callable[..., Any] | None = None
    attention: Callable[..., Any] | None = None
    enabled: Callable[[], bool] = lambda: True


_registry: dict[str, Backend] = {}
_state = threading.local()


def register(backend: Backend) -> None:
    """Add a backend (replacing one of the same name).

    Args:
        backend: the backend; its `name` is its key in the registry.
    """
    _registry[backend.name] = backend


def unregister(name: str) -> None:
    """Remove a registered backend.

    Args:
        name: the name the backend was registered as.

    Raises:
        KeyError: no backend is registered as `name`.
    """
    if name not in _registry:
        raise KeyError(f'no backend registered as {name!r}; registered: {sorted(_registry)}')
    del _registry[name]


def registered() -> dict[str, Backend]:
    """Every registered backend, enabled or not.

    Returns:
        A new dict of name to `Backend`, in registration order.
    """
    return dict(_registry)


def env_switch_on(name: str, default: bool = True) -> bool:
    """An on/off environment switch.

    The value is read case-blind, spaces stripped: 0/1, false/true, no/yes, off/on. A variable
    set to the empty string (or to spaces) counts as unset.

    Args:
        name: the environment variable.
        default: the switch's state where the variable is unset or empty.

    Returns:
        `default` where the variable is unset or empty; False for 0, false, no or off; True for
        1, true, yes or on.

    Raises:
        ValueError: the variable holds any other value.
    """
    value = os.environ.get(name, '').strip().lower()
    if not value:
        return default
    if value not in ('0', '1', 'false', 'true', 'no', 'yes', 'off', 'on'):
        raise ValueError(f'{name}={value!r}: expected 0 or 1 (or false/true, no/yes, off/on)')
    return value not in ('0', 'false', 'no', 'off')


def _enabled_names() -> set[str] | None:
    """The names JLEARNGENE_BACKENDS enables; None means all."""
    value = os.environ.get(ENV_SWITCH, 'all').strip().lower()
    if value in ('', 'all'):
        return None
    if value == 'reference':
        return set()
    names = {n.strip() for n in value.split(',') if n.strip()}
    unknown = sorted(names - set(_registry))
    if unknown:
        raise ValueError(f"{ENV_SWITCH}={value!r}: unknown backend(s) {unknown}; expected "
                         f"'all', 'reference' or names among {sorted(_registry)}")
    return names


@contextlib.contextmanager
def use_reference() -> Iterator[None]:
    """Inside the block every backend is off: functions traced there run the reference.

    The switch is per thread; the state before the block is restored after it, so blocks nest.

    Yields:
        `None`.
    """
    old = getattr(_state, 'reference', False)
    _state.reference = True
    try:
        yield
    finally:
        _state.reference = old


def active_backends(platform: str | None = None) -> list[Backend]:
    """The enabled backends of a platform, in registration order.

    A backend is enabled outside `use_reference`, where JLEARNGENE_BACKENDS names it (or is
    'all') and its own `enabled()` is true.

    Args:
        platform: a jax platform ('cpu', 'gpu', 'tpu'); `None` (default): `jax.default_backend()`.

    Returns:
        A list of `Backend`s; empty inside `use_reference` and with JLEARNGENE_BACKENDS=reference.

    Raises:
        ValueError: JLEARNGENE_BACKENDS names a backend that is not registered, or a backend's own
          switch holds no on/off value (the GPU backend's JLEARNGENE_GPU_CUDNN_ATTENTION).
    """
    if getattr(_state, 'reference', False):
        return []
    names = _enabled_names()
    platform = platform or jax.default_backend()
    return [b for b in _registry.values()
            if b.platform == platform and (names is None or b.name in names) and b.enabled()]


def dense(x: jax.Array, w: jax.Array, precision: str = 'float32') -> jax.Array:
    """`x @ w` at an operand precision of `DENSE_PRECISIONS`.

    'float32' is the exact product. 'bfloat16' rounds both operands to bfloat16 and
    accumulates in float32, in the forward pass and in both gradient products; the result
    has x's dtype (reverse mode only; see `reference.dense`).

    Args:
        x: the left operand, (N, K).
        w: the right operand, (K, M).
        precision: 'float32' (default) or 'bfloat16'.

    Returns:
        The product, (N, M), from the first active backend that takes the call, else from
        `reference.dense`.

    Raises:
        ValueError: `precision` is not in `DENSE_PRECISIONS`; `x` or `w` is not 2-D or their
          inner sizes differ; or `active_backends` rejects the switches.
    """
    if precision not in DENSE_PRECISIONS:
        raise ValueError(f'dense: unknown precision {precision!r}, '
                         f'expected one of {DENSE_PRECISIONS}')
    if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[0]:
        raise ValueError(f'dense: incompatible operands {x.shape} and {w.shape}')
    for b in active_backends():
        if b.dense is not None and (y := b.dense(x, w, precision)) is not NotImplemented:
            return y
    return reference.dense(x, w, precision)


def attention(q: jax.Array, k: jax.Array, v: jax.Array, scale: float, *,
              need_probs: bool = False, probs_name: str | None = None):
    """Softmax attention: probs = softmax((q·scale)·kᵀ) over the keys, o = probs·v.

    Tq may differ from T (e.g. only the class token as query).

    Args:
        q: the queries, (B, Tq, H, Dh).
        k: the keys, (B, T, H, Dh).
        v: the values, of `k`'s shape.
        scale: the factor of the queries, usually `Dh ** -0.5`.
        need_probs: return the probabilities too.
        probs_name: names the probabilities with `checkpoint_name` wherever they are kept for
          the backward pass, so a `jax.checkpoint` policy can save them; `None`: no name.

    Returns:
        `(o, probs)`, with o (B, Tq, H, Dh) and probs (B, H, Tq, T); probs is `None` unless
        `need_probs` (a backend may return it anyway).

    Raises:
        ValueError: `q`, `k` or `v` is not 4-D, `k` and `v` differ in shape, or `q` and `k` differ
          in batch, head count or head dim; or `active_backends` rejects the switches.
    """
    if q.ndim != 4 or k.ndim != 4 or k.shape != v.shape or q.shape[::2] != k.shape[::2] \
            or q.shape[-1] != k.shape[-1]:
        raise ValueError(f'attention: expected q (B, Tq, H, Dh) and k, v (B, T, H, Dh), got '
                         f'{q.shape}, {k.shape}, {v.shape}')
    for b in active_backends():
        if b.attention is not None and (
                out := b.attention(q, k, v, scale, need_probs, probs_name)) is not NotImplemented:
            return out
    return reference.attention(q, k, v, scale, need_probs=need_probs, probs_name=probs_name)


for _name in BUILTIN_BACKENDS:
    importlib.import_module(_name)
