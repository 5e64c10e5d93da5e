"""The Sphinx extension of the jlearngene docs: what this site generates from the code.

* **API pages** (`docs/api/`, written at `builder-inited`): one page per public module of
  `jlearngene` and its `API_PACKAGES`, each name of the module's `__all__` (else every
  public name the module itself defines) documented by autodoc where it is defined, and
  linked from every module that re-exports it.
* **Command-line pages** (`docs/_generated/cli/`): each `jlearngene` command's own argparse
  parser, captured when its `main` parses (so the page is what `--help` prints), and every
  bundled config's fields with their default values.
* **Benchmark tables** (`docs/_generated/records/`): each committed study record rendered by
  `jlearngene.experiments.study.render` (tables, verdicts, plots), the transfer headline by
  `jlearngene.experiments.headline.markdown`, and the README's short table by
  `headline.readme_table`; the pages include them, no table is written by hand.
* **Math as MathML** (`html_math_renderer = 'mathml'`): LaTeX is converted at build time by
  docutils, so equations render offline, without JavaScript.
* **A soft default role**: `name` in a docstring links to the API entry of that name where
  one exists and is inline code otherwise.
* **Checks**: a fenced Python block in a Markdown page that is not a `{code-cell}` (so not
  executed) is a warning, and so a build error under `-W`.
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import html
import importlib
import inspect
import json
import os
import pkgutil
import re
import shutil
import types

from docutils import nodes, utils
from docutils.utils.math import MathError, latex2mathml
from sphinx import addnodes
from sphinx.util import logging

logger = logging.getLogger(__name__)

DOCS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(DOCS)
GENERATED = os.path.join(DOCS, '_generated')
API_DIR = os.path.join(DOCS, 'api')

# The public API the reference covers: these modules, each package with all its public
# submodules.
API_PACKAGES = ('jlearngene', 'jlearngene.models', 'jlearngene.genes', 'jlearngene.artefacts',
                'jlearngene.costs', 'jlearngene.diagnostics', 'jlearngene.data', 'jlearngene.train',
                'jlearngene.interop', 'jlearngene.parallel', 'jlearngene.distributed', 'jlearngene.pytree',
                'jlearngene.losses', 'jlearngene.ops')
# Groups of the API index, in order: (title, module prefixes).
API_GROUPS = (
    ('Models and parameter trees', ('jlearngene', 'jlearngene.models', 'jlearngene.pytree', 'jlearngene.ops')),
    ('Methods', ('jlearngene.genes',)),
    ('Gene files and descendants', ('jlearngene.artefacts',)),
    ('Counting and diagnostics', ('jlearngene.costs', 'jlearngene.diagnostics')),
    ('Data', ('jlearngene.data',)),
    ('Training', ('jlearngene.train', 'jlearngene.losses', 'jlearngene.parallel', 'jlearngene.distributed')),
    ('Interoperability', ('jlearngene.interop',)),
)
# The committed study records the benchmark pages render: (slug, folder under the root, the
# heading of the README section whose "Measured ..." paragraph dates the record, or None for
# the README's first such paragraph).
RECORDS = (
    ('tleg_fashion', 'experiments/tleg/fashion', None), ('letra_fashion', 'experiments/letra/fashion', None),
    ('cluster_fashion', 'experiments/cluster/fashion', None),
    ('compare_fashion', 'experiments/compare/fashion', None),
    ('scala_fashion', 'experiments/scala/fashion', None), ('mango_fashion', 'experiments/mango/fashion', None),
    ('tleg_digits', 'experiments/tleg', None), ('letra_digits', 'experiments/letra', None),
    ('cluster_digits', 'experiments/cluster', '## ε = 0.7 px'),
    ('cluster_digits_eps_0.07', 'experiments/cluster/eps_0.07', '## ε = 0.07 px'),
    ('compare_digits', 'experiments/compare', None), ('scala_digits', 'experiments/scala', None),
    ('mango_digits', 'experiments/mango', None),
)
# The transfer records of the headline, in its order, and the one the README's table reads.
HEADLINE = ('experiments/tleg/fashion', 'experiments/letra/fashion', 'experiments/cluster/fashion',
            'experiments/compare/fashion')


def _write(path: str, text: str) -> None:
    """Write `text` to `path` unless it holds exactly that (an unchanged page is not rebuilt)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.exists(path):
        with open(path, encoding='utf-8') as f:
            if f.read() == text:
                return
    with open(path, 'w', encoding='utf-8') as f:
        f.write(text)


