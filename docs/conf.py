"""Sphinx configuration of the jlearngene docs.

Build (offline, warnings are errors):

    python -m sphinx -W --keep-going -b html docs docs/_build/html

Markdown pages are MyST; pages with `{code-cell}` blocks (and examples/walkthrough.ipynb)
are executed by myst-nb at build time, so an example that fails fails the build. Set
`JLEARNGENE_DOCS_EXECUTION=force` to run every page again (CI does), else unchanged pages
reuse jupyter-cache's outputs in docs/_build/.jupyter_cache.
"""
import os
import shutil
import sys

DOCS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(DOCS)
sys.path.insert(0, os.path.join(DOCS, '_ext'))
sys.path.insert(0, ROOT)

# The executed pages' kernels inherit this environment: CPU, and XLA's fast compilation for
# tiny programs (as the tests compile), so the examples spend little time in the compiler.
os.environ.setdefault('JAX_PLATFORMS', 'cpu')
os.environ.setdefault('JAX_DISABLE_MOST_OPTIMIZATIONS', '1')
if '--xla_cpu_use_fusion_emitters' not in os.environ.get('XLA_FLAGS', ''):
    os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') + ' --xla_cpu_use_fusion_emitters=false').strip()
os.environ.setdefault('PYTHONPATH', ROOT)
os.environ['TQDM_DISABLE'] = '1'    # the commands the pages run print no progress bars
# `!jlearngene ...` in a page runs this environment's command, activated or not.
os.environ['PATH'] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get('PATH', '')

import jlearngene  # noqa: E402

project = 'jlearngene'
author = 'the jlearngene authors'
copyright = '2026, the jlearngene authors'
release = version = jlearngene.__version__

extensions = [
    'myst_nb',
    'sphinx.ext.autodoc',
    'sphinx.ext.autosummary',
    'sphinx.ext.napoleon',
    'sphinxcontrib.bibtex',
    'jlg_docs',
]

# The walkthrough notebook is part of the site, read from examples/ (copied here at each
# build, so the one file stays the source).
os.makedirs(os.path.join(DOCS, 'examples'), exist_ok=True)
shutil.copyfile(os.path.join(ROOT, 'examples', 'walkthrough.ipynb'),
                os.path.join(DOCS, 'examples', 'walkthrough.ipynb'))

exclude_patterns = ['_build', '_generated', '_ext', 'Thumbs.db', '.DS_Store', '**.ipynb_checkpoints']
source_suffix = {'.rst': 'restructuredtext', '.md': 'myst-nb', '.ipynb': 'myst-nb'}

# MyST and notebook execution.
myst_enable_extensions = ['dollarmath', 'colon_fence', 'deflist']
myst_heading_anchors = 3
nb_execution_mode = os.environ.get('JLEARNGENE_DOCS_EXECUTION', 'cache')
nb_execution_cache_path = os.path.join(DOCS, '_build', '.jupyter_cache')
nb_execution_timeout = 600
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_merge_streams = True

# API reference: autodoc with Google-style docstrings, typed signatures.
autodoc_typehints = 'signature'
autodoc_member_order = 'bysource'
autosummary_generate = False
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
python_maximum_signature_line_length = 88
add_module_names = False
smartquotes = False        # command lines and help texts keep their `--` and quotes
default_role = 'jlg-soft'   # `name` in a docstring: inline code, linked where it names an API entry

# Broken references are errors; the names of other libraries in annotations are not ours to link.
nitpicky = True
nitpick_ignore_regex = [
    (r'py:.*', r'(jax|jaxlib|numpy|np|jnp|flax|nnx|optax|orbax|chex|grain|ml_collections|collections|'
               r'typing|typing_extensions|types|os|pathlib|argparse|threading|concurrent|tensorflow_datasets|'
               r'tfds|matplotlib|safetensors|PIL|Callable|Any|Sequence|Mapping|Iterable|Iterator|'
               r'PyTree|Array|ArrayLike|Params|Path|NamedTuple|Literal|Optional|Union|Self|ConfigDict)(\..*)?'),
    (r'py:.*', r'(int|float|str|bool|bytes|dict|list|tuple|set|frozenset|object|None|type|callable|'
               r'Ellipsis|slice|range|complex|BaseException|Exception|ValueError|RuntimeError|OSError|'
               r're\.Pattern|abc\.ABC)'),
]

bibtex_bibfiles = ['references.bib']
bibtex_default_style = 'plain'
bibtex_reference_style = 'author_year'

html_theme = 'sphinx_book_theme'
html_title = 'jlearngene'
html_static_path = ['_static']
html_css_files = ['custom.css']
html_math_renderer = 'mathml'
html_theme_options = {
    'show_toc_level': 2,
    'navigation_with_keys': False,
    'use_download_button': False,
    # the record pages' tables are wide: no page contents column beside them
    'secondary_sidebar_items': {
        **{p: ['page-toc'] for p in ('index', 'getting_started', 'concepts', 'cli', 'methods/*',
                                     'howto/*', 'api/*', 'examples/*')},
        'benchmark/*': [],
    },
}
html_last_updated_fmt = None
html_copy_source = False
