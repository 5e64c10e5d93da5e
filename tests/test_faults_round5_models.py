"""Round-5 faults in the ViT model: the distillation token's position, and embed's error message."""
import re

import jax
import numpy as np
import pytest

from jlearngene.models import apply, init
from jlearngene.models.vit import embed


def _np_ln(x, p, eps):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / np.sqrt(v + eps) * p['scale'] + p['bias']


def _randomise(params, key):
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(key, len(leaves))
    return jax.tree.unflatten(tree, [0.5 * jax.random.normal(k, a.shape, a.dtype) for k, a in zip(keys, leaves)])


@pytest.mark.parametrize('class_token,dist_pos', [(False, 0), (True, 1)])
def test_dist_head_reads_the_distillation_token(tiny_cfg, class_token, dist_pos):
    cfg = tiny_cfg.replace(pool='avg', class_token=class_token, distill_token=True)
    p = _randomise(init(cfg, jax.random.key(0)), jax.random.key(1))
    assert ('cls_token' in p) == class_token and 'dist_token' in p
    x = jax.random.normal(jax.random.key(2), (2, 16, 16, 3))
    _, aux = apply(p, x, cfg, capture=('blocks',))
    last = np.asarray(aux['blocks'][-1], np.float64)
    q = jax.tree.map(lambda a: np.asarray(a, np.float64), p)
    want = _np_ln(last[:, dist_pos], q['norm'], cfg.ln_eps) @ q['head_dist']['kernel'] + q['head_dist']['bias']
    np.testing.assert_allclose(aux['logits_dist'], want, rtol=1e-4, atol=1e-4)


def test_embed_error_counts_patches_without_prefix_tokens(tiny_cfg):
    cfg = tiny_cfg.replace(distill_token=True)  # class and distillation tokens, 16 + 2 positions
    p = init(cfg, jax.random.key(0))
    images = np.zeros((1, 12, 12, 3), np.float32)  # 3x3 = 9 patches of 4 px
    with pytest.raises(ValueError, match=re.escape('gives 11 tokens (9 patches of 12x12 images)')):
        embed(p, images, cfg)


@pytest.mark.parametrize('class_token', [False, True])
def test_scala_masked_apply_reads_the_distillation_token_where_apply_does(tiny_cfg, class_token):
    """Scala's masked forward pass read the distillation token at position 1 whatever the
    class token; at full width it now gives `apply`'s distillation logits."""
    from jlearngene.genes import scala
    cfg = tiny_cfg.replace(pool='avg', class_token=class_token, distill_token=True)
    p = _randomise(init(cfg, jax.random.key(0)), jax.random.key(1))
    x = jax.random.normal(jax.random.key(2), (2, 16, 16, 3))
    _, want = apply(p, x, cfg)
    _, got = scala.masked_apply(p, x, cfg, scala.unit_masks(cfg, 1.0))
    np.testing.assert_allclose(got['logits_dist'], want['logits_dist'], rtol=1e-4, atol=1e-4)