# --------------------------------------------------------------------------- math as MathML

def _mathml(tex: str, block: bool, node) -> str:
    try:
        return latex2mathml.tex2mathml(tex, as_block=block)
    except MathError as e:
        logger.warning(f'cannot convert this LaTeX to MathML ({e}): {tex!r}', location=node)
        return f'<code>{html.escape(tex)}</code>'


def _visit_math(self, node) -> None:
    self.body.append(f'<span class="math">{_mathml(node.astext(), False, node)}</span>')
    raise nodes.SkipNode


def _visit_math_block(self, node) -> None:
    ids = ' '.join(node.get('ids', []))
    self.body.append(f'<div class="math-block"{f" id={ids!r}" if ids else ""}>')
    if node.get('number'):
        self.body.append(f'<span class="eqno">({node["number"]})</span>')
    self.body.append(_mathml(node.astext(), True, node) + '</div>\n')
    raise nodes.SkipNode


# --------------------------------------------------------------------------- the soft role

_NAME = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*(\(\))?$')


def soft_role(name, rawtext, text, lineno, inliner, options=None, content=None):
    """`text`: inline code, linked to the API entry it names where there is one."""
    text = utils.unescape(text)
    literal = nodes.literal(rawtext, text, classes=['code'])
    env = getattr(inliner.document.settings, 'env', None)
    if env is None or not _NAME.match(text):
        return [literal], []
    node = addnodes.pending_xref(rawtext, refdomain='py', reftype='obj', reftarget=text.removesuffix('()'),
                                 refexplicit=True, refwarn=False, jlg_soft=True)
    node['py:module'] = env.ref_context.get('py:module')
    node['py:class'] = env.ref_context.get('py:class')
    node += literal
    return [node], []


def _missing_reference(app, env, node, contnode):
    if node.get('jlg_soft'):
        return contnode
    return None


# --------------------------------------------------------------------------- API pages

def api_modules() -> list[str]:
    """Every public module the reference documents, in `API_PACKAGES` order, each package
    followed by its public submodules (recursively, sorted)."""
    out = []

    def walk(name: str) -> None:
        if name in out:
            return
        out.append(name)
        module = importlib.import_module(name)
        if hasattr(module, '__path__') and name != 'jlearngene':
            for info in sorted(pkgutil.iter_modules(module.__path__), key=lambda i: i.name):
                if not info.name.startswith('_'):
                    walk(f'{name}.{info.name}')

    for name in API_PACKAGES:
        walk(name)
    return out


def _defined_names(module: types.ModuleType) -> list[str]:
    """The public names `module`'s own source defines at its top level, in order: functions,
    classes and assigned constants (what it imports is left out)."""
    try:
        source = inspect.getsource(module)
    except (OSError, TypeError):
        return []
    names = []
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found = [node.name]
        elif isinstance(node, ast.Assign):
            found = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found = [node.target.id]
        else:
            found = []
        names += [n for n in found if not n.startswith('_') and n not in names]
    return names


def public_names(module: types.ModuleType) -> list[str]:
    """`module.__all__` where it has one, else the public names it defines itself."""
    if hasattr(module, '__all__'):
        return [n for n in module.__all__ if n != '__version__']
    return _defined_names(module)


