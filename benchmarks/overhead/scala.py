"""Scala: one four-width step (full + stable-sampled upper and lower widths + smallest, on the
1/16 grid, X = 13) against the four widths' plain steps run in one call.

The runner calls the step with the same state, so the Scala step draws the same widths
every call; 'plain' runs exactly those four widths' ordinary training steps (each its own
sub-config, state and AdamW update) in one jitted function.
"""
import jax

from jlearngene import compiler
from jlearngene.genes import scala
from jlearngene.models import init

import overhead   # benchmarks/overhead, beside the runner

GRID = scala.width_grid(0.25, 1 / 16)


def drawn_widths(rng_data) -> tuple[float, ...]:
    """The four widths `scala.scala_loss` runs at step 0 with base key data `rng_data`."""
    key = jax.random.fold_in(jax.random.wrap_key_data(rng_data), 0)
    i_up, i_low = scala.sample_widths(jax.random.split(key, 5)[0], GRID)
    upper, lower = scala.stable_halves(GRID)
    return 1.0, upper[int(i_up)], lower[int(i_low)], GRID[0]


def case(quick: bool) -> dict:
    cfg, batch = overhead.config(quick)
    method = overhead.train_step(scala.scala_loss(cfg, GRID), init(cfg, jax.random.key(0)),
                                 cfg, batch)
    widths = drawn_widths(method[1][2])
    steps = [overhead.plain(scala.subnet_config(cfg, r), batch) for r in widths]

    # one program: the four plain steps, each un-jitted (`__wrapped__`), in one jit
    four_plain_steps = compiler.jit(
        lambda *args: [step.__wrapped__(*a) for (step, _), a in zip(steps, args)])

    return dict(name='scala', shape=f"{overhead.describe(cfg, batch)}, widths {widths}",
                plain=(four_plain_steps, tuple(a for _, a in steps)), method=method)
