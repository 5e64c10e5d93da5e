"""The documentation site (docs/): it builds with warnings as errors, every internal link of
the built pages resolves (the file, and the anchor where the link names one), and the API
reference documents every public name of the packages it covers.

The build here leaves the pages' examples unexecuted (JLEARNGENE_DOCS_EXECUTION=off: links
do not depend on outputs); `.ci/run` builds the site again with every example run. Needs the
`docs` extra (`pip install -e ".[docs]"`); without it the test skips with that reason."""
import html.parser
import importlib
import os
import subprocess
import sys
import urllib.parse

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, 'docs')


class _Page(html.parser.HTMLParser):
    """The ids a page defines and the links (href, src) it holds."""

    def __init__(self):
        super().__init__()
        self.ids, self.links = set(), []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ('id', 'name'):
            if attrs.get(key) and (key == 'id' or tag == 'a'):
                self.ids.add(attrs[key])
        for key in ('href', 'src'):
            if attrs.get(key):
                self.links.append((tag, attrs[key]))


def _pages(site):
    pages = {}
    for folder, subfolders, files in os.walk(site):
        subfolders[:] = [d for d in subfolders if d not in ('_static', '_sources', '_images')]   # theme files
        for name in files:
            if name.endswith('.html'):
                path = os.path.join(folder, name)
                page = _Page()
                with open(path, encoding='utf-8') as f:
                    page.feed(f.read())
                pages[os.path.normpath(path)] = page
    return pages


def broken_links(site):
    """['page: link (what is wrong)'] for every link of the site's pages to a file or an
    anchor of the site that does not exist. Links with a scheme (https:, mailto:) are
    outside the site and not followed."""
    pages, broken = _pages(site), []
    for path, page in sorted(pages.items()):
        for tag, link in page.links:
            parts = urllib.parse.urlsplit(link)
            if parts.scheme or link.startswith('//'):
                continue
            target = path if not parts.path else os.path.normpath(
                os.path.join(os.path.dirname(path), urllib.parse.unquote(parts.path)))
            where = f'{os.path.relpath(path, site)}: <{tag}> {link}'
            if not os.path.exists(target):
                broken.append(f'{where} (no file {os.path.relpath(target, site)})')
            elif parts.fragment and target in pages and urllib.parse.unquote(parts.fragment) not in pages[target].ids:
                broken.append(f'{where} (no anchor #{parts.fragment})')
    return broken


@pytest.fixture(scope='module')
def site(tmp_path_factory):
    pytest.importorskip('sphinx', reason='the docs extra is not installed (pip install -e ".[docs]")')
    pytest.importorskip('myst_nb', reason='the docs extra is not installed (pip install -e ".[docs]")')
    out = tmp_path_factory.mktemp('site')
    env = dict(os.environ, JLEARNGENE_DOCS_EXECUTION='off')
    done = subprocess.run([sys.executable, '-m', 'sphinx', '-W', '--keep-going', '-q', '-b', 'html',
                           '-d', str(out / 'doctrees'), DOCS, str(out / 'html')],
                          capture_output=True, text=True, env=env, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return str(out / 'html')


@pytest.mark.slow
def test_every_internal_link_of_the_built_site_resolves(site):
    assert os.path.exists(os.path.join(site, 'index.html'))
    assert len(_pages(site)) > 40
    broken = broken_links(site)
    assert not broken, '\n'.join(broken[:50])


@pytest.mark.slow
def test_the_api_reference_documents_every_public_name(site):
    sys.path.insert(0, os.path.join(DOCS, '_ext'))
    try:
        jlg_docs = importlib.import_module('jlg_docs')
    finally:
        sys.path.pop(0)
    pages = _pages(site)
    documented = set().union(*(p.ids for path, p in pages.items() if os.sep + 'api' + os.sep in path))
    missing = []
    for name in jlg_docs.api_modules():
        module = importlib.import_module(name)
        if name not in documented and f'module-{name}' not in documented:
            missing.append(name)
        for attr in jlg_docs.public_names(module):
            obj = getattr(module, attr)
            home = getattr(obj, '__module__', None)
            full = f'{home}.{getattr(obj, "__qualname__", attr)}' if str(home).startswith('jlearngene') else None
            if (f'{name}.{attr}' not in documented and full not in documented
                    and not (hasattr(obj, '__path__') or type(obj).__name__ == 'module')):
                missing.append(f'{name}.{attr}')
    assert not missing, missing


def test_a_broken_link_is_found(tmp_path):
    """The checker itself: a missing page and a missing anchor are reported, the rest not."""
    (tmp_path / 'a.html').write_text('<p id="here"></p><a href="b.html#there">b</a>'
                                     '<a href="#here">a</a><a href="c.html">c</a>'
                                     '<a href="https://example.org/x">x</a>', encoding='utf-8')
    (tmp_path / 'b.html').write_text('<p id="elsewhere"></p>', encoding='utf-8')
    broken = broken_links(str(tmp_path))
    assert len(broken) == 2
    assert 'no anchor #there' in broken[0] and 'no file c.html' in broken[1]
