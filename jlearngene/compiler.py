"""`jax.jit` with the XLA compiler options of the enabled `jlearngene.ops` backends.

`jit` is what the trainer, evaluation and the benchmarks compile through; on CPU the options
send the dots to oneDNN (`jlearngene.ops.cpu.onednn`), elsewhere there are none. Functions
jitted directly with `jax.jit` still work, with XLA's default kernels. The options follow
the backends' switches (JLEARNGENE_BACKENDS, `ops.use_reference()`, JLEARNGENE_CPU_ONEDNN).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import jax

from jlearngene import ops


def options() -> dict[str, Any]:
    """The compiler options for jax's default backend; a fresh dict, empty if none apply."""
    return ops.compiler_options()


def jit(fun: Callable, *, compiler_options: dict[str, Any] | None = None, **kwargs) -> Callable:
    """`jax.jit(fun, **kwargs)` compiled with `compiler_options` (default: `options()`)."""
    if compiler_options is None:
        compiler_options = options()
    return jax.jit(fun, compiler_options=compiler_options or None, **kwargs)


def options_key() -> tuple:
    """`options()` as a hashable key: caches of jitted functions include it, so that a change
    of options (a switch, a persistent cache configured later) compiles anew."""
    return tuple(sorted(options().items()))


# Programs that run once per config (initialisations) are compiled for compile time on CPU
# when they are small: XLA's backend optimisations cost seconds per random-draw site
# (threefry) and save milliseconds at these sizes. Measured 2026-12-01, AMD EPYC 2 cores
# (loaded): `vit.init` of width 48, depth 8 compiles in 16.6 s instead of 38.6 s and runs in
# 0.14 s instead of 0.006 s; at width 768 (86M parameters) the optimised program is faster
# in all.
RUN_ONCE_MAX_ELEMENTS = 2_000_000


def run_once_jit(fun: Callable, num_elements: Callable[..., int], **jit_kwargs) -> Callable:
    """`jax.jit(fun, **jit_kwargs)` for a program run once per static configuration: a
    top-level call whose output has at most `RUN_ONCE_MAX_ELEMENTS` values
    (`num_elements(*args, **kwargs)`, from the static arguments) compiles at XLA's lowest
    backend optimisation level on CPU; inside another trace (jit, eval_shape, grad) it is the
    plain jitted function. Values may differ from the optimised program's in the last bit."""
    full = jax.jit(fun, **jit_kwargs)
    quick = jax.jit(fun, compiler_options={'xla_backend_optimization_level': 0}, **jit_kwargs)

    @functools.wraps(fun)
    def call(*args, **kwargs):
        traced = any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((args, kwargs)))
        if (traced or jax.default_backend() != 'cpu'
                or num_elements(*args, **kwargs) > RUN_ONCE_MAX_ELEMENTS):
            return full(*args, **kwargs)
        try:
            return quick(*args, **kwargs)
        except ValueError as e:   # concrete arguments, but called inside another trace
            if 'top-level' not in str(e):
                raise
            return full(*args, **kwargs)
    return call