def _kind(obj) -> str:
    if inspect.ismodule(obj):
        return 'module'
    if not str(getattr(obj, '__module__', '') or '').startswith('jlearngene'):
        return 'data'      # another library's object under a name of ours (PyTree = Any): an alias
    if inspect.isclass(obj):
        return 'exception' if issubclass(obj, BaseException) else 'class'
    if inspect.isfunction(obj) or inspect.isbuiltin(obj) or isinstance(obj, type(len)):
        return 'function'
    if callable(obj) and hasattr(obj, '__wrapped__'):
        return 'function'
    return 'data'


def _canonical(modules: list[str]) -> dict[int, str]:
    """{id(object): 'module.name'} for every public function and class: documented where it
    is defined when that module lists it, else at the first module (in `modules` order)
    that does."""
    where: dict[int, str] = {}
    for name in modules:
        module = importlib.import_module(name)
        for attr in public_names(module):
            obj = getattr(module, attr)
            if _kind(obj) not in ('function', 'class', 'exception'):
                continue
            home = getattr(obj, '__module__', None)
            if home == name and getattr(obj, '__name__', attr) == attr:
                where[id(obj)] = f'{name}.{attr}'
            else:
                where.setdefault(id(obj), f'{name}.{attr}')
    # a definition listed in its own module wins over an earlier re-export
    for name in modules:
        module = importlib.import_module(name)
        for attr in public_names(module):
            obj = getattr(module, attr)
            if _kind(obj) in ('function', 'class', 'exception') and getattr(obj, '__module__', None) == name:
                where[id(obj)] = f'{name}.{attr}'
    return where


def _title(text: str, char: str = '=') -> str:
    return f'{text}\n{char * len(text)}\n'


def _short_value(obj) -> bool:
    try:
        return len(repr(obj)) <= 60
    except Exception:   # noqa: BLE001 - any repr that fails is not shown
        return False


def module_page(name: str, modules: list[str], canonical: dict[int, str]) -> str:
    """The reStructuredText of one module's API page."""
    module = importlib.import_module(name)
    here, elsewhere, submodules = [], [], []
    for attr in public_names(module):
        obj = getattr(module, attr)
        kind = _kind(obj)
        if kind == 'module':
            if obj.__name__ in modules:
                submodules.append(obj.__name__)
            continue
        home = canonical.get(id(obj)) if kind != 'data' else None
        if home is not None and home != f'{name}.{attr}':
            elsewhere.append((attr, home))
        else:
            here.append((attr, kind, obj))
    children = [m for m in modules if m.rsplit('.', 1)[0] == name and m != name]
    submodules += [m for m in children if m not in submodules]
    lines = ['.. This page is generated by docs/_ext/jlg_docs.py from the module; edit the docstrings.', '',
             _title(name), f'.. automodule:: {name}', '   :no-members:', '']
    constants = [item for item in here if item[1] == 'data']
    here = [item for item in here if item[1] != 'data'] + constants   # constants last
    if len(here) > len(constants):
        lines += ['.. rubric:: Summary', '', '.. autosummary::', '   :nosignatures:', '']
        lines += [f'   {attr}' for attr, kind, _ in here if kind != 'data'] + ['']
    if submodules:
        lines += ['.. rubric:: Submodules', '']
        lines += [f'* :py:mod:`{m}`' for m in submodules] + ['']
    if elsewhere:
        lines += ['.. rubric:: Names defined in another module', '',
                  f'``{name}`` also exports these, documented where they are defined:', '']
        lines += [f'* ``{attr}``: :py:obj:`{home}`' for attr, home in elsewhere] + ['']
    for attr, kind, obj in here:
        full = f'{name}.{attr}'
        if constants and attr == constants[0][0] and kind == 'data':
            lines += ['.. rubric:: Constants and type aliases', '']
        if kind == 'function':
            lines += [f'.. autofunction:: {full}', '']
        elif kind in ('class', 'exception'):
            lines += [f'.. auto{kind}:: {full}', '   :members:', '   :show-inheritance:', '']
        else:
            lines += [f'.. autodata:: {full}'] + ([] if _short_value(obj) else ['   :no-value:']) + ['']
    return '\n'.join(lines)


