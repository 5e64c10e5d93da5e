"""`jax.jit` with the XLA compiler options of the enabled `jlearngene.ops` backends.

`jit` is what the trainer, evaluation and the benchmarks compile through; on CPU the options
send the dots to oneDNN (`jlearngene.ops.cpu.onednn`), elsewhere there are none. Functions
jitted directly with `jax.jit` still work, with XLA's default kernels. The options follow
the backends' switches (JLEARNGENE_BACKENDS, `ops.use_reference()`, JLEARNGENE_CPU_ONEDNN).
"""
from __future__ import annotations

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
