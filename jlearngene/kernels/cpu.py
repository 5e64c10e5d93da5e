"""The dense layers' weight gradient xᵀ·g on CPU, in a C++ kernel called through XLA's FFI,
and the build of the package's C++ kernels (this one and `attention`'s).

Why: in the CPU training step XLA's oneDNN dots run the forward and input-gradient products
at about torch's speed, but the weight gradients (a contraction over every token of the
batch, both operands activations) at about half of it, because oneDNN transposes and
re-blocks both operands on every call. `weight_grad.cc` reads them in place; the numbers
are in benchmarks/README.md. The result is an ordinary float32 product (accumulated in
float32, by blocks of 256 tokens, 128 with AVX-512), not a reduced-precision one.

The kernels are compiled from the package's `*.cc` sources (`SOURCES`, sharing `simd.h`)
into one library with the C++ compiler (`$CXX`, else g++, c++ or clang++) at first use, into
`$JLEARNGENE_CACHE_DIR` (default `~/.cache/jlearngene/kernels`), keyed by a hash of the
sources, the compiler, its flags and jaxlib; later processes load the built library. It is
built for AVX-512 where the CPU has it, else for AVX2 with FMA (other register tiles, same
algorithms). `available()` says whether it can be used; it is False, and `weight_grad` is
XLA's product (and `attention` XLA's operations), when the CPU has neither, no compiler is
found, the build fails (logged once), or the environment sets JLEARNGENE_CPU_KERNELS=0.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile

import jax
import jax.numpy as jnp
from jax import core
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from jlearngene import compiler

log = logging.getLogger(__name__)

ENV_SWITCH = 'JLEARNGENE_CPU_KERNELS'
CACHE_ENV = 'JLEARNGENE_CACHE_DIR'
HERE = os.path.dirname(os.path.abspath(__file__))
# The library's sources (compiled together) and headers, and its FFI targets: name -> symbol.
SOURCES = tuple(os.path.join(HERE, f) for f in ('weight_grad.cc', 'attention.cc'))
HEADERS = (os.path.join(HERE, 'simd.h'),)
TARGET = 'jlearngene_weight_grad'
TARGETS = {TARGET: 'JlearngeneWeightGrad',
           'jlearngene_attention_fwd': 'JlearngeneAttentionForward',
           'jlearngene_attention_bwd': 'JlearngeneAttentionBackward'}
CXXFLAGS = ('-O3', '-std=c++17', '-fPIC', '-shared', '-w')
# The kernel's instruction sets, best first: name -> (CPU flags that must all be present,
# compiler flags). The source picks its register tile from the compiler's flags.
ISAS = {'avx512': (('avx512f',), ('-mavx512f', '-mfma')),
        'avx2': (('avx2', 'fma'), ('-mavx2', '-mfma'))}


def available() -> bool:
    """Whether `weight_grad` runs the compiled kernel (builds and registers it once)."""
    return compiler.env_switch_on(ENV_SWITCH) and _registered()


def matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    """x @ w for x (K, M), w (M, N), as a primitive whose derivative with respect to w is
    `weight_grad` (the kernel on CPU) and with respect to x is `input_grad`. Forward and
    reverse mode, their compositions and vmap all work."""
    _check_2d('matmul', x, w, 1, 0)
    return _matmul_p.bind(x, w)


def weight_grad(x: jax.Array, g: jax.Array) -> jax.Array:
    """xᵀ·g for x (K, M) and g (K, N): the compiled kernel when lowered for one CPU device
    with float32 operands and `available()`, else XLA's product (see `_xla_weight_grad`)."""
    _check_2d('weight_grad', x, g, 0, 0)
    return _weight_grad_p.bind(x, g)


def input_grad(g: jax.Array, w: jax.Array) -> jax.Array:
    """g·wᵀ, the input gradient of x @ w. oneDNN (`compiler.options()`) reads wᵀ in place;
    XLA's default CPU kernels are slow with a transposed operand, so without the options
    wᵀ is first written out row-major."""
    return g @ (w.T if compiler.options() else _materialised_t(w))


def _check_2d(name, a, b, axis_a, axis_b):
    if a.ndim != 2 or b.ndim != 2 or a.shape[axis_a] != b.shape[axis_b]:
        raise ValueError(f'{name}: incompatible operands {a.shape} and {b.shape}')


def _materialised_t(a: jax.Array) -> jax.Array:
    """`a.T` as a real row-major copy: the barrier stops XLA from folding the transpose
    back into the consuming dot as a transposed operand."""
    return jax.lax.optimization_barrier(a.T)


def _xla_weight_grad(x: jax.Array, g: jax.Array) -> jax.Array:
    # Without oneDNN, YNNPACK is fast only with row-major operands; transposing x pays when
    # it is the narrower operand.
    if compiler.options() or x.shape[1] > g.shape[1]:
        return x.T @ g
    return _materialised_t(x) @ g


def _product(x: jax.Array, w: jax.Array) -> jax.Array:
    return x @ w


_matmul_p = Primitive('jlearngene_matmul')
_matmul_p.def_impl(_product)
_matmul_p.def_abstract_eval(
    lambda x, w: core.ShapedArray((x.shape[0], w.shape[1]), jnp.result_type(x, w)))
mlir.register_lowering(_matmul_p, mlir.lower_fun(_product, multiple_results=False))
# x @ w is bilinear: the cotangent of x is ct·wᵀ, that of w is xᵀ·ct.
ad.defbilinear(_matmul_p, lambda ct, x, w: input_grad(ct, w), lambda ct, x, w: weight_grad(x, ct))