def api_index(modules: list[str]) -> str:
    """The reStructuredText of the API index: the modules by group, with their summaries."""
    lines = ['.. This page is generated by docs/_ext/jlg_docs.py.', '', _title('API reference'),
             'Every public name of the package, generated from its docstrings (Google style) and '
             'type annotations. A module lists its ``__all__`` where it has one, else every public '
             'name it defines; a name another module defines links to where it is documented.', '']
    for title, _ in API_GROUPS:
        group = [m for m in modules if _group_of(m) == title]
        lines += [_title(title, '-'), '.. autosummary::', '   :nosignatures:', '']
        lines += [f'   {m}' for m in group] + ['']
    lines += ['.. toctree::', '   :hidden:', ''] + [f'   {m}' for m in modules] + ['']
    return '\n'.join(lines)


def _group_of(module: str) -> str:
    """The group of `module`: the group of its longest matching prefix."""
    best, title = -1, API_GROUPS[0][0]
    for t, prefixes in API_GROUPS:
        for p in prefixes:
            if (module == p or module.startswith(p + '.')) and len(p) > best:
                best, title = len(p), t
    return title


def write_api_pages() -> list[str]:
    """Write `docs/api/` (the index and one page per module); returns the modules."""
    modules = api_modules()
    canonical = _canonical(modules)
    wanted = {'index.rst'} | {f'{m}.rst' for m in modules}
    os.makedirs(API_DIR, exist_ok=True)
    for stale in set(os.listdir(API_DIR)) - wanted:
        os.remove(os.path.join(API_DIR, stale))
    _write(os.path.join(API_DIR, 'index.rst'), api_index(modules))
    for m in modules:
        _write(os.path.join(API_DIR, f'{m}.rst'), module_page(m, modules, canonical))
    return modules


# --------------------------------------------------------------------------- the command line

class _Parsed(Exception):
    """Raised instead of parsing: carries the parser a command built."""

    def __init__(self, parser: argparse.ArgumentParser):
        super().__init__(parser.prog)
        self.parser = parser


def command_parser(command: str) -> argparse.ArgumentParser:
    """The argparse parser `jlearngene COMMAND` parses its arguments with: its `main` runs
    until it first parses, which is stopped there, so nothing else of the command runs."""
    module = importlib.import_module(f'jlearngene.commands.{command}')
    original = argparse.ArgumentParser.parse_known_args

    def stop(self, *args, **kwargs):
        raise _Parsed(self)

    argparse.ArgumentParser.parse_known_args = stop
    try:
        module.main([])
    except _Parsed as parsed:
        return parsed.parser
    finally:
        argparse.ArgumentParser.parse_known_args = original
    raise RuntimeError(f'jlearngene {command}: its main() returned without parsing a command line')


def _md_text(text: str) -> str:
    """Plain text for a Markdown paragraph: no HTML, no emphasis or tables by accident."""
    text = ' '.join(text.split())
    return re.sub(r'([*<>|\[\]\\])', r'\\\1', text)


def _invocation(action: argparse.Action) -> str:
    if not action.option_strings:
        return action.metavar or action.dest
    if action.nargs == 0:
        return ', '.join(action.option_strings)
    metavar = action.metavar or action.dest.upper()
    if isinstance(metavar, tuple):
        metavar = ' '.join(metavar)
    return ', '.join(f'{o} {metavar}' for o in action.option_strings)


def command_markdown(command: str) -> str:
    """One command's reference: usage, description and arguments, from its parser."""
    parser = command_parser(command)
    formatter = parser._get_formatter()
    out = [f'({command}-cmd)=', f'## `jlearngene {command}`', '', '```text',
           parser.format_usage().strip(), '```', '']
    if parser.description:
        out += ['```text', inspect.cleandoc(parser.description), '```', '']
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if a.help != argparse.SUPPRESS]
        if not actions:
            continue
        out += [f'**{group.title}**', '']
        for action in actions:
            help_text = formatter._expand_help(action) if action.help else ''
            extra = []
            if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
                extra.append('choices: ' + ', '.join(f'`{c}`' for c in action.choices))
            if (action.option_strings and action.nargs != 0 and action.default not in (None, argparse.SUPPRESS)
                    and '%(default)' not in (action.help or '') and action.default != []):
                extra.append(f'default: `{action.default}`')
            if action.required and action.option_strings:
                extra.append('required')
            text = _md_text(help_text) or 'No help text.'
            if extra:
                text += ' (' + '; '.join(extra) + ')'
            out += [f'`{_invocation(action)}`', f':  {text}', '']
    return '\n'.join(out)


