"""The build and loading of the CPU backend's C++ kernels, called through XLA's FFI.

The kernels (`weight_grad.cc`: a dense layer's weight gradient xᵀ·g, see `ops.cpu.dense`;
`attention.cc`: the attention core, see `ops.cpu.attention`) are compiled from the package's
`*.cc` sources (`SOURCES`, sharing `simd.h`) into one library with the C++ compiler (`$CXX`,
else g++, c++ or clang++) at first use, into `$JLEARNGENE_CACHE_DIR` (default
`~/.cache/jlearngene/kernels`), keyed by a hash of the sources, the compiler, its flags and
jaxlib; later processes load the built library. It is built for AVX-512 where the CPU has
it, else for AVX2 with FMA (other register tiles, same algorithms). `available()` says
whether it can be used; it is False, and the kernels' primitives lower to XLA's operations,
when the CPU has neither, no compiler is found, the build fails (logged once), or the
environment sets JLEARNGENE_CPU_KERNELS=0.
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

from jlearngene import ops

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
    """Whether the kernels can run here (builds and registers the library once)."""
    return ops.env_switch_on(ENV_SWITCH) and _registered()


def kernels_apply(dtypes, num_devices: int) -> bool:
    """Whether a lowering may call the kernels' FFI targets: float32 operands, one device (a
    program partitioned over several devices would gather the operands for a custom call),
    and the library `available()`."""
    return (num_devices == 1 and all(jnp.dtype(d) == jnp.float32 for d in dtypes)
            and available())


def ffi_applies(ctx) -> bool:
    """`kernels_apply` for a lowering context."""
    return kernels_apply([a.dtype for a in ctx.avals_in],
                         getattr(ctx.module_context.axis_context, 'num_devices', 1))


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
