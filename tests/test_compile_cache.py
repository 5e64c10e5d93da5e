"""jax's persistent compilation cache is the command's explicit choice: the experiment
harness never switches it, `commands.run.enable_compile_cache` does (for `jlearngene train`
when the experiment config sets compile_cache)."""
import os

import jax

from jlearngene.commands import run
from jlearngene.experiments import configs, harness


def test_the_harness_leaves_the_process_wide_cache_alone(tmp_path):
    before = jax.config.jax_compilation_cache_dir
    config = configs.load('tleg:digits')
    assert config.compile_cache
    harness.prepare(config, str(tmp_path / 'w'))
    assert jax.config.jax_compilation_cache_dir == before
    assert os.listdir(tmp_path / 'w') == []


def test_the_command_turns_it_on_once(tmp_path):
    if jax.config.jax_compilation_cache_dir:   # set from outside this process's tests
        assert not run.enable_compile_cache(str(tmp_path / 'c'))
        return
    assert run.enable_compile_cache(str(tmp_path / 'c'))
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / 'c')
    assert not run.enable_compile_cache(str(tmp_path / 'other'))   # already set: unchanged
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / 'c')


def test_harness_runs_of_one_shape_compile_their_step_once(tmp_path):
    """A study's runs of one loss and shape (other seeds, fresh loss and optimiser objects)
    share one compiled step through the compile key `harness.fit` builds; another learning
    rate is another optimiser, so another program."""
    import numpy as np

    from jlearngene.models import init, vit_config
    from jlearngene.train import tasks

    cfg = vit_config('Ti', width=16, num_heads=2, mlp_dim=32, depth=1, image_size=8,
                     patch_size=4, num_classes=2)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(16, 8, 8, 3)).astype(np.float32), rng.integers(0, 2, 16)

    class Dset:
        def train(self, seed):
            while True:
                yield {'image': x, 'label': y}

        def test(self):
            return iter([{'image': x, 'label': y}])

    traces = []

    def loss(cfg):
        inner = tasks.classification_loss(cfg)

        def loss_fn(params, batch, key):
            traces.append(1)
            return inner(params, batch, key)
        loss_fn.key = inner.key
        return loss_fn

    optim = {'weight_decay': 0.05}
    params = init(cfg, jax.random.key(0))
    for seed, lr in ((0, 1e-3), (1, 1e-3), (2, 2e-3)):
        harness.fit(f'r{seed}', loss(cfg), params, tasks.classification_eval(cfg), Dset(), steps=2,
                    lr=lr, optim=optim, workdir=str(tmp_path), seed=seed, eval_every=None)
        if seed == 1:
            assert len(traces) == 1
    assert len(traces) == 2
