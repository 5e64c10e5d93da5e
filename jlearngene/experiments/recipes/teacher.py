"""Family 'teacher': the gene is taken from the trained teacher, once per descendant (He-LG,
Auto-LG, Pre-Fin, IMwLM); nothing trains upstream beyond the teacher itself. Also the source
task's class count (`source_classes`), which every model of the source task has: the teacher,
an Aux-Net distilled from it, the small model the growth methods grow."""
from __future__ import annotations

from jlearngene.experiments import harness, recipes
from jlearngene.experiments.recipes.base import Recipe
from jlearngene.models import ViTConfig


def source_classes(ctx: harness.Context) -> int:
    """The source task's class count: the ancestor's classes (`tasks.ancestor`) in a study
    with two tasks, else the study's own."""
    tasks = harness.get(ctx.config, 'tasks', None)
    return len(tasks['ancestor']) if tasks else ctx.K


def on_source_task(ctx: harness.Context, cfg: ViTConfig) -> ViTConfig:
    """`cfg` with the source task's class count (`source_classes`)."""
    return cfg.replace(num_classes=source_classes(ctx))


class FromSource:
    """A recipe whose genes come from a model of the source task (the teacher, or an Aux-Net
    distilled from it): their shapes are those of the reference config on the source task's
    classes."""

    def gene_shapes(self, ctx, row, target):
        """`Recipe.gene_shapes` of the reference config on the source task's classes."""
        return self.method(row).gene_shapes(on_source_task(ctx, ctx.ref),
                                            **self.gene_options(ctx, row, target))


class Teacher(FromSource, Recipe):
    """The 'teacher' family's recipe: nothing trains upstream beyond the teacher, which each
    row's cost bills; each descendant's gene is taken from the teacher for its own shape."""
    family = 'teacher'

    def billed(self, row):
        return ('teacher',)

    def descendant(self, ctx, row, up, d_cfg, key, S, seed):
        """The gene taken from the teacher (`up.genes['teacher']`) with the options for
        `d_cfg`, then descended; no training FLOPs of its own."""
        m = self.method(row)
        gene = m.gene_from_model(up.genes['teacher'], ctx.t_cfg, **self.gene_options(ctx, row, d_cfg))
        return ctx.jit_descend(m.name, d_cfg, row.descend)(gene, key), 0.0


RECIPE = recipes.register(Teacher())
