"""XLA compiler options for the library's jitted functions, chosen per backend.

On CPU the dots go to oneDNN instead of XLA:CPU's default YNNPACK kernels: oneDNN's float32
GEMMs run the ViT's dense shapes about as fast as torch's MKL and faster than YNNPACK, they
take transposed operands natively, and their results are ordinary float32 products (no
reduced-precision accumulation). The measurements are in benchmarks/README.md.
XLA exposes this through experimental, per-compilation options, so `options()` first checks
that this jaxlib accepts them and really forms oneDNN fusions, and returns no options
otherwise. Setting the environment variable JLEARNGENE_CPU_ONEDNN=0 turns them off.

jax's persistent compilation cache cannot store programs with oneDNN fusions (jaxlib 0.10:
"ToProto is not implemented for thunk kind: onednn-fusion", a warning on every compile).
When a cache directory is configured (`jax_compilation_cache_dir`), `options()` therefore
leaves the CPU dots to XLA's defaults, which cache: a process that recompiles the same
programs (e.g. `experiments/tleg/run.py`, whose runs share programs across methods) gains
more from the cache than from the faster kernels.

`jit` is `jax.jit` with these options: the trainer, evaluation and the benchmarks compile
through it. Functions jitted directly with `jax.jit` still work, with XLA's default kernels.
"""
from __future__ import annotations

import functools
import logging
import os
import re
from typing import Any, Callable

import jax
import jax.numpy as jnp

log = logging.getLogger(__name__)

CPU_ONEDNN_OPTIONS = {
    'xla_cpu_use_onednn': True,
    'xla_cpu_experimental_onednn_fusion_type': 'LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT',
}
ENV_SWITCH = 'JLEARNGENE_CPU_ONEDNN'


def options() -> dict[str, Any]:
    """The compiler options for jax's default backend; a fresh dict, empty if none apply."""
    if jax.default_backend() != 'cpu':
        return {}
    if not env_switch_on(ENV_SWITCH) or jax.config.jax_compilation_cache_dir:
        return {}
    return dict(CPU_ONEDNN_OPTIONS) if _cpu_onednn_works() else {}


def env_switch_on(name: str) -> bool:
    """An on/off environment switch, on when unset: 0/1, false/true, no/yes, off/on."""
    value = os.environ.get(name, '1').strip().lower()
    if value not in ('0', '1', 'false', 'true', 'no', 'yes', 'off', 'on', ''):
        raise ValueError(f'{name}={value!r}: expected 0 or 1 (or false/true, no/yes, off/on)')
    return value not in ('0', 'false', 'no', 'off')


@functools.cache
def _cpu_onednn_works() -> bool:
    """Whether this jaxlib accepts the oneDNN options and routes a float32 dot to oneDNN."""
    a = jax.ShapeDtypeStruct((16, 16), jnp.float32)
    try:
        compiled = jax.jit(jnp.matmul).lower(a, a).compile(
            compiler_options=CPU_ONEDNN_OPTIONS)
    except Exception as e:  # an unknown option name or value in another jaxlib version
        log.info('oneDNN dots are not available in this jaxlib (%s); using XLA defaults', e)
        return False
    return uses_onednn(compiled.as_text())


def uses_onednn(hlo_text: str) -> bool:
    """Whether a compiled module's HLO text has a oneDNN fusion."""
    return re.search(r'^\s*(ROOT )?%onednn_fusion[.\w]* = ', hlo_text, re.MULTILINE) is not None


def jit(fun: Callable, *, compiler_options: dict[str, Any] | None = None, **kwargs) -> Callable:
    """`jax.jit(fun, **kwargs)` compiled with `compiler_options` (default: `options()`)."""
    if compiler_options is None:
        compiler_options = options()
    return jax.jit(fun, compiler_options=compiler_options or None, **kwargs)


def options_key() -> tuple:
    """`options()` as a hashable key: caches of jitted functions include it, so that a change
    of options (the environment switch, a persistent cache configured later) compiles anew."""
    return tuple(sorted(options().items()))