def commands_markdown() -> str:
    """The list of commands (name and one-line help), then each command's reference."""
    from jlearngene import cli
    out = ['| command | what it does |', '|---|---|']
    for name in cli.COMMANDS:
        module = importlib.import_module(f'jlearngene.commands.{name}')
        out.append(f'| [`{name}`](#{name}-cmd) | {_md_text(module.HELP)} |')
    out.append('')
    for name in cli.COMMANDS:
        out += [command_markdown(name), '']
    return '\n'.join(out)


def _flat(d, prefix=''):
    for key, value in d.items():
        if isinstance(value, dict) and value:
            yield from _flat(value, f'{prefix}{key}.')
        else:
            yield f'{prefix}{key}', value


def _variants(name: str) -> tuple[str, ...]:
    """The arguments a bundled config's `get_config(arg)` takes (its file's `ARGS`, or
    `SOURCES` for the classification config), the default first."""
    import importlib.util

    from jlearngene.experiments import configs
    spec = importlib.util.spec_from_file_location(f'_jlg_docs_config_{name}', configs.path(name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return tuple(getattr(module, 'ARGS', None) or getattr(module, 'SOURCES', None) or ('',))


def _value(value) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    text = text if len(text) <= 80 else text[:77] + '...'
    return f'`{text.replace("|", "/")}`'


def configs_markdown() -> str:
    """Every bundled config (`jlearngene.experiments.configs`): its fields and their default
    values as `--config NAME` loads it, then for each other variant (`--config NAME:ARG`)
    the fields whose values differ, or that only that variant has."""
    from jlearngene.experiments import configs
    out = []
    for name in configs.names():
        variants = _variants(name)
        base = dict(_flat(configs.load(name).to_dict()))
        out += [f'({name}-config)=', f'## `{name}`', '',
                f'Source: `jlearngene/experiments/configs/{name}.py`. Variants (`--config {name}:ARG`): '
                + ', '.join(f'`{v}`' for v in variants) + f' (default `{variants[0]}`).', '',
                '| field | default |', '|---|---|']
        out += [f'| `{k}` | {_value(v)} |' for k, v in base.items()] + ['']
        for v in variants[1:]:
            other = dict(_flat(configs.load(f'{name}:{v}').to_dict()))
            changed = [(k, x) for k, x in other.items() if base.get(k, object()) != x]
            gone = [k for k in base if k not in other]
            out += [f'`--config {name}:{v}` differs in:', '', '| field | value |', '|---|---|']
            out += [f'| `{k}` | {_value(x)} |' for k, x in changed]
            out += [f'| `{k}` | (not in this variant) |' for k in gone] + ['']
    return '\n'.join(out)


def write_cli_pages() -> None:
    """Write `_generated/cli/commands.md` and `_generated/cli/configs.md`."""
    _write(os.path.join(GENERATED, 'cli', 'commands.md'), commands_markdown())
    _write(os.path.join(GENERATED, 'cli', 'configs.md'), configs_markdown())


# --------------------------------------------------------------------------- the records

def _digest(paths: list[str]) -> str:
    h = hashlib.sha256()
    for p in paths:
        with open(p, 'rb') as f:
            h.update(f.read())
    return h.hexdigest()


def _code_digest() -> str:
    """A digest of the code that renders records (the experiments package)."""
    from jlearngene import experiments
    folder = os.path.dirname(experiments.__file__)
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(folder) for f in fs if f.endswith('.py'))
    return _digest(files)


def provenance(folder: str, section: str | None = None) -> str:
    """The record's date, machine and commit, as its README's "Measured ..." paragraph states
    them (in `section` of the README where given; a record folder without a README: its
    parent's), then where the tables come from."""
    readme = os.path.join(ROOT, folder, 'README.md')
    if not os.path.exists(readme):
        readme = os.path.join(ROOT, os.path.dirname(folder), 'README.md')
    said = ''
    if os.path.exists(readme):
        with open(readme, encoding='utf-8') as f:
            text = f.read()
        if section is not None:
            text = text[text.index('\n' + section + '\n'):]
            text = re.split(r'\n## ', text[len(section) + 2:])[0]
        paragraphs = text.split('\n\n')
        measured = next((' '.join(p.split()) for p in paragraphs if p.lstrip().startswith('Measured ')), '')
        date = re.search(r'\d{4}-\d{2}-\d{2}', measured)
        machine = re.search(r'\d+-core [A-Z][A-Za-z]*(?: [A-Z][A-Za-z]*)*', measured)
        commit = re.search(r'commit ([0-9a-f]{7,40})', measured)
        if date:
            said = (f'Measured {date.group(0)}' + (f' on a {machine.group(0)}' if machine else '')
                    + (f' with the code of commit `{commit.group(1)}`' if commit else '')
                    + f' (`{os.path.relpath(readme, ROOT)}`). ')
    return (f'*{said}Rendered from `{folder}/results.json` by '
            '`jlearngene.experiments.study.render` when this site was built.*\n\n')


def write_records() -> None:
    """Render every committed record in `RECORDS` into `_generated/records/SLUG/` (its
    `results.md` and plots, then `record.md`: the tables followed by the plots), and the
    headline tables into `_generated/headline.md` and `_generated/readme_table.md`. A record
    whose results.json and rendering code are unchanged since the last build is kept."""
    from jlearngene.experiments import headline, study
    code = _code_digest()
    for slug, folder, section in RECORDS:
        source = os.path.join(ROOT, folder, 'results.json')
        out = os.path.join(GENERATED, 'records', slug)
        stamp = os.path.join(out, '.digest')
        digest = _digest([source]) + code + hashlib.sha256(provenance(folder, section).encode()).hexdigest()
        if os.path.exists(stamp) and open(stamp, encoding='utf-8').read() == digest:
            continue
        if os.path.isdir(out):
            shutil.rmtree(out)
        study.render(os.path.join(ROOT, folder), out)
        with open(os.path.join(out, 'results.md'), encoding='utf-8') as f:
            text = provenance(folder, section) + f.read().rstrip() + '\n'
        plots = sorted(p for p in os.listdir(out) if p.endswith('.png'))
        if plots:
            text += '\n' + '\n\n'.join(f'![{p}: accuracy against training FLOPs]({p})' for p in plots) + '\n'
        _write(os.path.join(out, 'record.md'), text)
        _write(stamp, digest)
    stamp = os.path.join(GENERATED, '.headline_digest')
    digest = _digest([os.path.join(ROOT, f, 'results.json') for f in HEADLINE]) + code
    if not (os.path.exists(stamp) and open(stamp, encoding='utf-8').read() == digest):
        records = [(os.path.basename(os.path.dirname(f)), headline.load(os.path.join(ROOT, f))) for f in HEADLINE]
        _write(os.path.join(GENERATED, 'headline.md'), headline.markdown(records) + '\n')
        compare = dict(records)['compare']
        _write(os.path.join(GENERATED, 'readme_table.md'), headline.readme_table(compare) + '\n')
        _write(stamp, digest)


def _data_docstring(app, what, name, obj, options, lines) -> None:
    """A constant documented by no comment of its own gets no docstring: autodoc would show
    its type's (a dict's, a `Method`'s), which describes the type and not the constant. An
    instance of one of our classes links to that class instead."""
    if what != 'data' or not lines:
        return
    from sphinx.pycode import ModuleAnalyzer
    modname, _, attr = name.rpartition('.')
    try:
        documented = ('', attr) in ModuleAnalyzer.for_module(modname).find_attr_docs()
    except Exception:   # noqa: BLE001 - no source to read: nothing of its own
        documented = False
    if documented:
        return
    kind = type(obj)
    lines[:] = []
    if kind.__module__.startswith('jlearngene'):
        lines += [f'An instance of :py:class:`{kind.__module__}.{kind.__qualname__}`.']


_CODE_SPAN = re.compile(r'(``.+?``|`[^`]+`)')
_TABLE_RULE = re.compile(r'^\s*\|(\s*:?-{3,}:?\s*\|)+\s*$')


def _inline(text: str) -> str:
    """One line of a docstring written as plain text with Markdown's inline habits, made
    reStructuredText that reads the same: `|x|` (absolute values) and a lone `*` (a path
    wildcard, `**options`) are literal characters, and a code span may be followed by a
    letter (`Run`s)."""
    parts = _CODE_SPAN.split(text)
    for i in range(0, len(parts), 2):
        p = parts[i].replace('|', r'\|')
        p = re.sub(r'(?<![*\\])\*\*(?=[A-Za-z_])(?![^*]*\*\*)', r'\\*\\*', p)   # **options
        p = re.sub(r'(?<=[/(\[])\*|\*(?=[/)\],])', r'\\*', p)                      # attn/*, (*)
        if i > 0 and re.match(r'[A-Za-z0-9]', p):   # `Run`s: end the code span before the letter
            p = '\\ ' + p
        parts[i] = p
    return ''.join(parts)


def _table(rows: list[str], indent: str) -> list[str]:
    """A Markdown table (header, rule, rows) as a reStructuredText list-table."""
    def cells(row):
        return [c.strip() for c in row.strip().strip('|').split('|')]
    out = [f'{indent}.. list-table::', f'{indent}   :header-rows: 1', '']
    for row in [rows[0]] + rows[2:]:
        for j, cell in enumerate(cells(row)):
            out.append(f'{indent}   {"* -" if j == 0 else "  -"} {_inline(cell) or " "}')
    return out + ['']


_ENTRY = re.compile(r'^([A-Za-z_][\w.]*(?:\s*(?:,|/|and)\s*[A-Za-z_][\w.]*)*)(\s*\([^)]*\))?:\s+(.*)$')


def _attributes(app, what, name, obj, options, lines) -> None:
    """An `Attributes:` section as a definition list under a rubric, before napoleon reads
    it: an entry may name several fields at once (`width, depth, num_heads: ...`), which
    napoleon would split into a type and one name."""
    out, i = [], 0
    while i < len(lines):
        line = lines[i]
        if line.strip() != 'Attributes:':
            out.append(line)
            i += 1
            continue
        base = len(line) - len(line.lstrip())
        j, section = i + 1, []
        while j < len(lines) and (not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) > base):
            section.append(lines[j])
            j += 1
        while section and not section[-1].strip():
            section.pop()
        body = [ln for ln in section if ln.strip()]
        entry_indent = min(len(ln) - len(ln.lstrip()) for ln in body) if body else 0
        items = []
        for ln in section:
            m = _ENTRY.match(ln[entry_indent:]) if len(ln) - len(ln.lstrip()) == entry_indent else None
            if m:
                names = re.split(r'\s*(?:,|/|\band\b)\s*', m.group(1))
                items.append([', '.join(f'``{n}``' for n in names if n) + (m.group(2) or ''), m.group(3)])
            elif items and ln.strip():
                items[-1].append(ln.strip())
            elif ln.strip():   # not an entry: keep the section's text as it is
                items = None
                break
        if items is None:
            out += lines[i:j]
        else:
            pad = ' ' * base
            out += [f'{pad}.. rubric:: Attributes', '']
            for term, *text in items:
                out += [f'{pad}{term}', f'{pad}    {" ".join(text)}', '']
        i = j
    lines[:] = out


