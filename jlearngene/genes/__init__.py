"""Methods that initialise ViTs of many sizes from a learngene, behind one contract.

A method is a `Method` record (`common.Method`) with the same verbs everywhere:

* `source`: where its gene comes from.

  - 'learned': `init_gene(cfg, key, **options) -> gene` makes a fresh gene for a source
    (Aux-Net) of config `cfg`; `materialize(trainable, frozen, cfg) -> params` turns the
    trainable gene (plus frozen parts) into the params that are run while it learns, so
    `jax.grad` through it trains the gene (TLEG, Share-Init).
  - 'model': `gene_from_model(params, cfg, **options) -> gene` takes the gene from a
    trained model of config `cfg` (He-LG: its last k layers; Auto-LG: its first k layers
    and embeddings; Pre-Fin: the whole model).
  - 'none': no gene; it is None (Scratch).

* `descend(gene, target_cfg, *, key=None, **options) -> params`: canonical stacked params
  of a descendant of shape `target_cfg`, with exactly `vit.init(target_cfg)`'s structure;
  jittable with the config and options static; GeneError for impossible requests. Where they
  apply, options share names and values: `head='inherit'|'new'`, `embeddings='inherit'|
  'random'` (None: inherit exactly what the gene holds); `key` is needed when anything is
  drawn fresh.
* `gene_param_count(gene, *, include_head=False) -> int`: the parameters the method stores
  (S-Params), i.e. the gene as `descend` reads it.
* `gene_shapes(cfg, **options)`: the gene's shapes for a source of config `cfg`, nothing
  allocated (what `jlearngene.costs.s_params` counts).
* `gene_per_target`: without a source, one gene per distinct target shape is stored
  (Pre-Fin).

Each method module registers its `Method`s when imported; this package imports them all, so
`jlearngene.genes.get('tleg')` works and `names()` lists every method:

* `tleg` (TLEG), `letra` (LeTra): learned inside an Aux-Net; `baselines`: Scratch,
  Share-Init, Mini-Init, He-LG, Auto-LG, Pre-Fin;
* `cluster` (Cluster-Learngene): clustered attention heads of an ancestor;
* `scala` (Scala, with US-Net and MatFormer): sub-networks of one slimmable ViT;
* `mango` (Mango) and `growth` (Net2Net, StackBERT, bert2BERT, LiGO): a small pretrained
  model grown into a large one; `selection` (IMwLM): weights selected from a larger model.

Shared pieces (errors, shape checks, inheriting embeddings and heads, layer gathers) are in
`common`.
"""
from jlearngene.genes.common import GeneError, Method, get, names, register
from jlearngene.genes import (  # noqa: E402  (registers the methods)
    baselines, cluster, growth, letra, mango, scala, selection, tleg)

__all__ = ['GeneError', 'Method', 'get', 'names', 'register', 'baselines', 'cluster', 'growth',
           'letra', 'mango', 'scala', 'selection', 'tleg']
