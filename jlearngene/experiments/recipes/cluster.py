"""Family 'cluster': the teacher's heads clustered by their mean attention distance over its
own training images (Cluster-Learngene); a row with the gene option centroids='random' is
the random-head control (as many heads per layer, drawn at random). Reads the `cluster`
section: `images`, `eps`, `min_heads`, `ffn`."""
from __future__ import annotations

import numpy as np

from jlearngene import costs, diagnostics
from jlearngene.experiments import recipes
from jlearngene.experiments.recipes.base import Recipe, Upstream
from jlearngene.experiments.recipes.teacher import on_source_task

CENTROIDS = ('clustered', 'random')


class Cluster(Recipe):
    """The 'cluster' family's recipe (Cluster-Learngene): per seed, the teacher's heads
    clustered by mean attention distance, and each row's gene taken from the teacher at
    those centroids (or, for the control, at as many heads drawn at random)."""
    family = 'cluster'
    section = 'cluster'

    def billed(self, row):
        return ('teacher', 'attention_distance')

    def check(self, ctx, rows):
        """Refuses a gene option `centroids` other than 'clustered' or 'random'."""
        for row in rows:
            chosen = row.gene.get('centroids', 'clustered')
            if chosen not in CENTROIDS:
                raise ValueError(f"study: cluster centroids={chosen!r}; expected 'clustered' or 'random'")

    def gene_shapes(self, ctx, row, target):
        """The largest gene the ancestor can give, every head its own cluster: the centroid
        counts are known only once the distances are measured."""
        return self._shapes(ctx, row, [ctx.ref.num_heads] * ctx.ref.depth)

    def recorded_gene_shapes(self, ctx, row, target, info):
        """The gene's shapes from each layer's recorded centroid count (the shapes depend on
        the counts alone); `gene_shapes` where the seed recorded none."""
        counts = info.get('attention_distance', {}).get('centroids')
        return self.gene_shapes(ctx, row, target) if counts is None else self._shapes(ctx, row, counts)

    def _shapes(self, ctx, row, counts):
        return self.method(row).gene_shapes(on_source_task(ctx, ctx.ref),
                                            clusters=[tuple(range(c)) for c in counts],
                                            ffn=ctx.config['cluster']['ffn'])

    def upstream(self, ctx, rows, seed):
        """The teacher's mean attention distances over the first `cluster.images` images of
        its own training data, density clusters at `cluster.eps`, one gene per row; info: the
        distances, their spread per layer, ε, the centroid counts and FFN groups."""
        cc, dset, t_cfg = ctx.config['cluster'], ctx.ancestor_dset, ctx.t_cfg
        teacher = ctx.teacher(seed)
        n_mad = min(int(cc['images']), dset.num_examples)
        mad = np.asarray(diagnostics.mean_attention_distance(
            teacher, t_cfg, dset.raw_batches(n_mad, ctx.config['eval_batch_size']), mean=dset.mean,
            std=dset.std))
        verbs = self.method(rows[0]).clustering
        clusters = verbs.cluster(mad, cc['eps'], cc['min_heads'])
        up = Upstream()
        for row in rows:
            opts = dict(row.gene)
            chosen = opts.pop('centroids', 'clustered')
            cents = clusters if chosen == 'clustered' else verbs.random(clusters, t_cfg.num_heads, seed)
            up.genes[row.name] = self.method(row).gene_from_model(teacher, t_cfg, clusters=cents,
                                                                  ffn=cc['ffn'], **opts)
        counts = [len(c.centroids) for c in clusters]
        info = dict(distances=np.round(mad, 3).tolist(), eps=float(cc['eps']), images=n_mad,
                    spread=np.round(mad.max(1) - mad.min(1), 3).tolist(), centroids=counts,
                    ffn_groups=[list(g) for g in verbs.ffn_groups(counts, cc['ffn'],
                                                                  heads=t_cfg.num_heads)])
        up.flops['attention_distance'] = float(costs.flops_per_image(t_cfg) * n_mad)
        up.info['attention_distance'] = info
        ctx.say(f"clusters seed {seed}: centroids per layer {info['centroids']}, FFN groups "
                f"{info['ffn_groups']}")
        return up

    def report_lines(self, results):
        """The attention distances per layer against ε (first seed), for a study whose
        teacher is an ancestor on its own task."""
        per_seed = [i['attention_distance'] for i in results.get('info', {}).values()
                    if 'attention_distance' in i]
        if not per_seed or not results.get('ancestor'):
            return []
        first = per_seed[0]
        lines = ['', f"**Mean attention distance** (px, over {first['images']} ancestor-task "
                 f"images; ε = {first['eps']:g} px; per seed: centroids per layer / FFN groups: "
                 + '; '.join(f"{p['centroids']} / {p['ffn_groups']}" for p in per_seed) + '), first seed:',
                 '', '| layer | min | max | spread (max − min) | spread / ε | centroids |',
                 '|---|---|---|---|---|---|']
        for layer, (row, spread) in enumerate(zip(first['distances'], first['spread'])):
            lines.append(f"| {layer} | {min(row):.2f} | {max(row):.2f} | {spread:.2f} | "
                         f"{spread / first['eps']:.1f} | {first['centroids'][layer]} |")
        return lines


RECIPE = recipes.register(Cluster())