def _markdown_habits(app, what, name, obj, options, lines) -> None:
    """Docstrings here are plain text with Markdown's habits; rendered as reStructuredText
    (after napoleon has turned the Google sections into fields), each line's inline habits
    are kept literal (`_inline`) and a Markdown table becomes a list-table. Literal blocks
    (after `::`) are left as they are."""
    out, i, literal_indent = [], 0, None
    while i < len(lines):
        line = lines[i]
        indent = len(line) - len(line.lstrip())
        if literal_indent is not None:
            if line.strip() and indent <= literal_indent:
                literal_indent = None
            else:
                out.append(line)
                i += 1
                continue
        if line.lstrip().startswith('|') and i + 1 < len(lines) and _TABLE_RULE.match(lines[i + 1]):
            j = i + 2
            while j < len(lines) and lines[j].lstrip().startswith('|'):
                j += 1
            if out and out[-1].strip():
                out.append('')
            out += _table(lines[i:j], line[:indent])
            i = j
            continue
        if line.rstrip().endswith('::') or line.lstrip().startswith('.. '):
            literal_indent = indent
            out.append(line)
        else:
            out.append(_inline(line))
        i += 1
    lines[:] = _hanging_indents(out)


_BLOCK_START = re.compile(r'^\s*([*+-] |\d+\. |#\. |:|\.\. |\|)')


