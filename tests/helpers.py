"""What many test files build: a tiny ViT config, random images, and trees moved off their
init constants as if trained. Imported by name (`from helpers import cfg`): pytest puts this
folder on the path of the tests it collects."""
import jax
import jax.numpy as jnp
import numpy as np

from jlearngene.models import init, vit_config

TINY = dict(width=32, num_heads=2, mlp_dim=64, image_size=16, patch_size=4, num_classes=10,
            pool='avg')


def cfg(depth: int = 4, **fields):
    """A tiny ViT config: `TINY` at `depth` layers; `fields` override any field."""
    return vit_config('Ti', **{**TINY, 'depth': depth, **fields})


def images(n: int = 2, seed: int = 0, size: int = 8, channels: int = 3) -> jax.Array:
    """`n` NHWC images of `size` x `size` standard-normal pixels, drawn from `seed`."""
    return jax.random.normal(jax.random.key(seed), (n, size, size, channels))


def perturbed(tree, seed: int = 1):
    """Every leaf plus 0.1 x standard-normal noise from `seed`, as float32: off its init
    constants (zero biases, unit LayerNorm scales), as after training."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda x: jnp.asarray(np.asarray(x) + 0.1 * rng.standard_normal(np.shape(x)),
                                              jnp.float32), tree)


_init = jax.jit(init, static_argnums=0)


def trained_model(config, seed: int = 0):
    """A 'trained' model of `config`: its init from `seed`, perturbed with `seed + 1`."""
    return perturbed(_init(config, jax.random.key(seed)), seed + 1)


def cli_status(argv) -> int:
    """The exit status of `cli.main(argv)` in this process (argparse/absl exits included)."""
    from jlearngene import cli
    try:
        return cli.main(argv)
    except SystemExit as e:
        return e.code


def cli_error(capsys, argv, command: str, code: int = 1) -> str:
    """The one line `jlearngene <command>: ...` that `argv` prints on stderr (nothing on
    stdout, no traceback), with exit status `code`."""
    rc = cli_status(argv)
    captured = capsys.readouterr()
    lines = [ln for ln in captured.err.splitlines() if ln.strip()]
    assert rc == code, (rc, captured)
    assert captured.out == '', captured.out
    assert len(lines) == 1 and lines[0].startswith(f'jlearngene {command}: '), captured.err
    assert 'Traceback' not in captured.err
    return lines[0]


def write_fashion_files(folder, *, per_class: int = 30, test_per_class: int = 10, seed: int = 0):
    """Fashion-MNIST's four IDX files (uncompressed) with a learnable signal: class c is a
    bright horizontal band at rows 2c..2c+5 over uniform noise; returns `folder`."""
    from jlearngene.data import fashion
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (('train', per_class), ('test', test_per_class)):
        labels = np.arange(10 * n) % 10
        pixels = rng.integers(0, 120, (10 * n, 28, 28))
        for i, c in enumerate(labels):
            pixels[i, 2 * c:2 * c + 6] += 120
        for name, array, magic in ((fashion.FILES[split][0], pixels, 0x803),
                                   (fashion.FILES[split][1], labels, 0x801)):
            dims = b''.join(int(d).to_bytes(4, 'big') for d in array.shape)
            (folder / name).write_bytes(magic.to_bytes(4, 'big') + dims + array.astype(np.uint8).tobytes())
    return folder
