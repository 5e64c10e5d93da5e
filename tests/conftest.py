"""Test setup: 8 fake CPU devices (before any backend starts) and tiny configs."""
import os

os.environ.setdefault('XLA_FLAGS', '')
if '--xla_force_host_platform_device_count' not in os.environ['XLA_FLAGS']:
    os.environ['XLA_FLAGS'] += ' --xla_force_host_platform_device_count=8'

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update('jax_num_cpu_devices', 8)

from jlearngene.models import vit_config  # noqa: E402


@pytest.fixture
def tiny_cfg():
    """Width 32, 2 heads, depth 3, 16 px images in 4 px patches, 10 classes."""
    return vit_config('Ti', width=32, num_heads=2, mlp_dim=64, depth=3, image_size=16,
                      patch_size=4, num_classes=10)


@pytest.fixture
def no_persistent_cache():
    """Other tests in this process may have configured jax's persistent compilation cache,
    which turns `jlearngene.compiler`'s oneDNN options off."""
    old = jax.config.jax_compilation_cache_dir
    _set_compilation_cache(None)
    yield
    _set_compilation_cache(old)


def _set_compilation_cache(path):
    """Point jax's persistent compilation cache at `path` (None: off); jax reads the
    directory once per process unless the cache is reset."""
    from jax.experimental.compilation_cache import compilation_cache
    jax.config.update('jax_compilation_cache_dir', path)
    compilation_cache.reset_cache()


@pytest.fixture(autouse=True)
def _compilation_cache_per_test():
    """A test that turns the persistent compilation cache on (an experiment's run does, in
    its workdir) leaves it as it found it for the next test."""
    before = jax.config.jax_compilation_cache_dir
    yield
    if jax.config.jax_compilation_cache_dir != before:
        _set_compilation_cache(before)


@pytest.fixture(scope='module')
def fast_compile():
    """Tiny programs: XLA optimisation passes cost more than they save. Opt in per module
    with `pytestmark = pytest.mark.usefixtures('fast_compile')`."""
    old = jax.config.values['jax_disable_most_optimizations']
    jax.config.update('jax_disable_most_optimizations', True)
    yield
    jax.config.update('jax_disable_most_optimizations', old)


@pytest.fixture(params=['on', 'reference'])
def backends(request):
    """Runs a test twice: with the `jlearngene.ops` backends on ('on') and with the reference
    implementation only ('reference')."""
    from jlearngene import ops
    if request.param == 'reference':
        with ops.use_reference():
            yield request.param
    else:
        yield request.param
