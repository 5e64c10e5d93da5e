"""The training step and the compiled programs that run it.

`make_train_step(loss_fn, optimizer, ...)` is the pure step `(state, batch, rng) -> (state,
metrics)` on the train state of `train.state`. Its randomness is `fold_in(rng, step)`, so a
resumed run draws the same keys as an uninterrupted one. It can accumulate the gradient
over `microbatches` parts of the batch, and run `steps_per_call` steps in one compiled call
(on CPU by default) with the same steps, keys and per-step metrics as one step per call.

`StepProgram` holds the jitted calls of one run (state donated, batches sharded over the
'data' mesh axis); `steps_in_call` says how many steps the next call runs. `PROGRAMS` (a
`ProgramCache`) shares compiled programs between runs that declare equal keys.
"""
from __future__ import annotations

import collections
import math
from typing import Any
from collections.abc import Callable, Hashable, Iterable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jlearngene import compiler, parallel
from jlearngene.train.optim import current_lr


LossFn = Callable[[Any, Mapping[str, jax.Array], jax.Array], tuple[jax.Array, Mapping[str, jax.Array]]]


def make_train_step(loss_fn: LossFn, optimizer: optax.GradientTransformation, *,
                    microbatches: int = 1, steps_per_call: int = 1) -> Callable:
    """The pure step `(state, batch, rng) -> (state, metrics)`; `fit` jits it with donation.

    `rng` is the run's base key data (uint32); the step folds in `state['step']`.
    Metrics: the loss, `loss_fn`'s metrics, the gradient's global norm and, when the
    optimiser injects it, the learning rate used for this step.

    `microbatches` > 1 accumulates the gradient over that many equal parts of the batch (a
    `lax.scan`) before the one optimiser update: activation memory shrinks by the factor,
    and on CPU the smaller working set is often faster. The loss, metrics and gradient are
    the means over the parts, which equal the whole batch's when `loss_fn` returns unweighted
    means over examples (as the classification and distillation losses do); the update then
    differs from the one-pass update only by float rounding. Part i takes rows i, i+n,
    i+2n, ... of the batch, so a batch sharded over devices stays evenly spread, and draws
    the key `fold_in(step key, i)` (so dropout masks differ from the one-pass step's).

    `steps_per_call` > 1 returns `steps_per_call` consecutive steps as one function (a
    `lax.scan` over the step): its batch has a leading axis of that size (entry i feeds step
    i) and so do its metrics. The steps are the one-step function's, in order, with the
    same keys. One call of several steps pays the per-call costs once: dispatch, and on
    CPU the fresh, page-faulted temporary buffer that XLA:CPU allocates for every call.

    Args:
        loss_fn: `loss_fn(params, batch, key) -> (loss, metrics)`, a scalar loss and a dict of
          scalar metrics.
        optimizer: the optax transformation that updates `state['params']`.
        microbatches: parts the batch is split into for gradient accumulation; 1 (default):
          one pass. Each batch entry's leading size must be a multiple of it.
        steps_per_call: steps the returned function runs per call; 1 (default): one.

    Returns:
        The step function. With `steps_per_call` > 1 its batch entries and metrics have a
        leading axis of size `steps_per_call`; metrics are float32.

    Raises:
        ValueError: `microbatches` or `steps_per_call` is not a positive integer
          (`check_microbatches`, `check_steps_per_call`). When traced, the step raises one
          where a batch entry's leading size is not a multiple of `microbatches` (or not
          `steps_per_call`), or an entry is a scalar.
    """
    check_microbatches(microbatches)
    check_steps_per_call(steps_per_call)
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    if microbatches > 1:
        grad_fn = _accumulated(grad_fn, microbatches)

    def step(state, batch, rng):
        key = jax.random.fold_in(jax.random.wrap_key_data(rng), state['step'])
        (loss, aux), grads = grad_fn(state['params'], batch, key)
        updates, opt_state = optimizer.update(grads, state['opt_state'], state['params'])
        lr = current_lr(opt_state)  # injected hyperparameters are set during the update
        params = optax.apply_updates(state['params'], updates)
        out = {'loss': loss, **aux, 'grad_norm': optax.tree.norm(grads)}
        if lr is not None:
            out['lr'] = lr
        new_state = {'params': params, 'opt_state': opt_state, 'step': state['step'] + 1,
                     'rng': state['rng']}
        return new_state, {k: jnp.asarray(v, jnp.float32) for k, v in out.items()}
    if steps_per_call == 1:
        return step

    def steps(state, batches, rng):
        _check_leading_axis(batches, lambda n: n == steps_per_call, 'leading size {}',
                            f'steps_per_call={steps_per_call} needs batches stacked on a '
                            'leading axis of that size')
        return jax.lax.scan(lambda s, batch: step(s, batch, rng), state, batches)
    return steps


