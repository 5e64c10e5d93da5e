"""Losses against values computed by hand in numpy."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jlearngene import losses

RNG = np.random.default_rng(0)
S = RNG.normal(size=(4, 5)).astype(np.float32)       # student logits
T = 2 * RNG.normal(size=(4, 5)).astype(np.float32)   # teacher logits
Y = np.array([0, 3, 1, 4])


def np_log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def np_ce(z, y, ls=0.0):
    k = z.shape[-1]
    t = np.eye(k)[y] * (1 - ls) + ls / k
    return -(t * np_log_softmax(z)).sum(-1).mean()


def np_kl(s, t, tau):
    pt = np.exp(np_log_softmax(t / tau))
    return (pt * (np_log_softmax(t / tau) - np_log_softmax(s / tau))).sum(-1)


class LossTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_cross_entropy(self):
        for ls in (0.0, 0.1):
            got = self.variant(lambda s, y, ls=ls: losses.cross_entropy(s, y, label_smoothing=ls))(S, Y)
            np.testing.assert_allclose(got, np_ce(S, Y, ls), rtol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_soft_targets_and_mask(self):
        soft = np.eye(5)[Y] * 0.7 + np.eye(5)[(Y + 1) % 5] * 0.3
        got = self.variant(losses.cross_entropy)(S, soft.astype(np.float32))
        want = -(soft * np_log_softmax(S)).sum(-1).mean()
        np.testing.assert_allclose(got, want, rtol=1e-5)
        mask = np.array([1, 1, 0, 0], bool)
        got = self.variant(lambda s, y, m: losses.cross_entropy(s, y, mask=m))(S, Y, mask)
        np.testing.assert_allclose(got, np_ce(S[:2], Y[:2]), rtol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_soft_distillation(self):
        tau, alpha = 2.0, 0.3
        fn = self.variant(lambda s, t, y: losses.soft_distillation(s, t, y, tau=tau, alpha=alpha))
        want = (1 - alpha) * np_ce(S, Y) + alpha * tau ** 2 * np_kl(S, T, tau).mean()
        np.testing.assert_allclose(fn(S, T, Y), want, rtol=1e-5)
        # DeiT legacy: tau^2 * sum over batch and classes / (batch * classes)
        legacy = self.variant(lambda s, t: losses.soft_distillation(
            s, t, None, tau=tau, alpha=1.0, legacy_deit_normalisation=True))(S, T)
        pt = np.exp(np_log_softmax(T / tau))
        elementwise = pt * (np_log_softmax(T / tau) - np_log_softmax(S / tau))
        np.testing.assert_allclose(legacy, tau ** 2 * elementwise.sum() / S.size, rtol=1e-5)

    @chex.variants(with_jit=True, without_jit=True)
    def test_hard_distillation(self):
        got = self.variant(lambda s, t, y: losses.hard_distillation(s, t, y, alpha=0.5))(S, T, Y)
        want = 0.5 * np_ce(S, Y) + 0.5 * np_ce(S, T.argmax(-1))
        np.testing.assert_allclose(got, want, rtol=1e-5)
        dist = S[::-1].copy()
        got = self.variant(lambda s, t, y, d: losses.hard_distillation(s, t, y, student_dist_logits=d))(S, T, Y, dist)
        np.testing.assert_allclose(got, 0.5 * np_ce(S, Y) + 0.5 * np_ce(dist, T.argmax(-1)), rtol=1e-5)


def test_kl_zero_and_teacher_gets_no_gradient():
    np.testing.assert_allclose(losses.kl_per_example(T, T, tau=3.0), 0.0, atol=1e-6)
    g = jax.grad(lambda t: losses.soft_distillation(jnp.asarray(S), t, None, alpha=1.0))(jnp.asarray(T))
    np.testing.assert_array_equal(g, 0.0)


def test_accuracy_and_errors():
    assert float(losses.accuracy(S, S.argmax(-1))) == 1.0
    with pytest.raises(ValueError, match='alpha=0.5.*labels'):
        losses.soft_distillation(S, T, None, alpha=0.5)
    with pytest.raises(ValueError, match='3 classes.*logits'):
        losses.cross_entropy(S, np.ones((4, 3), np.float32))
