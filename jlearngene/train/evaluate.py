"""One evaluation loop: `evaluate(eval_fn, params, batches)` -> means over a whole split.

`eval_fn(params, batch)` returns per-batch **sums** over the batch's valid examples plus a
'count' entry (see `tasks.classification_eval`, which honours batch['mask'] for padded last
batches). `evaluate` adds the sums of all batches on device, moves the totals to the host
once and divides them by the total count, so the result is the exact mean over the split
whatever the batch sizes. The trainer, `jlearngene eval` and the experiment harness all
evaluate through it.
"""
from __future__ import annotations

import functools
from typing import Any
from collections.abc import Callable, Iterable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from jlearngene import compiler, parallel


@functools.lru_cache(maxsize=16)
def _jit(eval_fn: Callable) -> Callable:
    return compiler.jit(eval_fn)


def evaluate(eval_fn: Callable, params, batches: Iterable[Mapping[str, Any]], *,
             mesh: jax.sharding.Mesh | None = None, jitted: Callable | None = None) -> dict[str, float]:
    """Means of `eval_fn`'s sums over every batch: `{name: total / count, ..., 'count': count}`.

    Args:
      eval_fn: `(params, batch) -> {name: sum over the batch's valid examples, ..., 'count': n}`.
      params: the tree `eval_fn` takes (on device, or host arrays).
      batches: an iterable of host batches (dicts of numpy arrays with a leading batch axis).
      mesh: when given, each batch is split over its 'data' axis (`parallel.shard_batch`;
        the batch size must divide over it); otherwise batches go to the default device.
      jitted: the compiled form of `eval_fn` to call (e.g. one jitted with shardings);
        default `compiler.jit(eval_fn)`, cached per `eval_fn` object.

    Returns:
      A dict of floats holding each of `eval_fn`'s sums divided by the total count (0.0 for a split
      with no valid example), and 'count', the total number of valid examples.

    Raises:
      ValueError: `batches` yields no batch; `eval_fn` returns no 'count'; or, with `mesh`, a
        batch does not split over its 'data' axis.
    """
    fn = jitted if jitted is not None else _jit(eval_fn)
    total = None
    for batch in batches:
        if mesh is not None:
            batch = parallel.shard_batch(batch, mesh)
        out = fn(params, batch)
        total = out if total is None else jax.tree.map(jnp.add, total, out)
    if total is None:
        raise ValueError('evaluate: the evaluation data yielded no batches')
    if 'count' not in total:
        raise ValueError(f"eval_fn must return a 'count' entry next to its sums, got {sorted(total)}")
    host = {k: float(np.asarray(v)) for k, v in jax.device_get(total).items()}
    count = host.pop('count')
    means = {k: v / max(count, 1e-9) for k, v in host.items()}
    return {**means, 'count': count}