def _check_leading_axis(batch, fits: Callable[[int], bool], size: str, problem: str) -> None:
    """ValueError `problem: <entry> has <size>` for the first leaf of `batch` whose leading
    axis does not `fit` (or that is a scalar); `size` formats the leading size."""
    for path, x in jax.tree.leaves_with_path(batch):
        if jnp.ndim(x) == 0 or not fits(x.shape[0]):
            have = 'a scalar' if jnp.ndim(x) == 0 else size.format(x.shape[0])
            raise ValueError(f'{problem}: {jax.tree_util.keystr(path)} has {have}')


def _accumulated(grad_fn: Callable, n: int) -> Callable:
    """`grad_fn` averaged over `n` strided parts of the batch, one part at a time."""
    def mean_grad(params, batch, key):
        _check_leading_axis(batch, lambda rows: rows % n == 0, '{} rows',
                            f'microbatches={n} does not divide the batch')
        # (B, ...) -> (B/n, n, ...): part i is [:, i], a slice that stays on each device.
        parts = jax.tree.map(lambda x: x.reshape(x.shape[0] // n, n, *x.shape[1:]), batch)

        def body(total, i):
            part = jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, i, 1, keepdims=False), parts)
            out = grad_fn(params, part, jax.random.fold_in(key, i))
            return jax.tree.map(jnp.add, total, out), None

        first = jax.tree.map(lambda x: x[:, 0], parts)
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                             jax.eval_shape(grad_fn, params, first, key))
        total, _ = jax.lax.scan(body, zeros, jnp.arange(n))
        return jax.tree.map(lambda t: t / n, total)
    return mean_grad


def check_int(name: str, n, minimum: int, *, optional: bool = False) -> None:
    """Check that `n` is an integer >= `minimum` (or, when `optional`, None).

    Args:
        name: the value's name, for the message.
        n: the value; a bool is not an integer here.
        minimum: the least value allowed (1: positive, 0: non-negative).
        optional: whether `None` is allowed.

    Raises:
        ValueError: `n` is not such an integer.
    """
    if (n is not None or not optional) and (
            not isinstance(n, int) or isinstance(n, bool) or n < minimum):
        kind = 'a positive' if minimum else 'a non-negative'
        raise ValueError(f'{name} must be {kind} integer, got {n!r}')


def check_microbatches(n) -> None:
    """Raise a ValueError unless `n` is a positive integer (a `microbatches` value).

    Args:
        n: the value to check.

    Raises:
        ValueError: `n` is not a positive integer (`check_int`).
    """
    check_int('microbatches', n, 1)


def check_steps_per_call(n) -> None:
    """Raise a ValueError unless `n` is a positive integer (a `steps_per_call` value).

    Args:
        n: the value to check.

    Raises:
        ValueError: `n` is not a positive integer (`check_int`).
    """
    check_int('steps_per_call', n, 1)


# The largest number of steps `fit(steps_per_call='auto')` runs in one call on CPU: beyond
# it the per-call costs are already small next to the steps (Ti-12 batch 128: 250k page
# faults per call).
AUTO_STEPS_PER_CALL_MAX = 8


def auto_steps_per_call(platform: str, intervals: Iterable[int] = ()) -> int:
    """`fit(steps_per_call='auto')`: the steps per call on `platform`.

    On CPU, the largest K <= `AUTO_STEPS_PER_CALL_MAX` that divides every interval given, so
    one compiled program serves the whole run and its resumes; 1 elsewhere, where it has not
    been measured.

    Args:
        platform: the jax platform name ('cpu', 'gpu', 'tpu').
        intervals: step counts K must divide (fit passes its log, eval and checkpoint
          intervals and its total steps); zeros and none at all restrict nothing.

    Returns:
        K, at least 1.
    """
    if platform != 'cpu':
        return 1
    common = math.gcd(*(int(every) for every in intervals))   # 0 (no interval): any K divides
    return max(k for k in range(1, AUTO_STEPS_PER_CALL_MAX + 1) if common % k == 0)