def _hanging_indents(lines: list[str]) -> list[str]:
    """Plain-text hanging indents (`name: text` then lines indented under it, inside a
    paragraph) as reStructuredText definition-list items: a blank line before such a line
    and after its indented lines, where reStructuredText would otherwise see a paragraph
    with unexpected indentation."""
    def indent(line):
        return len(line) - len(line.lstrip())

    out, i = [], 0
    while i < len(lines):
        line = lines[i]
        nxt = lines[i + 1] if i + 1 < len(lines) else ''
        hanging = (line.strip() and nxt.strip() and indent(nxt) > indent(line)
                   and not _BLOCK_START.match(line) and not line.rstrip().endswith('::')
                   and out and out[-1].strip() and indent(out[-1]) == indent(line)
                   and not _BLOCK_START.match(out[-1]))
        if not hanging:
            out.append(line)
            i += 1
            continue
        out += ['', line]
        j = i + 1
        while j < len(lines) and lines[j].strip() and indent(lines[j]) > indent(line):
            out.append(lines[j])
            j += 1
        if j < len(lines) and lines[j].strip():
            out.append('')
        i = j
    return out


# --------------------------------------------------------------------------- checks

_PY_FENCE = re.compile(r'^\s*(```+|~~~+)\s*(python|py|python3|ipython|\{code-block\}\s+python)\s*$', re.M)