_weight_grad_p = Primitive('jlearngene_weight_grad')
_weight_grad_p.def_impl(lambda x, g: _xla_weight_grad(x, g))
_weight_grad_p.def_abstract_eval(
    lambda x, g: core.ShapedArray((x.shape[1], g.shape[1]), jnp.result_type(x, g)))
mlir.register_lowering(_weight_grad_p, mlir.lower_fun(_xla_weight_grad, multiple_results=False))
# xᵀ·g is bilinear: the cotangent of x is g·ctᵀ, that of g is x·ct.
ad.defbilinear(_weight_grad_p, lambda ct, x, g: g @ ct.T, lambda ct, x, g: matmul(x, ct))


def _batched(fn):
    """vmap rule: the plain XLA product, with the batch axis moved to the front."""
    def rule(args, dims):
        return jax.vmap(fn, in_axes=tuple(dims))(*args), 0   # dims: None where not batched
    return rule


batching.primitive_batchers[_matmul_p] = _batched(_product)
batching.primitive_batchers[_weight_grad_p] = _batched(lambda x, g: x.T @ g)


def ffi_applies(ctx) -> bool:
    """Whether a lowering may call the kernels' FFI targets: float32 operands, one device (a
    program partitioned over several devices would gather the operands for a custom call),
    and the library `available()`."""
    one_device = getattr(ctx.module_context.axis_context, 'num_devices', 1) == 1
    f32 = all(a.dtype == jnp.float32 for a in ctx.avals_in)
    return one_device and f32 and available()


def _cpu_weight_grad_lowering(ctx, x, g):
    """The kernel's FFI call where it applies (`ffi_applies`), else XLA's product."""
    if ffi_applies(ctx):
        return jax.ffi.ffi_lowering(TARGET)(ctx, x, g)
    return mlir.lower_fun(_xla_weight_grad, multiple_results=False)(ctx, x, g)


mlir.register_lowering(_weight_grad_p, _cpu_weight_grad_lowering, platform='cpu')


@functools.cache
def _registered() -> bool:
    path = _build()
    if path is None:
        return False
    try:
        library = ctypes.CDLL(path)
    except OSError as e:  # a damaged file in the cache: build it again, once
        log.warning('jlearngene CPU kernels: cannot load %s (%s); rebuilding it', path, e)
        os.remove(path)
        path = _build()
        if path is None:
            return False
        library = ctypes.CDLL(path)
    for name, symbol in TARGETS.items():
        jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(library, symbol)),
                                    platform='cpu')
    return True


def _build(isa: str | None = None) -> str | None:
    """The built library's path (building it if needed), or None where it cannot be used.
    `isa` (a key of `ISAS`) builds for that instruction set instead of this CPU's best: the
    library is then only for loading on a CPU that has it."""
    isa = isa or instruction_set()
    if isa is None:
        log.info('jlearngene CPU kernels: this CPU has neither AVX-512 nor AVX2 with FMA; '
                 'using XLA products')
        return None
    cxx = compiler_command()
    if cxx is None:
        log.warning('jlearngene CPU kernels: no C++ compiler found (set CXX); using XLA products')
        return None
    texts = []
    for path in (*SOURCES, *HEADERS):
        with open(path, 'rb') as f:
            texts.append(f.read())
    import jaxlib
    flags = (*CXXFLAGS, *ISAS[isa][1])
    key = hashlib.sha256(b'\0'.join([*texts, cxx.encode(), jaxlib.__version__.encode(),
                                     ' '.join(flags).encode()])).hexdigest()[:16]
    cache = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser('~'), '.cache',
                                                      'jlearngene', 'kernels')
    path = os.path.join(cache, f'kernels-{key}.so')
    if os.path.exists(path):
        return path
    cmd = [cxx, *flags, '-I', jax.ffi.include_dir(), *SOURCES, '-o']
    tmp = None
    try:
        os.makedirs(cache, exist_ok=True)
        # Build under a temporary name, then rename: no process loads a partial file.
        fd, tmp = tempfile.mkstemp(suffix='.so', dir=cache)
        os.close(fd)
        subprocess.run([*cmd, tmp], check=True, capture_output=True, text=True, timeout=300)
        os.replace(tmp, path)
    except (OSError, subprocess.SubprocessError) as e:
        detail = getattr(e, 'stderr', None) or str(e)
        log.warning('jlearngene CPU kernels: building %s into %s failed, using XLA products '
                    '(set %s to another directory, or %s=0):\n%s\n%s', ' '.join(SOURCES), cache,
                    CACHE_ENV, ENV_SWITCH, ' '.join(cmd), detail[-2000:])
        if tmp is not None and os.path.exists(tmp):
            os.remove(tmp)
        return None
    return path


def compiler_command() -> str | None:
    """The C++ compiler the kernel is built with: `$CXX`, else the first of g++, c++ and
    clang++ on the PATH; None when there is none."""
    return os.environ.get('CXX') or next(
        (c for c in ('g++', 'c++', 'clang++') if shutil.which(c)), None)


def instruction_set() -> str | None:
    """The best instruction set in `ISAS` this CPU has ('avx512', 'avx2'), or None."""
    if platform.machine().lower() not in ('x86_64', 'amd64'):
        return None
    cpu_flags = set((cpuinfo('flags') or '').split())
    return next((name for name, (needed, _) in ISAS.items() if cpu_flags.issuperset(needed)), None)


def cpuinfo(field: str) -> str | None:
    """The value of a field of the first CPU in /proc/cpuinfo ('flags', 'model name'), or
    None where there is no such file or field."""
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                name, sep, value = line.partition(':')
                if sep and name.strip() == field:
                    return value.strip()
    except OSError:
        pass
    return None
