"""The recipe contract: how the study protocol asks a method family for its genes.

A study's rows are `Row`s (a method with its options, or a variant of it). Each row belongs
to the `Recipe` of its method's family (`genes.Method.family`): the recipe makes that
family's genes upstream once per seed (`upstream`), turns them into descendants
(`descendant`), says which budgets a descendant trains for (`budgets`) and which upstream
runs its cost includes (`billed`), and adds the family's own report lines. A recipe reads
one config section (`section`) and nothing else of the config that names a method; the
protocol (`study.py`) names no method and no family.
"""
from __future__ import annotations

import dataclasses
from typing import Any
from collections.abc import Sequence

from jlearngene import genes
from jlearngene.experiments import harness
from jlearngene.models import ViTConfig


@dataclasses.dataclass(frozen=True)
class Row:
    """One row of a study's table: `name` ('letra/step', 'mango/2', 'he_lg'), the `method`
    it runs ('separate' for a recipe's own row), its `variant` ({'gene': {...}, 'descend':
    {...}}: the row's own values), and its resolved `gene` and `descend` options (the
    method's defaults, `method_options` and the variant, resolved once by its recipe)."""
    name: str
    method: str
    recipe: Recipe
    variant: dict
    gene: dict
    descend: dict

    @property
    def tag(self) -> str:
        """The row's name in run directories ('letra_step')."""
        return self.name.replace('/', '_')


@dataclasses.dataclass
class Upstream:
    """What the recipes made for one seed: genes (or params) by row name, training FLOPs by
    upstream run, JSON-able info (accuracies, Cluster-Learngene's distances)."""
    genes: dict[str, Any] = dataclasses.field(default_factory=dict)
    flops: dict[str, float] = dataclasses.field(default_factory=dict)
    info: dict[str, Any] = dataclasses.field(default_factory=dict)

    def update(self, other: Upstream) -> None:
        """Adds `other`'s genes, FLOPs and info to these (another recipe's, for the same
        seed); an entry of the same name is replaced by `other`'s."""
        self.genes.update(other.genes)
        self.flops.update(other.flops)
        self.info.update(other.info)


class Recipe:
    """One method family's part of a study. Subclasses override what their family does
    differently; the defaults are a gene taken from shapes alone and descendants tuned at
    `descend.fractions` of S at `descend.lr`."""
    family: str = ''
    section: str | None = None        # the one config section this recipe reads
    own_methods: tuple[str, ...] = ()  # rows it runs that are no registered method ('separate')
    # genes come from a model of the source task: descendants on another task get a new head
    new_task_head: bool = True
    # the row trains for Scratch's own steps only, never at a paper budget (the ceiling)
    equal_budget_only: bool = False

    # -- rows --------------------------------------------------------------------------
    def method(self, row: Row) -> genes.Method:
        """The registered method whose `descend` makes the row's descendants."""
        return genes.get(row.method)

    def resolve(self, config, method: str, gene: dict, descend: dict,
                variant: dict) -> tuple[dict, dict]:
        """The row's (gene, descend) options from the configured and variant ones."""
        return gene, descend

    def label(self, row: Row) -> str:
        """The row's name in tables and plots ('LeTra (step)', 'Mango (R=2)')."""
        m, value = self.method(row), row.name.partition('/')[2]
        if m.row_label is not None:
            return f'{m.label} ({m.row_label(row.gene)})'
        return f'{m.label} ({value})' if value else m.label

    def check(self, ctx: harness.Context, rows: Sequence[Row]) -> None:
        """A one-line ValueError for rows this recipe cannot run, before anything trains."""

    def scratch_shapes(self, ctx: harness.Context) -> dict:
        """{shape: config} Scratch also trains because this recipe reuses its runs."""
        return {}

    def billed(self, row: Row) -> tuple[str, ...]:
        """The upstream runs whose training FLOPs count towards the row's cost."""
        return ()

    def billed_at(self, row: Row, shape: Sequence[int]) -> tuple[str, ...]:
        """`billed` for the row's descendant at `shape` (a recipe whose upstream differs by
        shape names that shape's runs)."""
        return self.billed(row)

    # -- shapes (nothing trained) --------------------------------------------------------
    def gene_options(self, ctx: harness.Context, row: Row, target: ViTConfig) -> dict:
        """The row's gene options for the descendant `target` (the method's
        `target_options`, e.g. He-LG's k from the descendant's depth)."""
        m = self.method(row)
        opts = dict(row.gene)
        return m.target_options(opts, target, ctx.ref) if m.target_options else opts

    def candidates(self, ctx: harness.Context, row: Row,
                   shape: Sequence[int]) -> tuple[ViTConfig, ...] | str:
        """The configs the row may make `shape` in, first that works first; or why none."""
        return ctx.shape_configs(shape)

    def gene_shapes(self, ctx: harness.Context, row: Row, target: ViTConfig) -> Any:
        """The shapes of the gene the row's descendant `target` descends from."""
        return self.method(row).gene_shapes(ctx.ref, **self.gene_options(ctx, row, target))

    def recorded_gene_shapes(self, ctx: harness.Context, row: Row, target: ViTConfig,
                             info: dict) -> Any:
        """The shapes of the gene a recorded seed's upstream made (`info`: that seed's
        `Upstream.info`), where the data and not the config fixes them; by default
        `gene_shapes`."""
        del info
        return self.gene_shapes(ctx, row, target)

    # -- training ------------------------------------------------------------------------
    def upstream(self, ctx: harness.Context, rows: Sequence[Row], seed: int) -> Upstream:
        """Every upstream run of this family's `rows` for one seed."""
        return Upstream()

    def descendant(self, ctx: harness.Context, row: Row, up: Upstream, d_cfg: ViTConfig,
                   key, S: int, seed: int) -> tuple[Any, float]:
        """(the descendant's initial params, its own extra training FLOPs)."""
        return ctx.jit_descend(self.method(row).name, d_cfg, row.descend)(up.genes[row.name], key), 0.0

    def budgets(self, ctx: harness.Context, row: Row, shape: Sequence[int], S: int,
                up: Upstream) -> list[tuple[float, int, float]]:
        """[(fraction of S, steps, lr)] the descendant is tuned for at its paper's budgets (the
        protocol adds Scratch's own steps where the study asks for `descend.equal_budget`)."""
        return ctx.default_budgets(S)

    # -- reporting -----------------------------------------------------------------------
    def report_lines(self, results: dict) -> list[str]:
        """Markdown lines of the family's own (after the ancestor's baseline)."""
        return []