def steps_in_call(step: int, steps: int, steps_per_call: int, events: Iterable[int]) -> int:
    """How many steps the call starting after `step` runs.

    Args:
        step: the steps done so far.
        steps: the run's total steps.
        steps_per_call: the steps a call runs where nothing is in the way.
        events: the positive intervals (log, eval, checkpoint) whose multiples must end a call.

    Returns:
        `steps_per_call`, unless a multiple of an interval in `events` would fall inside the
        call (before its last step) or the call would pass `steps`; then 1, so those steps
        see the state.
    """
    n = steps_per_call
    fits = step + n <= steps and not any((step // e + 1) * e < step + n for e in events)
    return n if fits else 1


# ----------------------------------------------------------------------------------------
# The jitted calls.

# Compiled programs shared between runs, by an explicit key (see `ProgramCache`).
CacheKey = Hashable


class ProgramCache:
    """Jitted programs by an explicit, hashable key, so runs that declare equal keys (a
    study's many runs of one shape) compile once: jax's own cache then serves every call
    of equal shapes and dtypes. The key names what the program computes (e.g. the loss's
    and optimiser's configs, `FitConfig.compile_key`) and how it is laid out (shardings,
    steps per call); a None key caches nothing. The newest `size` programs are kept."""

    def __init__(self, size: int = 32):
        self.size = size
        self._programs: collections.OrderedDict = collections.OrderedDict()

    def get(self, key: CacheKey | None, build: Callable[[], Callable]) -> Callable:
        """The program cached under `key`, else a new one.

        Args:
            key: the program's key (`keyed`); `None`: build without caching.
            build: makes the program; called only on a miss.

        Returns:
            The cached program, else `build()` (then cached, the oldest dropped beyond `size`,
            unless `key` is None).
        """
        if key is None:
            return build()
        if key in self._programs:
            self._programs.move_to_end(key)
            return self._programs[key]
        program = self._programs[key] = build()
        while len(self._programs) > self.size:
            self._programs.popitem(last=False)
        return program


PROGRAMS = ProgramCache()


def keyed(kind: str, key: CacheKey | None, *layout) -> tuple | None:
    """The `PROGRAMS` key of a kind of program named `key` with its layout.

    Args:
        kind: the program's kind: 'init', 'step' or 'eval'.
        key: what it computes (e.g. `FitConfig.compile_key`), or None.
        *layout: hashable parts of how it is laid out (shardings, sizes).

    Returns:
        `(kind, key, *layout)`; None, which caches nothing, when `key` is None.
    """
    return None if key is None else (kind, key, *layout)


def sharding_key(tree):
    """A tree of shardings as a hashable part of a `PROGRAMS` key.

    Args:
        tree: a pytree of shardings.

    Returns:
        A tuple `(treedef, leaves)` of its structure and a tuple of its leaves.
    """
    return jax.tree.structure(tree), tuple(jax.tree.leaves(tree))


class StepProgram:
    """The jitted training calls of one run: `program(state, host_batches)` runs one step
    per batch in one call (`make_train_step(steps_per_call=n)`), with the state donated and
    the given shardings (batches over the mesh's 'data' axis, stacked on a leading axis
    when n > 1), drawing the step keys from `base_rng`. Each distinct `n` compiles once.

    `key` (hashable) names what `loss_fn` and `optimizer` compute: programs of equal keys,
    microbatches and shardings are shared between runs (`PROGRAMS`), so a study's runs of
    one shape compile their step once. Equal keys must mean equal functions; without a key
    (None) the programs are this run's own."""

    def __init__(self, loss_fn: LossFn, optimizer: optax.GradientTransformation, state_sh, mesh,
                 base_rng: jax.Array, *, microbatches: int = 1, key: CacheKey | None = None):
        check_microbatches(microbatches)
        self.loss_fn, self.optimizer, self.microbatches = loss_fn, optimizer, microbatches
        self.mesh, self.base_rng, self.key, self.state_sh = mesh, base_rng, key, state_sh
        self._fns: dict[int, Callable] = {}

    def compiled(self, n: int) -> Callable:
        """The jitted `(state, batch, rng) -> (state, metrics)` of `n` steps.

        Built once per `n` for this object, and taken from `PROGRAMS` where this run has a key.

        Args:
            n: steps per call (`make_train_step(steps_per_call=n)`); batches are stacked on a
              leading axis when n > 1.

        Returns:
            The jitted function, with the state donated.
        """
        if n not in self._fns:
            batch_sh = parallel.batch_sharding(self.mesh, stacked=n > 1)
            repl = parallel.replicated(self.mesh)

            def build():
                return compiler.jit(make_train_step(self.loss_fn, self.optimizer,
                                                    microbatches=self.microbatches,
                                                    steps_per_call=n),
                                    in_shardings=(self.state_sh, batch_sh, repl),
                                    out_shardings=(self.state_sh, repl), donate_argnums=(0,))
            self._fns[n] = PROGRAMS.get(
                keyed('step', self.key, self.microbatches, n, sharding_key(self.state_sh),
                      batch_sh, repl), build)
        return self._fns[n]

    def __call__(self, state: dict, host_batches: list[dict]) -> tuple[dict, dict]:
        """Run one step per host batch (one call); returns the new state and the device
        metrics (stacked per step when there are several)."""
        n = len(host_batches)
        batch = host_batches[0] if n == 1 else _stack_batches(host_batches)
        batch = parallel.shard_batch(batch, self.mesh, stacked=n > 1)
        return self.compiled(n)(state, batch, self.base_rng)


def _stack_batches(batches: list) -> dict:
    """Host batches -> one batch with a leading axis over them (for a call of several steps)."""
    keys = list(batches[0])
    for i, b in enumerate(batches[1:], 1):
        if list(b) != keys:
            raise ValueError(f'batch {i} of a call has entries {sorted(b)}, the first has '
                             f'{sorted(keys)}; consecutive batches must have the same entries')
    out = {}
    for k in keys:
        arrays = [np.asarray(b[k]) for b in batches]
        shapes = {a.shape for a in arrays}
        if len(shapes) > 1:
            raise ValueError(f'batch entry {k!r} changes shape between consecutive batches '
                             f'({sorted(shapes)}); steps_per_call={len(batches)} stacks that many '
                             'batches into one call: pass batches of one shape or steps_per_call=1')
        out[k] = np.stack(arrays)
    return out
