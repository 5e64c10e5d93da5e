"""Cluster-Learngene (Wang et al., NeurIPS 2024): a pretrained ancestor's attention heads
clustered by mean attention distance, inherited by descendants with any head count per layer.

The pipeline, as pure functions:

1. `jlearngene.diagnostics.mean_attention_distance(params, cfg, batches)`: (layers, heads)
   mean attention distance in pixels, streamed over a dataset one batch and one layer at a
   time (the diagnostics' definition, so the heads are clustered by what they plot).
2. `cluster_heads(distances, eps, min_heads)`: per layer, density clustering of the heads'
   distances (DBSCAN; or k-means), clusters in priority order, each with its centroid head.
3. `gene_from_model(params, cfg, clusters=...)`: the gene (below).
4. `descend(gene, target_cfg, heads=...)`: a descendant with those head counts per layer
   (`head_schedule` turns ω schedules into counts). `descendant_state` /
   `materialize_descendant` train a descendant through its FFN expansion φ (the paper's
   trainable φ); `descend` is `materialize_descendant(descendant_state(...))`, the starting
   weights either way.

**The gene** is a plain pytree whose structure carries the clustering, so `descend`
needs no index data and is jittable with the target config and options static::

    patch_embed, pos_embed, cls_token, dist_token, norm, head    the ancestor's
    blocks: [one tree per ancestor layer l]
        norm1, norm2                                             the ancestor's
        attn (correct form): q, k, v {kernel (D, c_l, Dh), bias (c_l, Dh)},
                             out {kernel (c_l, Dh, D), bias (D,)}
             the layer's c_l centroid heads, in priority order (largest cluster first)
        attn (official form, `official=True`): qkv_chunks (D, c_l, 3·Dh), out (the whole
             output projection, all H_a heads)
        mlp   the layer's FFN, in layers that keep their own and in the first layer of an
              FFN group; absent in the group's other layers (a group is its first layer
              plus the mlp-less layers after it)

Its S-Params (`gene_param_count`) are what a descendant reads: the centroid heads, the FFNs
of the group representatives and ungrouped layers, norms and embeddings.

**Descendants** keep width, head_dim and MLP size and take the first L_d ancestor layers
(layers beyond the ancestor's depth, outside the paper, are drawn fresh). Layer l gets H_l
heads (`head_schedule`: a list, a constant ω with H_l = ⌊H_a/ω⌋, per-layer ω, or the
paper's 'decrementing' (ω = 2, 1.5, 1 over the thirds of the ancestor's depth) and
'incrementing' (1, 1.5, 2)). Priority weight sharing: head slot k takes centroid k mod c_l
(each centroid ⌊H_l/c_l⌋ times, the remainder to the first by priority; the first H_l when
H_l < c_l); the copies are independent parameters, with no 1/r rescaling. By default each
slot gets its centroid's true q, k, v kernels and biases and its rows of the output kernel
(the columns of W^O in PyTorch's orientation). `official=True` reproduces the official code
(§3.5 of the spec): a "head" is a row chunk of timm's fused qkv weight, read back in timm's
(q|k|v, head, dim) order, so the chosen indices land on mixed q/k/v rows of other heads;
q/k/v have no bias (the target config needs qkv_bias=False, `descendant_config(...,
official=True)`); the output projection keeps its first H_l heads (H_l < H_a) or repeats
every input column H_l/H_a times (H_l > H_a, a multiple).

FFN groups (`ffn_groups`): the paper's rule as the authors' rebuttal states it (maximal
runs of ≥ 2 adjacent layers with the same centroid count, among layers whose heads were
clustered, so ε controls it: no group when every head is its own centroid), 'same_count'
(unclustered layers too), none, or explicit groups (`OFFICIAL_FFN_GROUPS` holds the official
code's DeiT ones). Every layer of a k-layer group is generated from the group's first FFN by
the element-wise expansion φ: R → R^k, φ(w) = W₂·ReLU(W₁w + b₁) + b₂, one φ per group shared
by fc1/fc2 kernels and biases, output t for the group's t-th layer. φ starts as the identity
on every output (phi='identity', the default: each grouped layer starts as the
representative FFN) or, as in the official code, at PyTorch's default Linear init
(phi='official': W₁, b₁ ~ U(−1, 1); W₂, b₂ ~ U(±1/√k); outputs about a·w + c with a ≈ 0.005,
close to re-randomised). The official code applies φ once and trains the generated weights
(φ frozen: `descend`'s params trained as they are); the paper's wording trains φ
(`descendant_state`: the representative FFN and φ are trainable, the group's FFNs are
generated in every step).

The rest is inherited (patch/position embeddings, prefix tokens, final norm, every norm1/
norm2); the head is inherited by default, as every method's (head='new' for another task,
as the official code does). Output layout: stacked when every layer has the same head
count, else the list layout.

The registered method 'cluster' (`METHOD`) has source 'model': its `gene_from_model` takes
the clusters (or precomputed distances to cluster) as options, since computing distances
needs data; without them every head is its own centroid and no FFNs are grouped (the
identity gene: at ω = 1 the descendant is the ancestor).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jlearngene.genes import common
from jlearngene.genes.common import GeneError
from jlearngene.models import layout, vit
from jlearngene.models.config import ViTConfig

Params = dict[str, Any]
Gene = dict[str, Any]

ALGORITHMS = ('density', 'kmeans')
SCHEDULES = ('decrementing', 'incrementing')
SCHEDULE_OMEGAS = {'decrementing': (2.0, 1.5, 1.0), 'incrementing': (1.0, 1.5, 2.0)}
FFN_RULES = ('paper', 'same_count', 'none')
PHI_INITS = ('identity', 'official')

# The official code's head-centroid lists (`shared_head_index` in train.py), priority order,
# for the DeiT ImageNet checkpoints, and its hard-coded FFN groups (0-based layers).
OFFICIAL_CENTROIDS = {
    'Ti': ((0, 1, 2), (0, 2), (0, 2), (0, 1, 2), (0, 1, 2), (1, 0), (0, 1, 2), (2, 0),
           (0, 1, 2), (1, 0), (1,), (0,)),
    'S': ((1, 2, 3), (0, 1, 3), (4, 2, 3), (1, 3), (4, 1, 3, 5), (4, 0, 1), (2, 0, 1, 3, 5),
          (4,), (5, 1, 2), (5,), (2,), (3,)),
    'B': ((1, 5, 4, 2, 8), (2, 6, 11), (6, 3, 5, 7), (3, 7, 5, 9, 1, 2), (5, 2, 1, 8, 10),
          (6, 7, 10, 11), (0, 1, 5, 3), (10, 6, 4, 11), (0, 3, 7, 9), (3,), (3, 4), (5,)),
}
OFFICIAL_FFN_GROUPS = {'Ti': ((1, 2), (10, 11)), 'S': ((9, 10, 11),), 'B': ((6, 7), (9, 10, 11))}


# ----------------------------------------------------------------------------------------
# Clustering.

@dataclasses.dataclass(frozen=True)
class LayerClusters:
    """One layer's head clusters in priority order (size, descending; stable).

    members: each cluster's heads, ascending. centroids: each cluster's centroid head, the
    member whose distance is closest to the cluster's mean distance (ties: the lower head).
    """
    members: tuple[tuple[int, ...], ...]
    centroids: tuple[int, ...]


def _centroid(values: np.ndarray, members: Sequence[int]) -> int:
    """The member closest to the members' mean; ties (within float rounding) to the lower."""
    v = values[list(members)]
    gap = np.abs(v - v.mean())
    tol = 1e-9 * max(1.0, float(np.abs(v).max()))
    return int(members[int(np.flatnonzero(gap <= gap.min() + tol)[0])])


