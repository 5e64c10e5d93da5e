"""What every method shares: the `Method` record and its registry, `GeneError`, shape checks
against a target config, inheriting embeddings and heads, and layer gathers.

Everything here is a pure function on parameter trees (arrays or `jax.ShapeDtypeStruct`s);
the checks read only shapes, so they run before anything is drawn and under `jax.jit`.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any
from collections.abc import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jlearngene import pytree
from jlearngene.models import layout, vit
from jlearngene.models.config import ViTConfig

Params = dict[str, Any]
Gene = Any

HEADS = ('inherit', 'new')
EMBEDDINGS = ('inherit', 'random')
SOURCES = ('learned', 'model', 'none')
# How a method's gene is made upstream in a study, one recipe per family
# (`jlearngene.experiments.recipes`): taken from the trained teacher, distilled through an
# Aux-Net, clustered from the teacher's attention heads, a slimmable network's sub-networks,
# a grown small model, or a small model mapped by an operator trained per descendant.
FAMILIES = ('teacher', 'aux', 'cluster', 'slimmable', 'grown', 'operator')
EMBED_KEYS = ('patch_embed', 'pos_embed', 'cls_token', 'dist_token', 'norm')
# The classifier: the heads and the pre-logits layer they read (`representation_size`).
# Descendants inherit or draw them together; counts without heads leave them all out.
HEAD_KEYS = ('pre_logits', 'head', 'head_dist')


class GeneError(ValueError):
    """An impossible gene / target combination; the message names the mismatch."""


# ----------------------------------------------------------------------------------------
# The parts of a gene: its structure, checked before any of its arrays is read.

PART_KINDS = {'tree': 'a tree (dict)', 'layers': 'a list of per-layer trees', 'array': 'an array'}


@dataclasses.dataclass(frozen=True)
class Part:
    """One named part of a gene (or of a part): the `kinds` it may be ('tree': a dict;
    'layers': a list of per-layer dicts; 'array': one array), whether it is `required`, and
    for a tree or the layers of a list its own named `parts` (None: not described further)."""
    kinds: tuple[str, ...] = ('tree',)
    required: bool = True
    parts: Mapping[str, Part] | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self):
        odd = [k for k in self.kinds if k not in PART_KINDS]
        if not self.kinds or odd:
            raise GeneError(f'Part kinds {self.kinds!r}: expected some of {tuple(PART_KINDS)}')


_TOP_KINDS = {'patch_embed': 'tree', 'pos_embed': 'array', 'cls_token': 'array',
              'dist_token': 'array', 'norm': 'tree', 'pre_logits': 'tree', 'head': 'tree',
              'head_dist': 'tree'}


def top_parts(required: Sequence[str] = ()) -> dict[str, Part]:
    """The embeddings and heads of a params-like tree as parts (`EMBED_KEYS`, `HEAD_KEYS`).

    Args:
        required: the keys among them that are required; the others are optional.

    Returns:
        A dict of `Part`s by key, each of the one kind its entry has in params ('tree' or 'array').
    """
    return {k: Part((_TOP_KINDS[k],), k in required) for k in EMBED_KEYS + HEAD_KEYS}


def model_parts(*, blocks: tuple[str, ...] = ('tree',), embeddings: bool = True,
                pos_embed: bool = True) -> dict[str, Part]:
    """The parts of a params-like tree: blocks, embeddings, prefix tokens, pre-logits layer and heads.

    Args:
        blocks: the kinds 'blocks' may be: 'tree' (stacked), 'layers' (one dict per layer).
        embeddings: whether the patch/position embeddings and final norm are required (else optional).
        pos_embed: False: no 'pos_embed' part at all.

    Returns:
        A dict of `Part`s by key; prefix tokens, pre-logits layer and heads are optional (they follow
        the config).
    """
    parts = {'blocks': Part(tuple(blocks)),
             **top_parts(('patch_embed', 'pos_embed', 'norm') if embeddings else ())}
    if not pos_embed:
        del parts['pos_embed']
    return parts


def _kind_of(x: Any) -> str:
    if isinstance(x, Mapping):
        return 'tree'
    if isinstance(x, (list, tuple)):
        return 'layers'
    return 'none' if x is None else 'array'


def _listing(parts: Mapping[str, Part]) -> str:
    need = [k for k, p in parts.items() if p.required]
    rest = [k for k, p in parts.items() if not p.required]
    return (', '.join(need) if need else 'no required part') + (
        f" (optional: {', '.join(rest)})" if rest else '')


def check_parts(tree: Any, parts: Mapping[str, Part], what: str, holder: str,
                path: str = '') -> None:
    """Check that `tree` is a dict with every required part of `parts`, no other key, and each part of its kind.

    Recursive where a part names its own parts; only the containers are read.

    Args:
        tree: the tree to check (a gene, a model's params, ...).
        parts: its expected parts, by key.
        what: the start of the error message.
        holder: what holds these parts, in words (e.g. "TLEG's gene").
        path: prefix of part names in messages ('a/b/' for nested ones; the recursion sets it).

    Raises:
        GeneError: `tree` (or a nested part) is not a dict, lacks a required part, has a key not in
          `parts`, or holds a part of a kind its `Part` does not allow; the message names every
          missing and unexpected part of that level.
    """
    here = f"{holder}'s '{path[:-1]}'" if path else holder
    if not isinstance(tree, Mapping):
        got = PART_KINDS.get(_kind_of(tree), 'None')
        raise GeneError(f"{what}: {f'its {path[:-1]!r}' if path else 'it'} is {got}; {here} is a "
                        f'tree of {_listing(parts)}')
    missing = [f"'{path}{k}'" for k, p in parts.items() if p.required and k not in tree]
    extra = [f"'{path}{k}'" for k in sorted(map(str, tree)) if k not in parts]
    if missing or extra:
        said = [f"no {', '.join(missing)}"] if missing else []
        said += [f"unexpected {', '.join(extra)}"] if extra else []
        raise GeneError(f"{what}: it has {' and '.join(said)}; {here} holds {_listing(parts)}")
    for k, p in parts.items():
        if k not in tree:
            continue
        kind = _kind_of(tree[k])
        if kind not in p.kinds:
            raise GeneError(f"{what}: its '{path}{k}' is {PART_KINDS.get(kind, 'None')}; in "
                            f"{holder} it is {' or '.join(PART_KINDS[x] for x in p.kinds)}")
        if p.parts is not None and kind == 'tree':
            check_parts(tree[k], p.parts, what, holder, f'{path}{k}/')
        elif p.parts is not None and kind == 'layers':
            for i, layer in enumerate(tree[k]):
                check_parts(layer, p.parts, what, holder, f'{path}{k}/{i}/')


# ----------------------------------------------------------------------------------------
# Options: the keywords of a method's verbs.

def forwards_options(to: Callable[..., Any]) -> Callable[[Callable], Callable]:
    """Decorator for a function whose `**options` go on to `to`, so its options are known and checked by name.

    Args:
        to: the function that receives the options.

    Returns:
        A decorator that sets the function's `__signature__` (what `inspect.signature` and so
        `Method.options` read) to its own parameters, `**options` left out, followed by those
        keyword-only parameters of `to` that it does not already have; it returns the function.
    """
    def wrap(fn: Callable) -> Callable:
        sig = inspect.signature(fn)
        own = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
        names = {p.name for p in own}
        more = [p for p in inspect.signature(to).parameters.values()
                if p.kind is p.KEYWORD_ONLY and p.name not in names]
        fn.__signature__ = sig.replace(parameters=own + more)
        return fn
    return wrap


# ----------------------------------------------------------------------------------------
# The method record and the registry.

def _checked_descend(descend: Callable[..., Params], name: str) -> Callable[..., Params]:
    """`descend` whose output is checked against its target config (`vit.check_params`:
    shapes only, so free at run time under `jax.jit`), naming the first mismatching leaf."""
    cfg_arg = list(inspect.signature(descend).parameters)[1]   # after the gene

    @functools.wraps(descend)
    def checked(*args, **kwargs):
        params = descend(*args, **kwargs)
        vit.check_params(params, args[1] if len(args) > 1 else kwargs[cfg_arg],
                         what=f'{name} descend output')
        return params
    checked._checks_output = True
    return checked


@dataclasses.dataclass(frozen=True)
class Operator:
    """A growth operator's verbs, for the methods that train one per descendant (Mango, LiGO).

    Attributes:
      init: `init(small_cfg, large_cfg, key, **init_options) -> operator`, a fresh operator.
      grow: `grow(operator, small_params, large_cfg, **grow_options) -> params`, the large
        model (jittable with `large_cfg` static; differentiable in the operator).
      grow_flops: `grow_flops(small_cfg, large_cfg, **init_options) -> float`, the forward
        FLOPs of one grow from shapes alone; None: XLA's cost analysis of the lowered grow.
      grow_options: which of the method's gene options are `grow`'s; the others are `init`'s
        (and `gene_from_model`'s).
    """
    init: Callable[..., Any]
    grow: Callable[..., Params]
    grow_flops: Callable[..., float] | None = None
    grow_options: tuple[str, ...] = ()

    def split(self, options: Mapping[str, Any]) -> tuple[dict, dict]:
        """Split a method's gene options between the operator's `init` and `grow`.

        Args:
            options: the method's gene options.

        Returns:
            `(init options, grow options)`, the options not in `grow_options` and those in it.
        """
        return ({k: v for k, v in options.items() if k not in self.grow_options},
                {k: v for k, v in options.items() if k in self.grow_options})


@dataclasses.dataclass(frozen=True)
class Slimmable:
    """How one slimmable network trains, for the methods whose gene is one (Scala, US-Net,
    MatFormer). Every callable takes the slicing `rule` ('clean' or 'official'; a method
    with one rule refuses the other).

    Attributes:
      grid: `grid(smallest, granularity) -> ratios`, the widths it is trained at.
      loss: `loss(cfg, grid, *, rule, **loss_options) -> loss_fn(params, batch, rng)`.
      warmup_loss: `warmup_loss(cfg, *, rule) -> loss_fn`, the full-width warm-up's loss.
      subnet_config: `subnet_config(cfg, ratio, *, rule) -> ViTConfig`, a sub-network's.
      plan: `plan(grid, warmup_steps, steps) -> ((ratio, steps), ...)`, the forward-backward
        passes each width gets over the run (warm-up included), for its training FLOPs.
      loss_options: the keyword options `loss` takes beyond the rule.
    """
    grid: Callable[[float, float], tuple[float, ...]]
    loss: Callable[..., Callable]
    warmup_loss: Callable[..., Callable]
    subnet_config: Callable[..., ViTConfig]
    plan: Callable[..., tuple[tuple[float, float], ...]]
    loss_options: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Clustering:
    """How a clustered gene is made from per-head statistics of a trained model
    (Cluster-Learngene): the statistic is the heads' mean attention distance
    (`jlearngene.diagnostics.mean_attention_distance`).

    Attributes:
      cluster: `cluster(distances (L, H), eps, min_heads) -> clusters per layer`, each with
        its `centroids`.
      random: `random(clusters, num_heads, seed) -> head indices per layer`, as many heads as
        each layer has centroids, drawn at random (the control).
      ffn_groups: `ffn_groups(centroid_counts, rule, *, heads) -> layer groups` sharing one
        FFN.
    """
    cluster: Callable[..., Any]
    random: Callable[..., Any]
    ffn_groups: Callable[..., Any]


@dataclasses.dataclass(frozen=True)
class Method:
    """One initialisation method, described by the same verbs as every other.

    Attributes:
      name: registry key ('tleg', 'he_lg', ...).
      label: display name ('TLEG', 'He-LG', ...).
      source: where the gene comes from. 'learned': `init_gene(cfg, key, **options)` makes a
        fresh gene that is trained through `materialize(trainable, frozen, cfg) -> params`.
        'model': `gene_from_model(params, cfg, **options)` takes it from a trained model of
        config `cfg`. 'none': no gene (it is None).
      descend: `descend(gene, target_cfg, *, key=None, **options) -> params`, the canonical
        stacked params of a descendant of shape `target_cfg`; jittable with the config and
        options static; raises GeneError for impossible requests. The record holds it
        checked (`_checked_descend`): params that do not fit `target_cfg` are a ConfigError.
      gene_param_count: `gene_param_count(gene, *, include_head=False) -> int`, the parameters
        the method stores (S-Params): the gene's leaves that `descend` reads.
      gene_per_target: without a source model, one gene per distinct target shape is stored
        (Pre-Fin pretrains a model at each size).
      gene_parts: the named parts of the method's gene (`Part`s by key; None exactly for
        source 'none'); `check_gene` refuses a gene without them, e.g. another method's.
      family: how a study makes its gene upstream (one of `FAMILIES`; None: no gene to make,
        as Scratch). A study runs it through that family's recipe.
      descend_defaults: descend options every study run of the method gets (He-LG: a new
        head, its learngene being the layers).
      target_options: `target_options(options, target_cfg, source_cfg) -> options`, the gene
        options for one descendant (He-LG's k follows the descendant's depth).
      trainable_decay: path regexes of the gene's leaves that get weight decay while it
        trains (None: the optimiser's default).
      operator: the growth operator's verbs (family 'operator').
      slimmable: the slimmable network's training (family 'slimmable').
      clustering: how heads are clustered into the gene (family 'cluster').
      row_label: `row_label(gene_options) -> str`, the text in parentheses after the label in
        a study's tables ('R=2' for Mango); None: the variant's value, if any.
    """
    name: str
    label: str
    source: str
    descend: Callable[..., Params] = dataclasses.field(repr=False)
    gene_param_count: Callable[..., int] = dataclasses.field(repr=False)
    init_gene: Callable[..., Gene] | None = dataclasses.field(default=None, repr=False)
    materialize: Callable[..., Params] | None = dataclasses.field(default=None, repr=False)
    gene_from_model: Callable[..., Gene] | None = dataclasses.field(default=None, repr=False)
    gene_per_target: bool = False
    gene_parts: Mapping[str, Part] | None = dataclasses.field(default=None, repr=False,
                                                              compare=False)
    family: str | None = None
    descend_defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False)
    target_options: Callable[..., dict] | None = dataclasses.field(default=None, repr=False)
    trainable_decay: tuple[str, ...] | None = None
    operator: Operator | None = dataclasses.field(default=None, repr=False)
    slimmable: Slimmable | None = dataclasses.field(default=None, repr=False)
    clustering: Clustering | None = dataclasses.field(default=None, repr=False)
    row_label: Callable[[Mapping[str, Any]], str] | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self):
        if not getattr(self.descend, '_checks_output', False):
            object.__setattr__(self, 'descend', _checked_descend(self.descend, self.name))
        if self.source not in SOURCES:
            raise GeneError(f'method {self.name!r}: source={self.source!r}; expected one of {SOURCES}')
        need = {'learned': ('init_gene', 'materialize'), 'model': ('gene_from_model',),
                'none': ()}[self.source]
        for verb in ('init_gene', 'materialize', 'gene_from_model'):
            given = getattr(self, verb) is not None
            if given != (verb in need):
                raise GeneError(f"method {self.name!r} with source={self.source!r} "
                                f"{'needs' if verb in need else 'takes no'} {verb}")
        if self.family is not None and self.family not in FAMILIES:
            raise GeneError(f'method {self.name!r}: family={self.family!r}; expected one of {FAMILIES}')
        for verbs, family in ((self.operator, 'operator'), (self.slimmable, 'slimmable'),
                              (self.clustering, 'cluster')):
            if (verbs is not None) != (self.family == family):
                raise GeneError(f"method {self.name!r} of family {self.family!r} "
                                f"{'takes no' if verbs is not None else 'needs'} {family} verbs")
        if (self.gene_parts is None) != (self.source == 'none'):
            raise GeneError(f"method {self.name!r} with source={self.source!r} "
                            f"{'takes no' if self.source == 'none' else 'needs'} gene_parts "
                            '(the parts of its gene, for check_gene)')

    def check_gene(self, gene: Any) -> None:
        """Check that `gene` has the parts of this method's gene (`gene_parts`; None for source 'none').

        Reads only the containers, so it runs before anything reads the gene's arrays.

        Args:
            gene: the gene to check.

        Raises:
            GeneError: for source 'none', `gene` is not None; otherwise (`check_parts`) it is not a
              dict or lacks, adds or mistypes a part; the message names the method and every missing
              or unexpected part.
        """
        what = f'not a gene of {self.label} ({self.name!r})'
        if self.source == 'none':
            if gene is not None:
                raise GeneError(f'{what}: {self.label} has no gene (None), got '
                                f'{PART_KINDS.get(_kind_of(gene), type(gene).__name__)}')
            return
        check_parts(gene, self.gene_parts, what, f"{self.label}'s gene")

    def options(self, verb: str = 'descend') -> tuple[str, ...] | None:
        """The keyword options of one of the method's verbs.

        Args:
            verb: 'descend', 'gene_from_model' or 'init_gene'.

        Returns:
            The names of its parameters after the leading gene/params and config ('key' and
            `*args` excluded); None where it takes any keywords (`**options` not declared with
            `forwards_options`).

        Raises:
            GeneError: the method has no `verb` (e.g. `init_gene` for source 'model').
        """
        fn = getattr(self, verb, None)
        if fn is None:
            raise GeneError(f'{self.label} ({self.name!r}, source {self.source!r}) has no {verb}')
        params = list(inspect.signature(fn).parameters.values())
        if any(p.kind is p.VAR_KEYWORD for p in params):
            return None
        return tuple(p.name for p in params[2:] if p.name != 'key' and p.kind is not p.VAR_POSITIONAL)

    def check_options(self, options: Mapping[str, Any], verb: str = 'descend',
                      flag: str = '--option') -> None:
        """Check that `verb` takes every one of `options` (no check where it takes any keywords).

        Args:
            options: the options by name (only the names are read).
            verb: 'descend', 'gene_from_model' or 'init_gene'.
            flag: how an option is named at the start of the message (e.g. the command-line flag).

        Raises:
            GeneError: an option that `verb` does not take (the first one, with the ones it does),
              or the method has no `verb` (`options`).
        """
        known = self.options(verb)
        if known is None:
            return
        for name in options:
            if name not in known:
                raise GeneError(f'{flag} {name}: {self.label} ({self.name!r}) {verb} has no option '
                                f"{name!r}; its options: {', '.join(known) or 'none'}")

    def gene_shapes(self, cfg: ViTConfig, **options: Any) -> Gene:
        """Shapes of the gene that `init_gene` or `gene_from_model` makes for a source of config `cfg`.

        Nothing is allocated (`jax.eval_shape`).

        Args:
            cfg: the config of the gene's source (the learned gene's, or the trained model's).
            **options: the gene options, passed on to `init_gene` or `gene_from_model`.

        Returns:
            The gene with `jax.ShapeDtypeStruct` leaves; None for source 'none'.

        Raises:
            GeneError: source 'none' with any `options`; whatever `init_gene` or
              `gene_from_model` raises for impossible options.
        """
        if self.source == 'learned':
            return jax.eval_shape(lambda: self.init_gene(cfg, jax.random.key(0), **options))
        if self.source == 'model':
            return jax.eval_shape(lambda: self.gene_from_model(
                vit.init(cfg, jax.random.key(0)), cfg, **options))
        if options:
            raise GeneError(f'{self.name} has no gene, so no gene options (got {sorted(options)})')
        return None


_REGISTRY: dict[str, Method] = {}


def register(method: Method) -> Method:
    """Add `method` to the registry under `method.name`.

    Args:
        method: the method.

    Returns:
        `method`, so that a module can write `METHOD = register(Method(...))`.

    Raises:
        GeneError: another method is registered under that name.
    """
    if method.name in _REGISTRY and _REGISTRY[method.name] is not method:
        raise GeneError(f'a method named {method.name!r} is already registered')
    _REGISTRY[method.name] = method
    return method


def get(name: str) -> Method:
    """The registered method `name`.

    Args:
        name: a registered name (`names()`).

    Returns:
        Its `Method`.

    Raises:
        GeneError: no method has that name (the message lists the known ones).
    """
    try:
        return _REGISTRY[name]
    except KeyError:
        raise GeneError(f'unknown method {name!r}; known: {names()}') from None


def names() -> tuple[str, ...]:
    """Registered method names, in registration order.

    Returns:
        A tuple of the names `get` accepts.
    """
    return tuple(_REGISTRY)


# ----------------------------------------------------------------------------------------
# Choices, shapes and checks.

def check_choice(what: str, option: str, value: Any, choices: Sequence[str]) -> None:
    """Check that an option's value is one of its choices.

    Args:
        what: the start of the error message.
        option: the option's name, for the message.
        value: its value.
        choices: the values allowed.

    Raises:
        GeneError: `value` is not one of `choices`.
    """
    if value not in choices:
        raise GeneError(f'{what}: {option}={value!r}; expected one of {tuple(choices)}')


def target_shapes(cfg: ViTConfig) -> Params:
    """Shapes of `vit.init(cfg)` (nothing is allocated).

    Args:
        cfg: the model config.

    Returns:
        Its params (stacked layout) with `jax.ShapeDtypeStruct` leaves.
    """
    return jax.eval_shape(lambda: vit.init(cfg, jax.random.key(0)))


def block_shapes(blocks: Any) -> Any:
    """Shapes of one block of a stacked `blocks` tree.

    Args:
        blocks: stacked blocks (arrays or `jax.ShapeDtypeStruct`s with a leading layers axis).

    Returns:
        The same tree of `jax.ShapeDtypeStruct`s, the leading layers axis dropped, dtypes kept.
    """
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x)[1:], x.dtype), blocks)


def shape_str(cfg: ViTConfig) -> str:
    """The config fields that fix parameter shapes, for error messages.

    Args:
        cfg: the model config.

    Returns:
        `'width=..., num_heads=..., head_dim=..., mlp_dim=..., patch_size=..., image_size=...,
        num_classes=...'`.
    """
    return (f'width={cfg.width}, num_heads={cfg.num_heads}, head_dim={cfg.head_dim}, '
            f'mlp_dim={cfg.mlp_dim}, patch_size={cfg.patch_size}, image_size={cfg.image_size}, '
            f'num_classes={cfg.num_classes}')


def check_fits(got: Any, want: Any, what: str, cfg: ViTConfig, *, source: str = 'gene',
               prefix: str = '', complete: bool = False, hint: str = '',
               config: str = 'the target config') -> None:
    """Check that every leaf of `got` exists in `want` with the same shape (only shapes are read).

    Args:
        got: the tree to check (arrays or `jax.ShapeDtypeStruct`s).
        want: the shapes it must fit, those of `cfg` (or a subtree of them).
        what: the start of the error message.
        cfg: the config `want` comes from; its shape fields go in the message.
        source: what `got` is, in words ('gene', 'model', ...).
        prefix: prepended to the paths in the message (where `got` is a subtree).
        complete: also require that `want` has no leaf that `got` lacks.
        hint: appended to the message.
        config: what `cfg` is, in words.

    Raises:
        GeneError: a leaf of `got` that `want` lacks or has in another shape, or with `complete`
          a leaf of `want` that `got` lacks; the message names the first such path.
    """
    fg, fw = pytree.flatten(got), pytree.flatten(want)
    where = f'{config} ({shape_str(cfg)})'
    for path, leaf in fg.items():
        name = f'{prefix}{path}'
        if path not in fw:
            raise GeneError(f"{what}: the {source} has '{name}', which {where} does not have{hint}")
        if tuple(np.shape(leaf)) != tuple(np.shape(fw[path])):
            raise GeneError(f"{what}: the {source}'s '{name}' has shape {tuple(np.shape(leaf))} "
                            f'but {where} needs {tuple(np.shape(fw[path]))}{hint}')
    if complete:
        missing = [p for p in fw if p not in fg]
        if missing:
            raise GeneError(f"{what}: {where} needs '{prefix}{missing[0]}' but the {source} "
                            f'has none{hint}')


def check_no_pre_logits(source: ViTConfig | Mapping[str, Any], what: str) -> None:
    """Refuse a model with a pre-logits layer, for the width-changing methods.

    They resize the head's input along 'embed'; a `pre_logits` layer
    (`ViTConfig.representation_size`) puts the head on its own 'repr' axis, which they do not
    resize.

    Args:
        source: a config, or a params-like tree.
        what: the start of the error message.

    Raises:
        GeneError: the config has a `representation_size`, or the tree a 'pre_logits' entry.
    """
    has = (source.representation_size if isinstance(source, ViTConfig)
           else 'pre_logits' in source)
    if has:
        raise GeneError(f'{what}: models with a pre_logits layer (representation_size) are not '
                        'supported by width-changing methods; load the backbone without '
                        'pre_logits/* and head/* (head=\'new\')')


def check_model(params: Params, cfg: ViTConfig, what: str) -> Params:
    """`params` in the stacked layout, checked to be a whole model of config `cfg`.

    Args:
        params: a model's params, in either layout.
        cfg: its config.
        what: the start of error messages.

    Returns:
        `params` in the stacked layout.

    Raises:
        GeneError: its parts are not a model's (`model_parts`), its list-layout blocks differ in
          shape, its depth is not `cfg.depth`, or a leaf is extra, missing or of another shape
          than `cfg` gives.
    """
    check_parts(params, model_parts(blocks=('tree', 'layers')), f"{what}: not a model's params",
                'a model')
    params = stacked(params, what)
    want = target_shapes(cfg)
    if layout.depth_of(params) != cfg.depth:
        raise GeneError(f'{what}: the model has {layout.depth_of(params)} layers but its config '
                        f'says depth={cfg.depth}')
    check_fits(params, want, what, cfg, source='model', complete=True, config='its config')
    return params


# ----------------------------------------------------------------------------------------
# Embeddings and heads.

def top_level(tree: Mapping[str, Any]) -> Params:
    """The embeddings and heads of a params-like tree (everything but blocks).

    Args:
        tree: a params-like tree.

    Returns:
        A new dict of its entries under `EMBED_KEYS` and `HEAD_KEYS`.
    """
    return {k: v for k, v in tree.items() if k in EMBED_KEYS + HEAD_KEYS}


def embeddings_and_heads(source: Mapping[str, Any], target_cfg: ViTConfig, *, head: str,
                         embeddings: str | None, fresh: Callable[[], Mapping[str, Any]] | None,
                         what: str, want: Params | None = None, src: str = 'gene') -> Params:
    """A descendant's top-level params: embeddings, prefix tokens, final norm and heads.

    A pre-logits layer (`representation_size`) goes with the heads: inherited only together
    with them, so source and target must agree on having one. Every check runs on shapes
    before `fresh` is called.

    Args:
        source: the gene or model to inherit from (its top-level entries are read).
        target_cfg: the descendant's config.
        head: 'inherit' (same class count) or 'new' (fresh).
        embeddings: patch/position embeddings, prefix tokens and final norm: 'inherit' from
          `source` or 'random' (fresh); None: inherit exactly when `source` holds embeddings.
        fresh: returns freshly drawn top-level params of `target_cfg`; called only when
          something is drawn. None: no key was given.
        what: the start of error messages.
        want: the descendant's param shapes (None: `target_shapes(target_cfg)`); only its
          top-level entries are made.
        src: what `source` is, in words, for messages.

    Returns:
        The top-level entries of `want`, each taken from `source` or from `fresh()`.

    Raises:
        GeneError: `head` or `embeddings` is not a valid choice; head='inherit' with no head in
          `source`, or with a pre-logits layer that the target lacks; a part to inherit is
          missing from `source` or does not fit `target_cfg`; something is drawn and `fresh`
          is None.
    """
    check_choice(what, 'head', head, HEADS)
    if embeddings is None:
        embeddings = 'inherit' if any(k in source for k in EMBED_KEYS) else 'random'
    check_choice(what, 'embeddings', embeddings, EMBEDDINGS)
    want = target_shapes(target_cfg) if want is None else want
    inherit, draw = [], []
    for k in (k for k in EMBED_KEYS if k in want):
        (inherit if embeddings == 'inherit' else draw).append(k)
    heads = [k for k in HEAD_KEYS if k in want]
    if heads and head == 'inherit':
        if not any(k in source for k in HEAD_KEYS):
            raise GeneError(f"{what}(head='inherit'): the {src} has no head; use head='new'")
        if 'pre_logits' in source and 'pre_logits' not in want:
            r = np.shape(source['pre_logits']['kernel'])[-1]
            raise GeneError(f"{what}(head='inherit'): the {src}'s head reads a pre-logits layer "
                            f'of size {r}, which the target config does not have; set '
                            f"representation_size={r} or use head='new'")
        inherit += heads
    else:
        draw += heads
    missing = [k for k in inherit if k not in source]
    if missing:
        fix = ("head='new'" if missing[0] in HEAD_KEYS else
               "embeddings='random' or a matching class_token/distill_token")
        raise GeneError(f"{what}: the target config needs '{missing[0]}' but the {src} has none "
                        f'(it has {sorted(top_level(source))}); use {fix}')
    for k in inherit:
        hint = "; use head='new' with a key for a different number of classes" if k in HEAD_KEYS else ''
        check_fits({k: source[k]}, {k: want[k]}, what, target_cfg, source=src, complete=True,
                   hint=hint)
    if draw and fresh is None:
        raise GeneError(f'{what}: drawing {draw} fresh needs a PRNG key (key=...)')
    drawn = fresh() if draw else {}
    return {**{k: source[k] for k in inherit}, **{k: drawn[k] for k in draw}}


# ----------------------------------------------------------------------------------------
# Layers.

def stacked(params: Params, what: str) -> Params:
    """`params` in the stacked layout (list-layout blocks are stacked).

    Args:
        params: a params-like tree with 'blocks', in either layout.
        what: the start of the error message.

    Returns:
        `params` itself if stacked, else a copy with its blocks stacked.

    Raises:
        GeneError: list-layout blocks that are none or differ in structure or shape.
    """
    if layout.is_stacked(params):
        return params
    try:
        return layout.stack_blocks(params)
    except ValueError as e:
        raise GeneError(f'{what}: {e}') from None


def num_layers(blocks: Any) -> int:
    """Length of the leading layers axis of a stacked `blocks` tree.

    Args:
        blocks: stacked blocks.

    Returns:
        The number of layers (0 when the tree has no leaves).
    """
    leaves = jax.tree.leaves(blocks)
    return int(np.shape(leaves[0])[0]) if leaves else 0


def gather_layers(blocks: Any, index: Sequence[int] | np.ndarray) -> Any:
    """Layers `index` of a stacked `blocks` tree, stacked in that order.

    Args:
        blocks: stacked blocks.
        index: layer indices (any order, repeats allowed).

    Returns:
        The blocks with `len(index)` layers, layer `i` being layer `index[i]` of `blocks`.
    """
    idx = np.asarray(index, dtype=np.int32)
    return jax.tree.map(lambda x: x[idx], blocks)


def place_layers(target: Any, dst: Sequence[int] | np.ndarray, source: Any,
                 src: Sequence[int] | np.ndarray) -> Any:
    """`target` with layers `dst[i]` replaced by layer `src[i]` of `source`.

    Args:
        target: stacked blocks.
        dst: the layers of `target` to replace.
        source: stacked blocks of the same structure.
        src: the layers of `source` to put there, one per entry of `dst`.

    Returns:
        `target` with those layers replaced (jax arrays, cast to `target`'s dtypes).

    Raises:
        GeneError: `dst` and `src` differ in shape.
    """
    d, s = np.asarray(dst, dtype=np.int32), np.asarray(src, dtype=np.int32)
    if d.shape != s.shape:
        raise GeneError(f'place_layers: {d.size} target layers but {s.size} source layers')
    return jax.tree.map(lambda t, x: jnp.asarray(t).at[d].set(jnp.asarray(x)[s].astype(t.dtype)),
                        target, source)


def stack_layers(blocks: Sequence[Any]) -> Any:
    """Per-layer block trees stacked on a leading layers axis.

    Args:
        blocks: per-layer trees, all of the same structure and shapes.

    Returns:
        One tree whose leaves have a leading layers axis of length `len(blocks)`.

    Raises:
        GeneError: `blocks` is empty, or a layer differs from layer 0 in structure or shapes.
    """
    if not blocks:
        raise GeneError('stack_layers: no layers')
    for i, b in enumerate(blocks[1:], start=1):
        diff = pytree.structure_diff(blocks[0], b)
        if any(diff.values()):
            raise GeneError(f'stack_layers: layer {i} differs from layer 0 ({pytree.describe_diff(diff)})')
    return jax.tree.map(lambda *xs: jnp.stack(xs), *blocks)


def merge_disjoint(a: Mapping, b: Mapping, what: str, names: tuple[str, str] = ('a', 'b'),
                   path: str = '') -> dict:
    """Nested union of two trees whose leaves do not overlap.

    Args:
        a: a tree of dicts.
        b: another.
        what: the start of the error message.
        names: what `a` and `b` are, in words, for the message.
        path: prefix of the paths in the message (the recursion sets it).

    Returns:
        A new dict with the entries of both (dicts under the same key merged); the inputs are
        not modified.

    Raises:
        GeneError: both trees hold something under the same path that is not a dict in both.
    """
    out = dict(a)
    for k, v in b.items():
        p = f'{path}{k}'
        if k in out:
            if isinstance(out[k], Mapping) and isinstance(v, Mapping):
                out[k] = merge_disjoint(out[k], v, what, names, f'{p}/')
            else:
                raise GeneError(f"{what}: '{p}' is both {names[0]} and {names[1]}")
        else:
            out[k] = v
    return out


def count(tree: Any, *, include_head: bool = True) -> int:
    """Parameters in a tree.

    Args:
        tree: a params-like tree (arrays or `jax.ShapeDtypeStruct`s), or None.
        include_head: False: leave out the top-level classifier (`HEAD_KEYS`: 'pre_logits',
          'head', 'head_dist').

    Returns:
        The number of scalar parameters (0 for None).
    """
    if tree is None:
        return 0
    if not include_head and isinstance(tree, Mapping):
        tree = {k: v for k, v in tree.items() if k not in HEAD_KEYS}
    return pytree.count_params(tree, groups=None)['total']
