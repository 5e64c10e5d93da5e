"""One recipe per method family: how a study makes that family's genes upstream and turns
them into descendants (`base.Recipe`). Importing this package registers them all, in the
order their upstream runs go; `for_method(name)` is a row's recipe.

| family | recipe | upstream, once per seed | config section |
|---|---|---|---|
| teacher | `teacher.Teacher` | none: the gene is taken from the teacher per descendant | – |
| aux | `aux.Aux` | the gene trained inside an Aux-Net by distillation from the teacher | `aux` |
| slimmable | `slimmable.Slimmable` | one slimmable network per row | `slim` |
| separate | `slimmable.Separate` | none: networks trained separately at the slimmable grid | `slim` |
| cluster | `cluster.Cluster` | the teacher's attention distances, clustered | `cluster` |
| grown | `grown.Grown` | the small model (converged Scratch of its shape, or trained) | `small` |
| operator | `operator.Operator` | the small model; an operator trained per descendant | `operator` (+ `small`) |
| ceiling | `ceiling.Ceiling` | a source-task model at every descendant shape (a transfer study's reference row) | – |
"""
from __future__ import annotations

from jlearngene import genes
from jlearngene.experiments.recipes.base import Recipe, Row, Upstream

REGISTRY: dict[str, Recipe] = {}


def register(recipe: Recipe) -> Recipe:
    """Add `recipe` under its family (a family has one recipe)."""
    if recipe.family in REGISTRY and REGISTRY[recipe.family] is not recipe:
        raise ValueError(f'a recipe for the family {recipe.family!r} is already registered')
    REGISTRY[recipe.family] = recipe
    return recipe


def own_methods() -> dict[str, Recipe]:
    """{row method: recipe} of the rows recipes run that are no registered method."""
    return {m: r for r in REGISTRY.values() for m in r.own_methods}


def for_method(name: str) -> Recipe:
    """The recipe that runs `name`'s rows in a study (one-line ValueError if none does)."""
    if name in own_methods():
        return own_methods()[name]
    try:
        family = genes.get(name).family
    except genes.GeneError:
        known = [n for n in genes.names() if genes.get(n).family] + list(own_methods())
        raise ValueError(f'study: unknown method {name!r}; known: {", ".join(known)}') from None
    if family is None:
        raise ValueError(f"study: {name!r} has no gene to make (no family); Scratch is the "
                         "harness's own baseline (scratch section): do not list it in methods")
    return REGISTRY[family]


from jlearngene.experiments.recipes import (  # noqa: E402  (registers the recipes, in order)
    teacher, aux, slimmable, cluster, grown, operator, ceiling)

__all__ = ['REGISTRY', 'Recipe', 'Row', 'Upstream', 'for_method', 'own_methods', 'register',
           'aux', 'ceiling', 'cluster', 'grown', 'operator', 'slimmable', 'teacher']
