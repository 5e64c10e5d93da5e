"""Test setup: 8 fake CPU devices (before any backend starts), fast compilation, tiny
configs, and a guard that fails any test during which asyncio reports an error (the
"Task exception was never retrieved" debris of an abandoned read)."""
import gc
import logging
import os

# Tiny programs: XLA's optimisation passes cost more than they save. The whole run (and the
# subprocesses it starts, through the environment) compiles fast; a test that needs the
# optimised pipeline opts in with the `optimized_compile` fixture. XLA:CPU's MLIR fusion
# emitters take about twice as long to compile a small training step as its classic
# emitters, so the tests use the classic ones (the default tier's time nearly halves).
os.environ.setdefault('JAX_DISABLE_MOST_OPTIMIZATIONS', '1')
os.environ.setdefault('XLA_FLAGS', '')
for _flag in ('--xla_force_host_platform_device_count=8', '--xla_cpu_use_fusion_emitters=false'):
    if _flag.split('=')[0] not in os.environ['XLA_FLAGS']:
        os.environ['XLA_FLAGS'] += ' ' + _flag

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update('jax_num_cpu_devices', 8)

from jlearngene.models import vit_config  # noqa: E402


class _AsyncioErrors(logging.Handler):
    """Keeps the asyncio logger's ERROR records (unretrieved task exceptions, failed
    callbacks), which would otherwise be printed during or after the run."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record):
        self.records.append(record.getMessage())

    def check(self, when: str) -> None:
        records, self.records = self.records, []
        assert not records, f'asyncio reported errors {when}: {records}'


_ASYNCIO_ERRORS = _AsyncioErrors()
logging.getLogger('asyncio').addHandler(_ASYNCIO_ERRORS)


@pytest.fixture(autouse=True)
def _no_asyncio_errors():
    """A test fails if asyncio reports an error during it. A young-generation collection at
    its end (cheap; a full one per test costs minutes) finalises the tasks it abandoned, so
    the report falls on this test; older garbage is collected by `_no_asyncio_errors_at_exit`."""
    yield
    gc.collect(1)
    _ASYNCIO_ERRORS.check('during this test')


@pytest.fixture(scope='session', autouse=True)
def _no_asyncio_errors_at_exit():
    """After the last test: a full collection, and an error if asyncio reports one then."""
    yield
    gc.collect()
    _ASYNCIO_ERRORS.check('at the end of the session')


@pytest.fixture
def tiny_cfg():
    """Width 32, 2 heads, depth 3, 16 px images in 4 px patches, 10 classes."""
    return vit_config('Ti', width=32, num_heads=2, mlp_dim=64, depth=3, image_size=16,
                      patch_size=4, num_classes=10)


def _set_compilation_cache(path):
    """Point jax's persistent compilation cache at `path` (None: off); jax reads the
    directory once per process unless the cache is reset."""
    from jax.experimental.compilation_cache import compilation_cache
    jax.config.update('jax_compilation_cache_dir', path)
    compilation_cache.reset_cache()


@pytest.fixture(autouse=True)
def _compilation_cache_per_test():
    """A test that turns the persistent compilation cache on (`jlearngene train` does for an
    experiment config with compile_cache set, in its workdir) leaves it as it found it for
    the next test."""
    before = jax.config.jax_compilation_cache_dir
    yield
    if jax.config.jax_compilation_cache_dir != before:
        _set_compilation_cache(before)


@pytest.fixture
def optimized_compile():
    """XLA's full optimisation pipeline for one test (the run's default is fast compilation):
    for tests of what the optimised program does (precision, fusion-dependent speed paths)."""
    old = jax.config.values['jax_disable_most_optimizations']
    jax.config.update('jax_disable_most_optimizations', False)
    yield
    jax.config.update('jax_disable_most_optimizations', old)