def _check_fences(app, docname, source) -> None:
    """A Python block in a Markdown page must be a `{code-cell}`: executed at build time."""
    path = app.env.doc2path(docname)
    if not str(path).endswith('.md'):
        return
    for m in _PY_FENCE.finditer(source[0]):
        line = source[0][:m.start()].count('\n') + 1
        logger.warning(f'a Python block that is not executed (line {line}): write it as a '
                       '{code-cell} so the build runs it', location=(docname, line))


# --------------------------------------------------------------------------- setup

def _generate(app) -> None:
    write_api_pages()
    write_cli_pages()
    write_records()


def setup(app):
    """Sphinx's entry point: the math renderer, the `jlg-soft` role, the generated API pages
    and the docstring and fence checks."""
    app.add_html_math_renderer('mathml', (_visit_math, None), (_visit_math_block, None))
    app.add_role('jlg-soft', soft_role)
    app.connect('builder-inited', _generate)
    app.connect('missing-reference', _missing_reference)
    app.connect('autodoc-process-docstring', _data_docstring, priority=100)
    app.connect('autodoc-process-docstring', _attributes, priority=200)
    app.connect('autodoc-process-docstring', _markdown_habits, priority=900)
    app.connect('source-read', _check_fences)
    return {'version': '1', 'parallel_read_safe': True, 'parallel_write_safe': True}
