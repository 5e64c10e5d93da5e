"""Docstrings fit to be rendered: every public function and method of the API reference's
modules (`docs/_ext/jlg_docs.api_modules`) says, in Google-style sections that napoleon
renders (docs/conf.py), its arguments (`Args:`, every argument named), what it returns
(`Returns:` or `Yields:`, where its body returns or yields a value) and what it raises
(`Raises:`, naming every exception class its own body raises). A `Returns:` section is
prose: a colon outside backticks in its first line would make napoleon read the text before
it as the return type (and so is a property's first line). Every docstring the reference
shows (functions, classes, methods, properties) renders as reStructuredText without a
warning, which the docs build (`sphinx -W`) would turn into an error.

What a function raises is read from its own body's `raise` statements; an exception that
only a callee raises is for the author to add. ruff's D1 rules (pyproject.toml) check that
every public name has a docstring at all."""
import ast
import importlib
import inspect
import os
import re
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECTION_NAMES = {'Args:': 'args', 'Arguments:': 'args', 'Returns:': 'returns', 'Yields:': 'returns',
                 'Raises:': 'raises'}


def _jlg_docs():
    pytest.importorskip('sphinx', reason='the docs extra is not installed (pip install -e ".[docs]")')
    sys.path.insert(0, os.path.join(ROOT, 'docs', '_ext'))
    try:
        return importlib.import_module('jlg_docs')
    finally:
        sys.path.pop(0)


def sections(doc: str) -> dict[str, str]:
    """{'args' | 'returns' | 'raises': the section's text} of a Google-style docstring."""
    out, current = {}, None
    for line in (doc or '').splitlines():
        stripped = line.strip()
        if stripped in SECTION_NAMES and not line.startswith((' ', '\t')):
            current = SECTION_NAMES[stripped]
            out.setdefault(current, '')
        elif current and (not stripped or line.startswith((' ', '\t'))):
            out[current] += line + '\n'
        else:
            current = None
    return out


def _own_nodes(function: ast.AST):
    """The nodes of a function's own body: nested functions, lambdas and classes left out."""
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _raised_name(node: ast.Raise) -> str | None:
    exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
    if isinstance(exc, ast.Name):
        return exc.id
    return exc.attr if isinstance(exc, ast.Attribute) else None


def needs(function) -> dict | None:
    """What `function`'s docstring must say: {'args': [names], 'returns': bool, 'raises':
    {exception names}}, or None where its source cannot be read as one `def`."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function))).body[0]
    except (OSError, TypeError, SyntaxError, IndexError):
        return None
    if not isinstance(tree, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    a = tree.args
    names = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs if p.arg not in ('self', 'cls')]
    names += [p.arg for p in (a.vararg, a.kwarg) if p is not None]
    returns, raises = False, set()
    for node in _own_nodes(tree):
        if isinstance(node, ast.Return) and node.value is not None and not (
                isinstance(node.value, ast.Constant) and node.value.value is None):
            returns = True
        elif isinstance(node, (ast.Yield, ast.YieldFrom)):
            returns = True
        elif isinstance(node, ast.Raise) and node.exc is not None:
            raises.add(_raised_name(node) or '?')
    return {'args': names, 'returns': returns, 'raises': raises}


def problems(function) -> list[str]:
    """What `function`'s docstring leaves unsaid, one phrase each (empty when complete)."""
    need = needs(function)
    if need is None:
        return []
    have, out = sections(inspect.getdoc(function)), []
    if need['args']:
        if 'args' not in have:
            out.append('no Args section')
        else:
            unnamed = [n for n in need['args'] if not re.search(rf'^\s+\**{n}\b[^:\n]*:', have['args'], re.M)]
            if unnamed:
                out.append(f'Args does not name {", ".join(unnamed)}')
    if need['returns'] and 'returns' not in have:
        out.append('no Returns section')
    if 'returns' in have and (rtype := _read_as_type(inspect.getdoc(function))):
        out.append(f'Returns reads {rtype!r} as a type (a colon outside backticks in its first line)')
    if need['raises']:
        if 'raises' not in have:
            out.append(f'no Raises section ({", ".join(sorted(need["raises"]))})')
        else:
            unnamed = sorted(n for n in need['raises'] if n != '?' and not re.search(rf'\b{n}\b', have['raises']))
            if unnamed:
                out.append(f'Raises does not name {", ".join(unnamed)}')
    return out


def _read_as_type(doc: str) -> str | None:
    """The text napoleon reads as the return type of a Google docstring, or None."""
    from sphinx.ext.napoleon import Config
    from sphinx.ext.napoleon.docstring import GoogleDocstring
    lines = str(GoogleDocstring(doc, Config(napoleon_use_rtype=True))).splitlines()
    return next((line[len(':rtype:'):].strip() for line in lines if line.startswith(':rtype:')), None)


def _api_objects():
    """(module name, public name, object) of every name the API reference documents that
    jlearngene defines."""
    jlg_docs = _jlg_docs()
    for module_name in jlg_docs.api_modules():
        module = importlib.import_module(module_name)
        for attr in jlg_docs.public_names(module):
            obj = getattr(module, attr)
            if str(getattr(obj, '__module__', '')).startswith('jlearngene'):
                yield module_name, attr, obj