def _layer_clusters(values: np.ndarray, labels: np.ndarray, order: str) -> LayerClusters:
    """Clusters from labels (−1: noise, dropped), in priority order: size descending, ties
    in label order (`order='label'`, DBSCAN's) or by smallest member ('member')."""
    groups = [tuple(int(h) for h in np.flatnonzero(labels == c))
              for c in np.unique(labels) if c >= 0]
    if order == 'member':
        groups.sort(key=lambda g: g[0])
    groups.sort(key=len, reverse=True)          # stable: equal sizes keep their order
    return LayerClusters(tuple(groups), tuple(_centroid(values, g) for g in groups))


def cluster_heads(distances, eps: float = 10.0, min_heads: int = 1, *,
                  algorithm: str = 'density', num_clusters: int | Sequence[int] | None = None,
                  seed: int = 0) -> tuple[LayerClusters, ...]:
    """Per layer, the heads clustered by their mean attention distance.

    'density' (the paper): scikit-learn's DBSCAN(eps, min_samples=min_heads) on the 1-D
    distances (|ΔMAD| ≤ eps links heads, so clusters chain; the paper's Eps and MinHds). With
    min_heads = 1 every head belongs to a cluster; with more, DBSCAN's noise heads belong to
    none. eps = 0 joins only equal distances, so every head is kept. Ties in size keep
    DBSCAN's label order (that of each cluster's first core head). 'kmeans' (the reviewers'
    comparison): scikit-learn's KMeans with `num_clusters` per layer (`seed`, 10 restarts);
    `eps` and `min_heads` are not used; ties in size go by smallest member.

    Args:
        distances: (layers, heads) mean attention distances in pixels
          (`diagnostics.mean_attention_distance`).
        eps: the density radius in pixels.
        min_heads: DBSCAN's `min_samples`.
        algorithm: 'density' or 'kmeans' (`ALGORITHMS`).
        num_clusters: for 'kmeans', an int or one per layer.
        seed: for 'kmeans'.

    Returns:
        One `LayerClusters` per layer, the clusters in priority order (size, descending), each
        with its members and its centroid head (the member closest to the cluster's mean
        distance, ties to the lower head).

    Raises:
        ValueError: `distances` is not a finite (layers, heads) array, `eps` or `min_heads` is
          out of range, a layer is left without a cluster, or `num_clusters` does not fit.
        GeneError: `algorithm` is not one of `ALGORITHMS`.
    """
    d = np.asarray(distances, np.float64)
    if d.ndim != 2 or d.size == 0 or not np.all(np.isfinite(d)):
        raise ValueError(f'cluster_heads: distances must be a finite (layers, heads) array, '
                         f'got shape {d.shape}')
    common.check_choice('cluster_heads', 'algorithm', algorithm, ALGORITHMS)
    layers, heads = d.shape
    out = []
    if algorithm == 'density':
        from sklearn.cluster import DBSCAN
        if not (isinstance(eps, (int, float, np.number)) and eps >= 0):
            raise ValueError(f'cluster_heads: eps={eps!r} must be a number >= 0')
        if not (isinstance(min_heads, (int, np.integer)) and 1 <= min_heads <= heads):
            raise ValueError(f'cluster_heads: min_heads={min_heads!r} must be an integer in '
                             f'[1, {heads}]')
        # sklearn needs eps > 0; the smallest positive float joins exactly the equal values.
        radius = max(float(eps), float(np.finfo(np.float64).tiny))
        for l in range(layers):
            labels = DBSCAN(eps=radius, min_samples=int(min_heads)).fit(d[l, :, None]).labels_
            if np.all(labels < 0):
                raise ValueError(f'cluster_heads: layer {l} has no cluster at eps={eps}, '
                                 f'min_heads={min_heads} (every head is noise)')
            out.append(_layer_clusters(d[l], labels, 'label'))
        return tuple(out)
    from sklearn.cluster import KMeans
    ks = [num_clusters] * layers if isinstance(num_clusters, (int, np.integer)) else num_clusters
    if ks is None or len(ks) != layers or not all(
            isinstance(k, (int, np.integer)) and 1 <= k <= heads for k in ks):
        raise ValueError(f"cluster_heads(algorithm='kmeans'): num_clusters={num_clusters!r} must "
                         f'be an integer in [1, {heads}] or {layers} of them')
    for l in range(layers):
        labels = KMeans(n_clusters=int(ks[l]), n_init=10, random_state=seed).fit(d[l, :, None]).labels_
        out.append(_layer_clusters(d[l], labels, 'member'))
    return tuple(out)


