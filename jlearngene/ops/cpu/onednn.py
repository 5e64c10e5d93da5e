"""The CPU backend's XLA compiler options: the dots go to oneDNN.

oneDNN's float32 GEMMs run the ViT's dense shapes about as fast as torch's MKL and faster
than XLA:CPU's default YNNPACK kernels, they take transposed operands natively, and their
results are ordinary float32 products (no reduced-precision accumulation); measurements in
benchmarks/README.md. XLA exposes this through experimental, per-compilation options, so
`options()` first checks that this jaxlib accepts them and really forms oneDNN fusions, and
returns no options otherwise.

They are opt-in, JLEARNGENE_CPU_ONEDNN=1: XLA marks the oneDNN fusion experimental, and
processes that ran its programs while tracing others have aborted during the trace (this
project's test suite on 2-core AMD EPYC machines; the C++ kernels, built with
AddressSanitizer, ran the same tests clean). Without them the CPU dots are XLA's default
kernels: a float32 matmul peak of 130 instead of 150 GFLOP/s on that machine
(benchmarks/README.md).

jax's persistent compilation cache cannot store programs with oneDNN fusions (jaxlib 0.10:
"ToProto is not implemented for thunk kind: onednn-fusion", a warning on every compile).
When a cache directory is configured (`jax_compilation_cache_dir`), `options()` therefore
leaves the CPU dots to XLA's defaults, which cache: a process that recompiles the same
programs gains more from the cache than from the faster kernels.
"""
from __future__ import annotations

import functools
import logging
import re
from typing import Any

import jax
import jax.numpy as jnp

from jlearngene import ops

log = logging.getLogger(__name__)

OPTIONS = {
    'xla_cpu_use_onednn': True,
    'xla_cpu_experimental_onednn_fusion_type': 'LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT',
}
ENV_SWITCH = 'JLEARNGENE_CPU_ONEDNN'


def options() -> dict[str, Any]:
    """The oneDNN options where they apply (a fresh dict), else an empty one."""
    if jax.default_backend() != 'cpu':
        return {}
    if not ops.env_switch_on(ENV_SWITCH, default=False) or jax.config.jax_compilation_cache_dir:
        return {}
    return dict(OPTIONS) if _works() else {}


@functools.cache
def _works() -> bool:
    """Whether this jaxlib accepts the options and routes a float32 dot to oneDNN."""
    a = jax.ShapeDtypeStruct((16, 16), jnp.float32)
    try:
        compiled = jax.jit(jnp.matmul).lower(a, a).compile(compiler_options=OPTIONS)
    except Exception as e:  # an unknown option name or value in another jaxlib version
        log.info('oneDNN dots are not available in this jaxlib (%s); using XLA defaults', e)
        return False
    return uses_onednn(compiled.as_text())


def uses_onednn(hlo_text: str) -> bool:
    """Whether a compiled module's HLO text has a oneDNN fusion."""
    return re.search(r'^\s*(ROOT )?%onednn_fusion[.\w]* = ', hlo_text, re.MULTILINE) is not None