def public_functions():
    """[(qualified name, function)] of every public function, and every public method of a
    public class, that the API reference documents; each once."""
    seen, out = set(), []
    for _, attr, obj in _api_objects():
        if inspect.isclass(obj):
            members = [(f'{obj.__qualname__}.{k}', getattr(v, '__func__', v)) for k, v in vars(obj).items()
                       if not k.startswith('_')]
        else:
            members = [(getattr(obj, '__qualname__', attr), inspect.unwrap(obj) if callable(obj) else obj)]
        for qualname, function in members:
            key = (getattr(function, '__module__', None), qualname)
            if inspect.isfunction(function) and key not in seen:
                seen.add(key)
                out.append((f'{function.__module__}.{qualname}', function))
    return out


def documented_objects():
    """[(qualified name, 'function' | 'class' | 'method' | 'property', object)] of every object
    whose docstring the API reference renders; each once."""
    seen, out = set(), []

    def add(name, what, obj):
        if id(obj) not in seen and inspect.getdoc(obj):
            seen.add(id(obj))
            out.append((name, what, obj))

    for module_name, attr, obj in _api_objects():
        name = f'{module_name}.{attr}'
        if not inspect.isclass(obj):
            add(name, 'function', obj)
            continue
        add(name, 'class', obj)
        for k, v in vars(obj).items():
            if k.startswith('_'):
                continue
            if isinstance(v, property):
                add(f'{name}.{k}', 'property', v)
            elif inspect.isfunction(getattr(v, '__func__', v)):
                add(f'{name}.{k}', 'method', getattr(v, '__func__', v))
    return out


def rst_warnings(name: str, what: str, obj) -> list[str]:
    """The reStructuredText warnings of `obj`'s docstring as the docs build renders it:
    napoleon's Google sections, then this project's Markdown habits (docs/_ext/jlg_docs.py);
    a property's first line napoleon reads as its type."""
    import io

    import docutils.core
    from sphinx.ext.napoleon import Config
    from sphinx.ext.napoleon.docstring import GoogleDocstring
    lines = str(GoogleDocstring(inspect.getdoc(obj), Config(napoleon_use_rtype=False), what=what,
                                name=name, obj=obj)).splitlines()
    if what == 'property' and (typed := next((line for line in lines if line.startswith(':type:')), None)):
        return [f'its first line is read as the type {typed[len(":type:"):].strip()!r}']
    _jlg_docs()._markdown_habits(None, what, name, obj, {}, lines)
    err = io.StringIO()
    docutils.core.publish_doctree('\n'.join(lines), settings_overrides={
        'report_level': 2, 'halt_level': 5, 'warning_stream': err, 'default_role': 'literal'})
    sphinx_only = ('Unknown interpreted text role', 'No role entry', 'Unknown directive',
                   'No directive entry', 'Trying "')
    return [line.split(': ', 1)[-1] for line in err.getvalue().splitlines()
            if ('WARNING' in line or 'ERROR' in line or 'SEVERE' in line)
            and not any(s in line for s in sphinx_only)]


def test_every_docstring_renders_without_a_warning():
    objects = documented_objects()
    assert {what for _, what, _ in objects} == {'function', 'class', 'method', 'property'}
    bad = [f'{name} ({what}): {"; ".join(w)}' for name, what, obj in objects if (w := rst_warnings(name, what, obj))]
    assert not bad, f'{len(bad)} of {len(objects)} docstrings:\n' + '\n'.join(bad)


def test_the_render_check_finds_a_broken_docstring():
    class Options:
        """Options.

        crop: pad, then crop back;
          below the image size.
        flip: random flips.
        """

        @property
        def multi(self) -> bool:
            """Whether several processes take part: settings other than 'single'."""
            return True

        @property
        def single(self) -> bool:
            """True when one process takes part."""
            return False

    assert rst_warnings('Options', 'class', Options)
    assert rst_warnings('Options.multi', 'property', vars(Options)['multi']) == [
        "its first line is read as the type 'Whether several processes take part'"]
    assert rst_warnings('Options.single', 'property', vars(Options)['single']) == []


def test_every_public_function_says_its_arguments_returns_and_raises():
    functions = public_functions()
    assert len(functions) > 300
    missing = [f'{name}: {"; ".join(p)}' for name, f in functions if (p := problems(f))]
    assert not missing, f'{len(missing)} of {len(functions)} public functions:\n' + '\n'.join(missing)


def test_the_check_finds_what_a_docstring_leaves_out():
    def complete(x, *, scale=1.0):
        """Doubles.

        Args:
          x: the value.
          scale: its factor.

        Returns:
          `2 * x * scale`.

        Raises:
          ValueError: where `x` is negative.
        """
        if x < 0:
            raise ValueError('negative')
        return 2 * x * scale

    def partial(x, scale=1.0):
        """Doubles.

        Args:
          x: the value.
        """
        if x < 0:
            raise ValueError('negative')
        if x > 9:
            raise OverflowError('large')
        return 2 * x * scale

    def typed(x):
        """Halves.

        Args:
          x: the value.

        Returns:
          {name: value}, halved.
        """
        return x / 2

    def quiet():
        """Nothing to say: no arguments, no value, nothing raised."""
        def inner(y):
            raise ValueError(y)
        del inner

    assert problems(complete) == [] and problems(quiet) == []
    assert problems(partial) == ['Args does not name scale', 'no Returns section',
                                 'no Raises section (OverflowError, ValueError)']
    assert problems(typed) == ["Returns reads '{name' as a type (a colon outside backticks in its first line)"]
