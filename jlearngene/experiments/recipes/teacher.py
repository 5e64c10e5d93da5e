"""Family 'teacher': the gene is taken from the trained teacher, once per descendant (He-LG,
Auto-LG, Pre-Fin, IMwLM); nothing trains upstream beyond the teacher itself."""
from __future__ import annotations

from jlearngene.experiments import recipes
from jlearngene.experiments.recipes.base import Recipe


class Teacher(Recipe):
    family = 'teacher'

    def billed(self, row):
        return ('teacher',)

    def descendant(self, ctx, row, up, d_cfg, key, S, seed):
        m = self.method(row)
        gene = m.gene_from_model(up.genes['teacher'], ctx.t_cfg, **self.gene_options(ctx, row, d_cfg))
        return ctx.jit_descend(m.name, d_cfg, row.descend)(gene, key), 0.0


RECIPE = recipes.register(Teacher())