def centroid_lists(clusters: Sequence[LayerClusters | Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    """Per layer, the centroid heads in priority order (the official `shared_head_index`
    format).

    Args:
        clusters: `cluster_heads`' output, or centroid lists per layer.

    Returns:
        One tuple of int head indices per layer.
    """
    return tuple(tuple(int(h) for h in (c.centroids if isinstance(c, LayerClusters) else c))
                 for c in clusters)


def random_centroids(clusters: Sequence[LayerClusters | Sequence[int]], heads: int,
                     seed: int) -> tuple[tuple[int, ...], ...]:
    """The random-head control: per layer as many heads as `clusters` has centroids, drawn
    uniformly without replacement from the layer's `heads` (numpy, `seed`), in the order
    drawn; the centroid counts, and so the FFN groups and S-Params, are the clusters'.

    Args:
        clusters: `cluster_heads`' output, or centroid lists per layer; only their lengths
          are used.
        heads: the ancestor's heads per layer.
        seed: the seed of `numpy.random.default_rng`.

    Returns:
        One tuple of distinct int heads per layer, as many as that layer's centroids.

    Raises:
        ValueError: a layer has more centroids than `heads` (numpy cannot draw them).
    """
    rng = np.random.default_rng(seed)
    return tuple(tuple(int(h) for h in rng.choice(heads, size=len(c), replace=False))
                 for c in centroid_lists(clusters))


# ----------------------------------------------------------------------------------------
# Head-count schedules and FFN groups.

def head_schedule(ancestor_heads: int, depth: int, *, heads: Sequence[int] | None = None,
                  omega: float | str | Sequence[float] | None = None,
                  ancestor_depth: int | None = None) -> tuple[int, ...]:
    """The head count of each descendant layer, from counts or from ω.

    Args:
        ancestor_heads: H_a, the ancestor's heads per layer.
        depth: the descendant's depth.
        heads: one head count per layer (give this or `omega`).
        omega: H_l = ⌊H_a/ω_l⌋: one ω for every layer, one per layer, or 'decrementing' /
          'incrementing', the paper's ω = 2 / 1.5 / 1 and 1 / 1.5 / 2 over the thirds of the
          ancestor's depth by absolute layer index (0–3, 4–7, 8–11 for 12 layers; layers beyond
          it take the last).
        ancestor_depth: the ancestor's depth, for the named schedules (default `depth`).

    Returns:
        (depth,) head counts.

    Raises:
        GeneError: both or neither of `heads` and `omega`, counts that are not `depth`
          positive integers, ratios that are not positive or leave a layer without heads, or
          an unknown schedule name.
    """
    if (heads is None) == (omega is None):
        raise GeneError('head_schedule: give exactly one of heads= (counts per layer) and '
                        'omega= (ratios H_a / H_l)')
    if heads is not None:
        counts = [heads] if isinstance(heads, (int, np.integer)) else list(heads)
        if len(counts) != depth or not all(isinstance(h, (int, np.integer)) and h >= 1 for h in counts):
            raise GeneError(f'heads={heads!r}: expected {depth} positive integers, one per layer')
        return tuple(int(h) for h in counts)
    if isinstance(omega, str):
        common.check_choice('head_schedule', 'omega', omega, SCHEDULES)
        n = ancestor_depth or depth
        omegas = [SCHEDULE_OMEGAS[omega][min(l * 3 // n, 2)] for l in range(depth)]
    elif isinstance(omega, (int, float, np.number)) and not isinstance(omega, bool):
        omegas = [omega] * depth
    else:
        omegas = list(omega)
        if len(omegas) != depth:
            raise GeneError(f'omega={omega!r}: expected one ratio or {depth} (one per layer)')
    counts = []
    for l, w in enumerate(omegas):
        if isinstance(w, bool) or not isinstance(w, (int, float, np.number)) or not w > 0:
            raise GeneError(f'omega={omega!r}: ratios must be positive numbers (layer {l}: {w!r})')
        h = math.floor(ancestor_heads / w + 1e-9)
        if h < 1:
            raise GeneError(f'omega={w} leaves layer {l} with ⌊{ancestor_heads}/{w}⌋ = 0 heads')
        counts.append(h)
    return tuple(counts)


def ffn_groups(centroid_counts: Sequence[int], ffn: str | Sequence[Sequence[int]] = 'paper',
               *, heads: int | None = None) -> tuple[tuple[int, ...], ...]:
    """FFN groups (layer tuples) from the centroid count c_l of each layer.

    'paper': maximal runs of ≥ 2 adjacent layers with the same c_l, among the layers whose
    heads were clustered (c_l < `heads`, the ancestor's head count). This is the rule as the
    authors' rebuttal states it: ε = 1 px (every head its own centroid) clusters no FFN,
    ε = 100 px (one centroid per layer) clusters every run of adjacent layers.
    'same_count': runs of equal c_l including unclustered layers (c_l = heads), so an
    ancestor whose heads are all their own centroids groups every FFN. 'none': no groups.
    Or explicit groups of adjacent layers (e.g. `OFFICIAL_FFN_GROUPS`, the official code's).

    Args:
        centroid_counts: c_l for each ancestor layer.
        ffn: 'paper', 'same_count', 'none', or explicit groups (each a sequence of layers).
        heads: the ancestor's head count; needed for 'paper'.

    Returns:
        The groups, each a tuple of ≥ 2 adjacent layers, in ascending order.

    Raises:
        GeneError: `ffn` is a string not in `FFN_RULES`, 'paper' without `heads`, or
          explicit groups that are not disjoint runs of ≥ 2 adjacent layers in
          [0, len(centroid_counts)).
    """
    n = len(centroid_counts)
    if isinstance(ffn, str):
        common.check_choice('ffn_groups', 'ffn', ffn, FFN_RULES)
        if ffn == 'none':
            return ()
        if ffn == 'paper' and heads is None:
            raise GeneError("ffn_groups(ffn='paper'): needs heads= (the ancestor's head count), "
                            'since only layers with fewer centroids than heads are clustered')
        clustered = [ffn == 'same_count' or c < heads for c in centroid_counts]
        groups, start = [], 0
        for l in range(1, n + 1):
            if l == n or centroid_counts[l] != centroid_counts[start]:
                if l - start >= 2 and clustered[start]:
                    groups.append(tuple(range(start, l)))
                start = l
        return tuple(groups)
    groups = tuple(tuple(int(l) for l in g) for g in ffn)
    seen: set[int] = set()
    for g in groups:
        if (len(g) < 2 or list(g) != list(range(g[0], g[0] + len(g))) or g[0] < 0
                or g[-1] >= n or seen & set(g)):
            raise GeneError(f'ffn groups {groups}: each group must be ≥ 2 adjacent layers in '
                            f'[0, {n}), groups disjoint')
        seen |= set(g)
    return tuple(sorted(groups))


# ----------------------------------------------------------------------------------------
# The gene.

def _fused_chunks(attn: Params) -> jax.Array:
    """(D, H, 3·Dh): timm's fused qkv weight (rows (q|k|v, head, dim)) transposed and cut
    into the official code's H "heads" of 3·Dh consecutive rows."""
    q = attn['q']['kernel']
    d, h, dh = q.shape
    fused = jnp.stack([attn[n]['kernel'] for n in 'qkv'], axis=1)      # (D, 3, H, Dh)
    return fused.reshape(d, h, 3 * dh)


def _take_heads(attn: Params, index: np.ndarray) -> Params:
    """One layer's attention with heads `index` (in that order, repeats allowed): q/k/v
    kernels and biases and the output kernel's rows, by their logical 'heads' axis."""
    return layout.slice_tree({'blocks': [{'attn': attn}]}, {'heads': index})['blocks'][0]['attn']


def _check_clusters(centroids: tuple[tuple[int, ...], ...], depth: int, heads: int) -> None:
    if len(centroids) != depth:
        raise GeneError(f'cluster: {len(centroids)} layers of clusters for an ancestor of depth {depth}')
    for l, c in enumerate(centroids):
        if not c or len(set(c)) != len(c) or min(c) < 0 or max(c) >= heads:
            raise GeneError(f'cluster: layer {l} centroids {list(c)} must be distinct heads in '
                            f'[0, {heads}), at least one')


def gene_from_model(params: Params, cfg: ViTConfig, *, clusters=None, distances=None,
                    eps: float = 10.0, min_heads: int = 1, ffn=None,
                    official: bool = False) -> Gene:
    """The Cluster-Learngene gene of an ancestor `params` of config `cfg` (see the module
    docstring for its structure).

    Args:
        params: the ancestor's canonical params.
        cfg: the ancestor's config.
        clusters: `cluster_heads`' output, or centroid lists per layer (e.g.
          `OFFICIAL_CENTROIDS['B']`).
        distances: (layers, heads) distances (`diagnostics.mean_attention_distance`), clustered
          here with `cluster_heads(distances, eps, min_heads)`; with neither this nor
          `clusters` every head is its own centroid (the identity gene).
        eps: `cluster_heads`' radius, with `distances`.
        min_heads: `cluster_heads`' `min_samples`, with `distances`.
        ffn: 'paper', 'same_count', 'none' or explicit groups (`ffn_groups`); None is 'paper'
          with clusters and 'none' for the identity gene.
        official: the attention in the official code's form (row chunks of the fused qkv, no
          q/k/v biases, the whole output projection).

    Returns:
        The gene.

    Raises:
        GeneError: both `clusters` and `distances`, distances or clusters that do not fit the
          ancestor's layers and heads, or an ancestor that is not a model of `cfg`.
    """
    params = common.check_model(params, cfg, 'cluster')
    depth, heads = cfg.depth, layout.axis_size(params, 'blocks/attn/q/kernel', 'heads')
    if clusters is not None and distances is not None:
        raise GeneError('cluster: give clusters= or distances=, not both')
    if distances is not None:
        d = np.asarray(distances)
        if d.shape != (depth, heads):
            raise GeneError(f'cluster: distances have shape {d.shape}, the ancestor needs '
                            f'({depth}, {heads})')
        clusters = cluster_heads(d, eps, min_heads)
    identity = clusters is None
    centroids = (tuple(tuple(range(heads)) for _ in range(depth)) if identity
                 else centroid_lists(clusters))
    _check_clusters(centroids, depth, heads)
    groups = ffn_groups([len(c) for c in centroids], ('none' if identity else 'paper')
                        if ffn is None else ffn, heads=heads)
    followers = {l for g in groups for l in g[1:]}
    gene = common.top_level(params)
    blocks = []
    for l in range(depth):
        layer = jax.tree.map(lambda x, l=l: x[l], params['blocks'])
        idx = np.asarray(centroids[l], np.int32)
        attn = layer['attn']
        if official:
            block_attn = {'qkv_chunks': _fused_chunks(attn)[:, idx], 'out': attn['out']}
        else:
            block_attn = _take_heads(attn, idx)
        block = {k: v for k, v in layer.items() if k not in ('attn', 'mlp')}
        block['attn'] = block_attn
        if l not in followers:
            block['mlp'] = layer['mlp']
        blocks.append(block)
    gene['blocks'] = blocks
    return gene


def _check_gene(gene: Any) -> list[Params]:
    if not isinstance(gene, Mapping) or not isinstance(gene.get('blocks'), (list, tuple)):
        got = sorted(gene) if isinstance(gene, Mapping) else type(gene).__name__
        raise GeneError(f"not a Cluster-Learngene gene: expected a tree with a list of 'blocks', got {got}")
    blocks = list(gene['blocks'])
    if not blocks or 'mlp' not in blocks[0]:
        raise GeneError("not a Cluster-Learngene gene: its first layer must hold an 'mlp'")
    forms = {'qkv_chunks' in b['attn'] for b in blocks}
    if len(forms) != 1:
        raise GeneError('not a Cluster-Learngene gene: layers mix the official and the correct form')
    return blocks


def is_official(gene: Gene) -> bool:
    """Whether the gene holds the attention in the official code's form.

    Args:
        gene: a Cluster-Learngene gene.

    Returns:
        True when its layers hold 'qkv_chunks' (`gene_from_model(..., official=True)`).

    Raises:
        GeneError: `gene` is not a Cluster-Learngene gene (no list of 'blocks', no 'mlp' in
          its first layer, or layers of both forms).
    """
    return 'qkv_chunks' in _check_gene(gene)[0]['attn']


def centroid_counts(gene: Gene) -> tuple[int, ...]:
    """The centroid count c_l of each ancestor layer, read from the gene's shapes.

    Args:
        gene: a Cluster-Learngene gene (arrays or shapes).

    Returns:
        One int per ancestor layer.

    Raises:
        GeneError: `gene` is not a Cluster-Learngene gene.
    """
    return tuple(int(np.shape(b['attn']['qkv_chunks'] if 'qkv_chunks' in b['attn']
                              else b['attn']['q']['kernel'])[1]) for b in _check_gene(gene))


def gene_groups(gene: Gene) -> tuple[tuple[int, ...], ...]:
    """The gene's FFN groups, read from where its 'mlp's are.

    Args:
        gene: a Cluster-Learngene gene.

    Returns:
        Each group as a tuple of ancestor layers (a layer with an 'mlp' and the mlp-less
        layers after it), groups of one layer left out.

    Raises:
        GeneError: `gene` is not a Cluster-Learngene gene.
    """
    groups, current = [], None
    for l, b in enumerate(_check_gene(gene)):
        if 'mlp' in b:
            current = [l]
            groups.append(current)
        else:
            current.append(l)
    return tuple(tuple(g) for g in groups if len(g) > 1)


def gene_param_count(gene: Gene, *, include_head: bool = False) -> int:
    """The gene's parameters (S-Params), all of which a descendant of the ancestor's depth
    reads (the official form's output projection only in part when heads shrink).

    Args:
        gene: a Cluster-Learngene gene (arrays or shapes).
        include_head: count the head too.

    Returns:
        The parameter count.

    Raises:
        GeneError: `gene` is not a Cluster-Learngene gene.
    """
    _check_gene(gene)
    return common.count(gene, include_head=include_head)


def inherited_param_count(gene: Gene, target_cfg: ViTConfig, *,
                          heads: Sequence[int] | None = None, head: str = 'inherit',
                          embeddings: str | None = None) -> int:
    """I-Params (the paper's Table 2): the parameters of `descend(gene, target_cfg,
    heads=..., head=..., embeddings=...)` whose values come from the ancestor: every head
    slot (a centroid that fills several slots counts once per slot), the norms, the FFNs
    (those φ generates from a group's representative included), and the embeddings and head
    when inherited. Layers beyond the ancestor's depth and whatever else is drawn fresh are
    not. From shapes alone. S-Params (`gene_param_count`) count each stored value once.

    Args:
        gene: a Cluster-Learngene gene (arrays or shapes).
        target_cfg: the descendant's config.
        heads: the head count per layer, as `descend` takes it.
        head: 'inherit' or 'new', as `descend` takes it.
        embeddings: 'inherit', 'random' or None, as `descend` takes it.

    Returns:
        The I-Params count.

    Raises:
        GeneError: as `descendant_state` (`gene`, `target_cfg` and the options do not make a
          descendant).
    """
    blocks = _check_gene(gene)
    state = jax.eval_shape(lambda g: descendant_state(
        g, target_cfg, key=jax.random.key(0), heads=heads, head=head, embeddings=embeddings), gene)
    params = state['params']
    n = common.count(params['blocks'][:min(target_cfg.depth, len(blocks))])
    n += sum(g['phi']['fc1']['kernel'].shape[0] * common.count(g['mlp'])
             for g in state['ffn_groups'])
    if embeddings is None:   # as `common.embeddings_and_heads` decides
        embeddings = 'inherit' if any(k in gene for k in common.EMBED_KEYS) else 'random'
    inherited = (common.EMBED_KEYS if embeddings == 'inherit' else ()) + (
        common.HEAD_KEYS if head == 'inherit' else ())
    return n + common.count({k: v for k, v in params.items() if k in inherited})


# ----------------------------------------------------------------------------------------
# φ: the element-wise FFN expansion.

def init_phi(key: jax.Array | None, k: int, *, init: str = 'identity') -> Params:
    """φ: R → R^k for a group of k ≥ 2 layers, φ(w) = W₂·ReLU(W₁w + b₁) + b₂.

    init='identity' (the default; the paper does not fix φ's init): W₁ = (1, −1, 0, …),
    b₁ = 0, every column of W₂ = (1, −1, 0, …), b₂ = 0, so every output is ReLU(w) −
    ReLU(−w) = w: each layer of the group starts as the representative FFN, and training φ
    lets them part. init='official': PyTorch's default Linear init, as the official
    `transform_mlp(1, k)` (fc1 (1 → k) kernel and bias U(−1, 1); fc2 (k → k) U(±1/√k)),
    whose outputs are about a·w + c with |a| ≪ 1: close to re-randomised FFNs.

    Args:
        key: the PRNG key; needed for init='official', not used by 'identity'.
        k: the group's number of layers, at least 2.
        init: 'identity' or 'official' (`PHI_INITS`).

    Returns:
        φ as float32 arrays, fc1 with kernel and bias of shape (k,) and fc2 with kernel
        (k, k) and bias (k,), in `{'fc1': {'kernel', 'bias'}, 'fc2': {'kernel', 'bias'}}`.

    Raises:
        GeneError: `init` is not one of `PHI_INITS`, `k` < 2, or init='official' without a
          `key`.
    """
    common.check_choice('init_phi', 'init', init, PHI_INITS)
    if k < 2:
        raise GeneError(f'init_phi: an FFN group has at least 2 layers, got k={k}')
    if init == 'identity':
        pair = jnp.zeros((k,), jnp.float32).at[0].set(1.0).at[1].set(-1.0)
        return {'fc1': {'kernel': pair, 'bias': jnp.zeros((k,), jnp.float32)},
                'fc2': {'kernel': jnp.tile(pair[:, None], (1, k)),
                        'bias': jnp.zeros((k,), jnp.float32)}}
    if key is None:
        raise GeneError("init_phi(init='official'): drawing φ needs a PRNG key (key=...)")
    k1, k2, k3, k4 = jax.random.split(key, 4)
    b = 1.0 / math.sqrt(k)
    u = functools.partial(jax.random.uniform, dtype=jnp.float32)
    return {'fc1': {'kernel': u(k1, (k,), minval=-1.0, maxval=1.0),
                    'bias': u(k2, (k,), minval=-1.0, maxval=1.0)},
            'fc2': {'kernel': u(k3, (k, k), minval=-b, maxval=b), 'bias': u(k4, (k,), minval=-b, maxval=b)}}


def expand_ffn(mlp: Params, phi: Params) -> list[Params]:
    """The k FFNs φ generates from `mlp`: every scalar w of every leaf becomes
    W₂·ReLU(W₁w + b₁) + b₂ ∈ R^k, whose t-th entry goes to FFN t.

    Args:
        mlp: the group's representative FFN (one layer's 'mlp' tree).
        phi: φ for a group of k layers (`init_phi`).

    Returns:
        A list of k FFN trees, each with `mlp`'s structure and shapes.
    """
    def one(x):
        hidden = jax.nn.relu(x[..., None] * phi['fc1']['kernel'] + phi['fc1']['bias'])
        return hidden @ phi['fc2']['kernel'] + phi['fc2']['bias']   # (..., k)
    expanded = jax.tree.map(one, mlp)
    k = phi['fc1']['kernel'].shape[0]
    return [jax.tree.map(lambda x, t=t: x[..., t], expanded) for t in range(k)]


# ----------------------------------------------------------------------------------------
# Descendants.

def descendant_config(cfg: ViTConfig, heads: Sequence[int], *, depth: int | None = None,
                      num_classes: int | None = None, official: bool = False) -> ViTConfig:
    """A descendant's config: the ancestor's `cfg` with num_heads = max(heads) at the same
    head_dim (the most heads a layer has; the params carry each layer's count).

    Args:
        cfg: the ancestor's config.
        heads: the head count per descendant layer.
        depth: the descendant's depth, at least 1; None is `len(heads)`.
        num_classes: the descendant's class count; None keeps `cfg`'s.
        official: set qkv_bias=False, as an official-form gene needs.

    Returns:
        The descendant's `ViTConfig`.

    Raises:
        GeneError: `depth` is given and less than 1.
    """
    if depth is not None and depth < 1:
        raise GeneError(f'cluster.descendant_config: depth={depth}; a descendant has at least 1 '
                        'layer (None: one per entry of heads)')
    changes: dict[str, Any] = dict(depth=len(heads) if depth is None else depth, num_heads=int(max(heads)),
                                   head_dim=cfg.head_dim)
    if num_classes is not None:
        changes['num_classes'] = num_classes
    if official:
        changes['qkv_bias'] = False
    return cfg.replace(**changes)


def _slots(c: int, h: int) -> np.ndarray:
    """Priority weight sharing: slot k takes centroid k mod c."""
    return np.arange(h) % c


def _attention(attn: Params, h: int, official: bool, what: str) -> Params:
    """A descendant layer's attention with `h` heads from the gene layer's `attn`."""
    if not official:
        return _take_heads(attn, _slots(attn['q']['kernel'].shape[1], h))
    chunks = attn['qkv_chunks']
    d, c, three_dh = chunks.shape
    dh = three_dh // 3
    fused = chunks[:, _slots(c, h)].reshape(d, 3, h, dh)       # read back as (q|k|v, head, dim)
    out = {n: {'kernel': fused[:, i]} for i, n in enumerate('qkv')}
    o = attn['out']
    h_a = o['kernel'].shape[0]
    if h <= h_a:
        kernel = o['kernel'][:h]                               # the first h heads' columns
    elif h % h_a:
        raise GeneError(f'{what}(official): {h} heads from an ancestor layer of {h_a}: the '
                        "official output projection repeats columns ⌊1/ω⌋ times and needs a "
                        f'multiple of {h_a}')
    else:
        flat = o['kernel'].reshape(h_a * dh, -1)
        kernel = flat[np.arange(h * dh) // (h // h_a)].reshape(h, dh, -1)
    out['out'] = {'kernel': kernel, 'bias': o['bias']}
    return out


def descendant_state(gene: Gene, target_cfg: ViTConfig, *, key: jax.Array | None = None,
                     heads: Sequence[int] | None = None, head: str = 'inherit',
                     embeddings: str | None = None, phi: str = 'identity') -> Params:
    """A descendant as trainable state with its FFN expansions φ explicit:
    {'params': descendant params whose FFN-group layers have no 'mlp' (list layout),
    'ffn_groups': [{'mlp': the group's representative FFN, 'phi': φ}, ...]};
    `materialize_descendant` turns it into params (so φ and the representative train).

    `heads`: the head count per layer (`head_schedule` makes one from ω); None gives every
    layer target_cfg.num_heads. A layer may not have more heads than target_cfg.num_heads
    (the most its layout allows: `descendant_config`). `phi`: φ's init (`init_phi`:
    'identity', function-preserving, or 'official'). `key` draws the head (head='new'), φ
    (phi='official'), layers beyond the ancestor's depth and, with embeddings='random', the
    embeddings.

    Args:
        gene: a Cluster-Learngene gene.
        target_cfg: the descendant's config (`descendant_config`).
        key: the PRNG key, for what is drawn (above).
        heads: the head count per layer; None gives every layer `target_cfg.num_heads`.
        head: 'inherit' or 'new'.
        embeddings: 'inherit', 'random', or None (inherit; the gene holds them).
        phi: φ's init, 'identity' or 'official'.

    Returns:
        The state `{'params', 'ffn_groups'}` (above). FFN groups are cut to the target's
        depth; a group cut to one layer keeps its FFN in 'params'.

    Raises:
        GeneError: `gene` is not a Cluster-Learngene gene, `heads` is not `depth` positive
          counts, a layer asks for more heads than `target_cfg.num_heads`, an official-form
          gene meets a target with q/k/v biases or (official form) a layer's heads exceed
          the ancestor's by a non-multiple, the shapes do not fit, an option is not one of
          its choices, or something must be drawn and there is no `key`.
    """
    what = 'cluster'
    blocks = _check_gene(gene)
    official = is_official(gene)
    depth, gene_depth = target_cfg.depth, len(blocks)
    counts = ((target_cfg.num_heads,) * depth if heads is None
              else head_schedule(target_cfg.num_heads, depth, heads=heads))
    too_many = [l for l, h in enumerate(counts) if h > target_cfg.num_heads]
    if too_many:
        l = too_many[0]
        raise GeneError(f'{what}: layer {l} asks for {counts[l]} heads but the target config allows '
                        f'at most num_heads={target_cfg.num_heads} per layer; use '
                        'descendant_config(cfg, heads)')
    if official and target_cfg.qkv_bias:
        raise GeneError(f'{what}: the official-form gene has no q/k/v biases; build the target '
                        'with qkv_bias=False (descendant_config(..., official=True))')
    # Shapes first: every inherited layer as built, against init_block of its head count.
    mlp = None
    for l in range(min(depth, gene_depth)):
        mlp = blocks[l].get('mlp', mlp)       # a group's layers: the representative's shapes
        built = jax.eval_shape(lambda b=blocks[l], m=mlp, h=counts[l]: {
            **{k: v for k, v in b.items() if k not in ('attn', 'mlp')},
            'attn': _attention(b['attn'], h, official, what), 'mlp': m})
        want = jax.eval_shape(lambda h=counts[l]: vit.init_block(target_cfg, jax.random.key(0),
                                                                   num_heads=h))
        common.check_fits(built, want, what, target_cfg, prefix=f'blocks/{l}/', complete=True)
    common.check_choice(what, 'phi', phi, PHI_INITS)
    groups = [g for g in (tuple(i for i in g if i < depth) for g in gene_groups(gene)) if len(g) > 1]
    if key is None and (depth > gene_depth or (groups and phi == 'official')):
        need = ('layers beyond the ancestor depth' if depth > gene_depth
                else "the FFN groups' expansion φ (phi='official')")
        raise GeneError(f'{what}: {need} are drawn fresh and need a PRNG key (key=...)')
    k_top, k_phi, k_layers = jax.random.split(key, 3) if key is not None else (None,) * 3
    params = common.embeddings_and_heads(
        gene, target_cfg, head=head, embeddings=embeddings, what=what,
        fresh=None if key is None else (lambda: vit.init_embeddings(target_cfg, k_top)))
    grouped = {l for g in groups for l in g}     # a group cut to one layer keeps its FFN
    out_blocks = []
    for l in range(depth):
        if l >= gene_depth:
            out_blocks.append(vit.init_block(target_cfg, jax.random.fold_in(k_layers, l),
                                             num_heads=counts[l]))
            continue
        block = {k: v for k, v in blocks[l].items() if k not in ('attn', 'mlp')}
        block['attn'] = _attention(blocks[l]['attn'], counts[l], official, what)
        if l not in grouped:
            block['mlp'] = blocks[l]['mlp']
        out_blocks.append(block)
    params['blocks'] = out_blocks
    return {'params': params,
            'ffn_groups': [{'mlp': blocks[g[0]]['mlp'],
                            'phi': init_phi(None if k_phi is None else jax.random.fold_in(k_phi, i),
                                            len(g), init=phi)}
                           for i, g in enumerate(groups)]}


def materialize_descendant(state: Params) -> Params:
    """Descendant params from `descendant_state`'s state: each group's FFNs φ(representative)
    placed into its layers (the mlp-less ones, in order); stacked layout when every block
    has the same shapes, else the list layout. Differentiable: training through it trains
    the representative FFNs and φ (the paper's trainable φ).

    Args:
        state: `descendant_state`'s output.

    Returns:
        Canonical params of the descendant.

    Raises:
        GeneError: the groups generate a different number of FFNs than there are layers
          without one.
    """
    params = dict(state['params'])
    blocks = [dict(b) for b in params['blocks']]
    missing = [l for l, b in enumerate(blocks) if 'mlp' not in b]
    generated = [m for g in state['ffn_groups'] for m in expand_ffn(g['mlp'], g['phi'])]
    if len(generated) != len(missing):
        raise GeneError(f'materialize_descendant: the FFN groups generate {len(generated)} FFNs '
                        f'for {len(missing)} layers without one')
    for l, m in zip(missing, generated):
        blocks[l]['mlp'] = m
    params['blocks'] = blocks
    shapes = [jax.tree.map(np.shape, b) for b in blocks]
    if all(s == shapes[0] for s in shapes[1:]):
        return layout.stack_blocks(params)
    return params


def descend(gene: Gene, target_cfg: ViTConfig, *, key: jax.Array | None = None,
            heads: Sequence[int] | None = None, head: str = 'inherit',
            embeddings: str | None = None, phi: str = 'identity') -> Params:
    """The descendant's params: `materialize_descendant(descendant_state(...))`.

    Jittable with `target_cfg` and the options static. Under the defaults, the gene of an
    ancestor whose heads are all their own centroids (ε = 0, or `gene_from_model` without
    clusters) at ω = 1 gives the ancestor itself. The official code's behaviour is
    `gene_from_model(..., official=True, ffn=OFFICIAL_FFN_GROUPS[...])` (or ffn='same_count'),
    then phi='official', head='new'.

    Args:
        gene: the Cluster-Learngene gene.
        target_cfg: the descendant's config (`descendant_config(cfg, heads)`: num_heads is the
          most heads a layer has).
        key: the PRNG key: draws the head (head='new'), φ (phi='official'), layers beyond the
          ancestor's depth and, with embeddings='random', the embeddings.
        heads: the head count per layer (`head_schedule` turns ω into it); None gives every
          layer `target_cfg.num_heads`.
        head: 'inherit' or 'new'.
        embeddings: None or 'inherit' copies them, 'random' draws them.
        phi: the FFN expansion's init (`init_phi`): 'identity' (function-preserving) or
          'official'.

    Returns:
        Canonical params of `target_cfg`, stacked when every layer has the same head count,
        else in the list layout.

    Raises:
        GeneError: a layer asks for more heads than `target_cfg.num_heads`, an official-form
          gene meets a target with q/k/v biases, the shapes do not fit, or something must be
          drawn and there is no `key`.
    """
    return materialize_descendant(descendant_state(gene, target_cfg, key=key, heads=heads,
                                                   head=head, embeddings=embeddings, phi=phi))


METHOD = common.register(common.Method(
    name='cluster', label='Cluster-LG', source='model', gene_from_model=gene_from_model,
    descend=descend, gene_param_count=gene_param_count,
    gene_parts=common.model_parts(blocks=('layers',)), family='cluster',
    clustering=common.Clustering(cluster=cluster_heads, random=random_centroids,
                                 ffn_groups=ffn_groups)))
