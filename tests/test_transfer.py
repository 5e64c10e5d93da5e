"""The transfer setting of the study protocol (specs/fair_studies.md, "Transfer setting"):
upstream on the source classes, descendants at label budgets on the others, every choice on
held-out validation images, the fine-tuned-source ceiling row. Default tier: the rules and
the data parts on tiny IDX files written here; slow tier: a whole miniature study."""
import json
import os

import numpy as np
import pytest
from helpers import write_fashion_files

from jlearngene.data import fashion
from jlearngene.experiments import configs, harness, headline, study
from jlearngene.experiments.configs import fashion_transfer
from jlearngene.experiments.recipes import ceiling


@pytest.fixture()
def fashion_dir(tmp_path, monkeypatch):
    """Tiny Fashion-MNIST files (30 training and 10 test images per class) as the only ones."""
    folder = write_fashion_files(tmp_path / 'fashion', per_class=30, test_per_class=10)
    monkeypatch.delenv(fashion.ENV_VAR, raising=False)
    monkeypatch.setattr(fashion, 'DEBIAN_DIR', str(tmp_path / 'no_debian'))
    return folder


def smoke_config(root, **overrides):
    """tleg:smoke in the transfer setting, shrunk to seconds: 2 label budgets of the tiny
    files (20 % and 40 %: 6 and 12 images per class), 4 validation images per class."""
    c = configs.load('tleg:smoke')
    c.unlock()
    fashion_transfer(c, patch_size=14)
    c.data.root = str(root)
    c.model.update(width=32, num_heads=2, mlp_dim=64)
    c.labels.update(fractions=(0.2, 0.4), seeds=((0, 2), (1,)), scratch_steps=(8, 12),
                    validation_per_class=4)
    c.seeds = (0, 1)
    c.scratch.update(steps=8, eval_every=4, patience=1, max_steps=0, lrs=(1e-3, 2e-3, 4e-3))
    c.methods = ('tleg', 'ceiling')
    for key, value in overrides.items():
        node, *path = key.split('.')
        target = c
        for part in [node] + path[:-1]:
            target = target[part]
        target[(path or [node])[-1]] = value
    return c


def test_label_budgets_line_up_or_fail_in_one_line(fashion_dir):
    c = smoke_config(fashion_dir)
    budgets = harness.label_budgets(c)
    assert [(b.fraction, b.seeds, b.steps, b.key) for b in budgets] == [
        (0.2, (0, 2), 8, '0.2'), (0.4, (1,), 12, '0.4')]
    with pytest.raises(ValueError, match='one entry per label budget'):
        harness.label_budgets(smoke_config(fashion_dir, **{'labels.scratch_steps': (8,)}))
    with pytest.raises(ValueError, match='validation_per_class must be > 0'):
        harness.label_budgets(smoke_config(fashion_dir, **{'labels.validation_per_class': 0}))
    with pytest.raises(ValueError, match='distinct seeds'):
        harness.label_budgets(smoke_config(fashion_dir, **{'labels.seeds': ((0, 0), (1,))}))


@pytest.mark.parametrize('key, value, says', [
    ('scratch.weight_decays', (0.05,), 'at least 2 weight decays'),
    ('descend.lrs', (1e-3, 3e-3), 'at least 3 learning rates'),
    ('descend.stop_at_target', True, 'reads the test images'),
])
def test_the_transfer_rules_are_checked_before_anything_runs(fashion_dir, tmp_path, key, value, says):
    with pytest.raises(ValueError, match=says):
        study.run_experiment(smoke_config(fashion_dir, **{key: value}), str(tmp_path / 'w'), quiet=True)
    assert not os.path.exists(tmp_path / 'w' / 'runs')


def test_ceiling_needs_two_tasks(tmp_path):
    c = configs.load('tleg:smoke', {'methods': ('tleg', 'ceiling')})
    with pytest.raises(ValueError, match="'ceiling' fine-tunes a source-task model"):
        study.run_experiment(c, str(tmp_path), quiet=True)


def test_more_budget_seeds_than_source_seeds_borrow_the_source_seeds_in_turn():
    assert study.upstream_seeds([0, 1, 2], [0, 1, 2, 3, 4]) == {0: 0, 1: 1, 2: 2, 3: 0, 4: 1}
    assert study.upstream_seeds([0, 1, 2], [1, 2]) == {1: 1, 2: 2}


def test_the_downstream_task_has_disjoint_labelled_validation_and_test_parts(fashion_dir):
    c = smoke_config(fashion_dir)
    ctx = harness.Context(c, quiet=True)
    low, high = (ctx.downstream(b) for b in harness.label_budgets(c))
    assert (low.num_examples, high.num_examples) == (30, 60)       # 6 and 12 per class
    assert ctx.ancestor_dset.num_examples == 150 and not ctx.ancestor_dset.has_validation

    def ids(source):   # fixture images are noise: rows of pixels identify an image
        return {img.tobytes() for img in np.asarray(source.images)}

    train_low, train_high = ids(low.sources['train']), ids(high.sources['train'])
    val = ids(low.sources['validation'])
    assert train_low < train_high                 # 20 % lies inside 40 %
    assert val == ids(high.sources['validation']) and len(val) == 20
    assert not val & train_high
    assert len(ids(low.sources['test'])) == 50     # every test image of classes 5..9
    assert set(np.asarray(low.sources['validation'].labels)) == {0, 1, 2, 3, 4}
    batches = list(low.validation())
    assert sum(int(np.sum(b.get('mask', np.ones(len(b['label']))))) for b in batches) == 20


@pytest.mark.slow
def test_a_transfer_study_chooses_on_validation_and_resumes(fashion_dir, tmp_path):
    """A miniature transfer study end to end: the source model trains on classes 0..4, each
    label budget has its Scratch (lr × weight decay, chosen on validation), every row sweeps
    its learning rates on the budget's first seed and later seeds use the chosen one, the
    ceiling row is there at every shape, the record renders again unchanged, and a second
    run reads every run back."""
    workdir = str(tmp_path / 'study')
    results = study.run_experiment(smoke_config(fashion_dir), workdir, quiet=True)
    assert set(results['budgets']) == {'0.2', '0.4'}
    assert results['ancestor']['classes'] == [0, 1, 2, 3, 4]
    for key, sub in results['budgets'].items():
        seeds = sub['seeds']
        assert sub['upstream_seed'] == ({'0': 0, '2': 0} if key == '0.2' else {'1': 1})
        for shape_key, base in sub['scratch'].items():
            # 3 lrs × 2 weight decays, and both decays at each lr the sweep was extended to
            extended = len(base['sweeps'][0]['extensions'])
            assert base['chosen_on'] == 'validation' and len(base['sweep']) == 6 + 2 * extended
            assert base['sweep'][f"lr {base['lr']:g} wd {base['weight_decay']:g}"] == max(base['sweep'].values())
            finished = json.load(open(os.path.join(
                workdir, 'runs', f"scratch_l{key}_{shape_key}_lr{base['lr']:g}_s{seeds[0]}_wd{base['weight_decay']:g}",
                'finished.json')))
            assert max(base['sweep'].values()) == finished['val_curve'][-1][1]   # validation, not test
        names = {r['name'] for r in sub['rows']}
        assert names == {'scratch', 'tleg', 'ceiling'}
        for sweep_key, sweep in sub['descend_sweeps'].items():
            name, shape, fraction = sweep_key.split()
            chosen = max(sweep, key=sweep.get)
            runs = [r for r in sub['rows'] if r['name'] == name and f"w{r['shape'][0]}_d{r['shape'][1]}" == shape
                    and (r['budget'] == 'equal') == (fraction == 'equal')]
            assert sorted(r['seed'] for r in runs) == seeds
            assert all(f"{r['lr']:g}" == chosen for r in runs)
            assert all('val' in r and 'acc_at_best_val' in r for r in runs)
        # every method at its paper's budget and at Scratch's steps; the ceiling at Scratch's only
        for shape_key, base in sub['scratch'].items():
            here = [r for r in sub['rows'] if f"w{r['shape'][0]}_d{r['shape'][1]}" == shape_key]
            assert {(r['budget'], r['steps']) for r in here if r['name'] == 'ceiling'} == {('equal', base['steps'])}
            assert {(r['budget'], r['steps']) for r in here if r['name'] == 'tleg'} == {
                ('paper', harness.fraction_steps(0.35, base['S'])), ('equal', base['steps'])}
        ceiling = [r for r in sub['rows'] if r['name'] == 'ceiling']
        assert all(r['upstream'] == [f"source_w{r['shape'][0]}_d{r['shape'][1]}"] for r in ceiling)
        assert all(r['upstream_flops_without_source'] == 0 for r in ceiling)
        assert '| shape | method |' in results['table'] and 'ceiling share' in results['table']
    for key in results['budgets']:
        assert os.path.exists(os.path.join(workdir, f'accuracy_vs_flops_l{key}.png'))
    table = headline.table([workdir]).splitlines()
    ceiling_at_teacher = [line for line in table if '| w32 L2 | Ceiling' in line]
    assert len(ceiling_at_teacher) == 2 and all('| 1.00 |' in line for line in ceiling_at_teacher)
    assert sum(line.startswith('| tleg |') for line in table) == 2 * 2 * 3    # budgets × shapes × (floor + rows)
    assert sum('| Scratch (converged, the floor) |' in line for line in table) == 2 * 2
    assert table[-1].startswith('Verdicts') and 'tleg at 20 %' in table[-1]
    assert any('Ceiling share: (method − Scratch)' in line for line in table)   # its legend
    rendered = study.render(workdir, str(tmp_path / 'rendered'))
    assert rendered['table'] == results['table']
    again = study.run_experiment(smoke_config(fashion_dir), workdir, quiet=True)
    assert len(again['reused']) == len(again['timings']) > 0
    walls = {line for line in again['table'].splitlines() if 'Wall time' in line}   # one per budget,
    assert len(walls) == 1 and f"{len(again['reused'])} of {len(again['timings'])}" in walls.pop()   # the whole study's
    assert again['table'].split('Wall time')[0] == results['table'].split('Wall time')[0]
    _ship_the_gene_of(workdir, tmp_path)


def _ship_the_gene_of(workdir, tmp_path):
    """A transfer study's gene ships without training (`zoo.make.from_study`): seed 0's
    TLEG gene with its source model's accuracy and doubling chain in gene.json, under 1 MB,
    and the command line descends it; a record other than the committed one is refused."""
    from jlearngene import artefacts, cli
    from jlearngene.zoo import make
    spec = {'from': 'study', 'config': 'tleg:fashion', 'method': 'tleg', 'seed': 0,
            'results': os.path.join(workdir, 'results.json')}
    gene_dir = make.from_study('tleg_fashion', workdir, str(tmp_path / 'gene'), spec=spec)
    meta = artefacts.read_meta(gene_dir)
    prov, record = meta['provenance'], json.load(open(os.path.join(workdir, 'results.json')))
    ancestor = record['budgets']['0.2']['ancestor']
    assert meta['method'] == 'tleg' and prov['seed'] == 0 and 0 <= prov['aux_test_accuracy'] <= 1
    assert prov['source_model']['test_accuracy'] == ancestor['accs']['0']
    assert prov['source_model']['doubling'] == ancestor['doubling']['0']
    assert set(prov['label_budgets']) == {'0.2', '0.4'}
    assert sum(os.path.getsize(os.path.join(gene_dir, f)) for f in os.listdir(gene_dir)) < make.MAX_BYTES
    out = tmp_path / 'descendant'
    assert cli.main(['descend', gene_dir, '--depth', '3', '--out', str(out)]) == 0
    assert os.path.isdir(out)
    other = tmp_path / 'other.json'
    other.write_text(json.dumps({**record, 'seconds': -1.0}))
    with pytest.raises(RuntimeError, match='is not the committed record'):
        make.from_study('tleg_fashion', workdir, str(tmp_path / 'gene2'), spec={**spec, 'results': str(other)})


def test_choices_at_the_edge_of_a_sweep_are_named():
    from jlearngene.experiments import report
    sub = dict(config={'scratch': {'lrs': [0.001, 0.002, 0.004]}},
               ancestor={'lr': 0.002},
               scratch={'w64_d3': {'lr': 0.004}, 'w64_d6': {'lr': 0.002}},
               descend_sweeps={'tleg w64_d3 0.35': {'0.0003': 0.80, '0.001': 0.85, '0.003': 0.84},
                               'he_lg w64_d3 0.35': {'0.0003': 0.86, '0.001': 0.85, '0.003': 0.84}})
    line, = [x for x in report.sweep_edges(sub) if x]
    assert 'the largest lr for 1 of 5 choices (Scratch at w64 L3)' in line
    assert 'the smallest lr for 1 of 5 choices (he_lg w64_d3 0.35)' in line
    sub['scratch']['w64_d3']['lr'] = 0.002
    sub['descend_sweeps'].pop('he_lg w64_d3 0.35')
    assert report.sweep_edges(sub) == []
    # in a rendered record: under Scratch's table in a same-task study, once per label budget
    # in a transfer study
    root = os.path.join(os.path.dirname(os.path.dirname(__file__)), 'experiments')
    for name, times in (('scala/fashion', 1), ('letra/fashion', 2), ('tleg', 0)):
        record = json.load(open(os.path.join(root, name, 'results.json'), encoding='utf-8'))
        assert report.markdown(record).count('Chosen at the edge of its lr sweep') == times, name


def test_the_headline_reads_transfer_records_and_render_one_folder(capsys):
    from jlearngene import cli
    digits = os.path.join(os.path.dirname(os.path.dirname(__file__)), 'experiments', 'mango')
    assert cli.main(['render', '--headline', digits]) == 1
    err = capsys.readouterr().err
    assert 'no label budgets' in err and err.count('\n') == 1
    with pytest.raises(SystemExit) as e:
        cli.main(['render', digits, digits])
    assert e.value.code == 2 and 'several only with --headline' in capsys.readouterr().err


def test_the_headline_shows_each_method_at_its_first_variant():
    """LeTra's record has three selections; the headline shows the paper's (continuous)
    beside IMwLM, the ceiling and the floor at every budget and shape."""
    from jlearngene.experiments import headline
    assert headline.shown(['letra/continuous', 'letra/step', 'imwlm', 'cluster/clustered',
                           'cluster/random']) == {'letra/continuous', 'imwlm', 'cluster/clustered'}
    record = os.path.join(os.path.dirname(os.path.dirname(__file__)), 'experiments', 'letra', 'fashion')
    table = headline.table([record])
    methods = [line.split(' | ')[3] for line in table.splitlines() if line.startswith('| letra |')]
    assert methods == ['Scratch (converged, the floor)', 'LeTra (continuous)', 'IMwLM',
                       'Ceiling (source model fine-tuned)'] * (2 * 4)             # budgets × shapes
    assert "its paper's default" in table


def test_the_headline_legend_says_what_budget_each_ceiling_had():
    """The legend under the headline is read from its records: the comparison's ceiling was
    fine-tuned 0.35·S (238–519 steps), not for Scratch's steps (1,200–2,000), so the legend
    says so and no column claims Scratch's steps; a record whose ceiling ran at Scratch's
    steps gets that wording, and a mix names each study's."""
    from jlearngene.experiments import headline
    record = os.path.join(os.path.dirname(os.path.dirname(__file__)), 'experiments', 'compare', 'fashion')
    table = headline.table([record])
    assert "its only budget" not in table and "ceiling share at Scratch's steps" not in table
    assert ("(the ceiling as its record fine-tuned it: compare 0.35·S, 238–519 steps against "
            "Scratch's 1,200–2,000)") in table
    assert "these records have no run at Scratch's steps" in table

    def entry(study, name, kind, steps, fraction, equal=None):
        return dict(study=study, name=name, budget_kind=kind, steps=steps, fraction=fraction, equal=equal)

    equal = [entry('new', 'scratch', 'paper', 1000, 1.0), entry('new', 'tleg', 'paper', 350, 0.35, {}),
             entry('new', 'ceiling', 'equal', 1000, 1.0, {})]
    text = headline.legend(equal)
    assert "(the ceiling: at Scratch's steps, its only budget)" in text
    assert "Ceiling share: (method − Scratch) / (ceiling − Scratch), both fine-tuned for Scratch's own steps," in text
    assert "in the run at Scratch's steps where there is one" in text
    old = [entry('old', 'scratch', 'paper', 1500, 1.0), entry('old', 'ceiling', 'paper', 500, 0.35)]
    text = headline.legend(equal + old)
    assert ("(the ceiling as its record fine-tuned it: new at Scratch's steps; old 0.35·S, 500 steps "
            "against Scratch's 1,500)") in text
    assert "where the record has that budget (else at the largest)" in text
    text = headline.legend(equal[:2])                                     # no ceiling row
    assert "at the method's paper budget. Ceiling share: (method − Scratch) / (ceiling − Scratch), – " \
           "throughout: these records have no ceiling row." in text


def test_the_headline_counts_verdicts_per_budget_and_names_a_study_without_claims():
    from jlearngene.experiments import headline
    claims = {'budgets': {'0.01': {'verdicts': [{'verdict': 'reproduced'}, {'verdict': 'not reproduced'}]},
                          '0.1': {'verdicts': [{'verdict': 'not testable here'}]}}}
    comparison = {'budgets': {'0.01': {'verdicts': []}, '0.1': {'verdicts': []}}}
    assert headline.verdict_line([('tleg', claims), ('compare', comparison)]) == (
        'Verdicts (reproduced / not reproduced / not testable here): tleg at 1 %: 1 / 1 / 0; '
        'tleg at 10 %: 0 / 0 / 1; compare: no paper claims of its own.')


def test_the_headline_stores_what_each_recorded_clustering_kept():
    """Cluster-Learngene's gene size is fixed by the data (centroids per layer), not the
    config: the headline reads each seed's recorded counts."""
    import copy

    from jlearngene.experiments import headline
    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), 'experiments', 'cluster', 'fashion')
    recorded = headline.load(path)

    def stored(centroids):
        r = copy.deepcopy(recorded)
        for sub in r['budgets'].values():
            for info in sub['info'].values():
                info['attention_distance']['centroids'] = centroids
        return {e['stored'] for e in headline.entries(r, 'cluster') if e['name'] == 'cluster/clustered'}

    (one,), (every,) = stored([1] * 6), stored([8] * 6)
    assert one < 0.3 and every == pytest.approx(1.0)
    assert {e['stored'] for e in headline.entries(recorded, 'cluster')
            if e['name'] == 'cluster/clustered'} == {one}    # this record: one centroid per layer


def test_the_readme_headline_is_the_render_of_the_records_it_names():
    """The top README's headline (its caption line and table) is exactly what
    `headline.readme_table` renders from the record its text names, and the full headline
    the text points to names existing transfer records. (The docs site renders both tables
    from the records when it is built.)"""
    import re

    from jlearngene.experiments import headline
    root = os.path.dirname(os.path.dirname(__file__))
    readme = open(os.path.join(root, 'README.md'), encoding='utf-8').read()
    section = readme[readme.index('## The headline'):]
    section = section[:section.index('\n## ', 1)]
    named = re.search(r'headline\.readme_table` from [^`]*`(experiments/[^`]+)`', section).group(1)
    rendered = headline.readme_table(headline.load(os.path.join(root, named))).strip()
    assert rendered in section
    assert rendered.count('\n|') >= 3                     # a caption, a header and some rows
    full = re.search(r'`jlearngene render --headline ([^`]+)`', section).group(1).split()
    assert named in full and all(os.path.exists(os.path.join(root, p, 'results.json')) for p in full)


@pytest.mark.parametrize('name', ['tleg', 'letra', 'cluster', 'compare', 'scala', 'mango'])
def test_every_fashion_config_passes_the_protocol_and_plans_its_rows(name):
    """The bundled `fashion` variants follow the transfer rules and every row makes at least
    one shape, from the config alone (nothing is read)."""
    c = configs.load(f'{name}:fashion')
    study.check(c.to_dict())
    transfer = 'labels' in c
    assert transfer == (name not in ('scala', 'mango'))          # same-task studies: the source task
    if transfer:
        assert 'ceiling' in c.methods and tuple(c.tasks.ancestor) == (0, 1, 2, 3, 4)
        assert [b.fraction for b in harness.label_budgets(c)] == [0.01, 0.1]
    else:
        assert tuple(c.data.classes) == (0, 1, 2, 3, 4)
    assert c.model.image_size == 28 and c.model.patch_size == (4 if name in ('cluster', 'compare') else 7)
    if 'letra' in c.methods:    # the learngene is narrower and shallower than its Aux-Net
        gene = c.method_options.letra.gene
        assert gene.learngene_heads < c.model.num_heads and gene.learngene_depth < c.depth
    plan = study.plan(c, 5)
    assert all(any(not isinstance(v, str) for v in shapes.values()) for shapes in plan.values())


def test_the_ceiling_row_fine_tunes_a_source_model_of_each_shape():
    """Its upstream run per shape is that shape's source model, billed to that shape only and
    counted as the pretrained source; at the teacher's shape it is the teacher."""
    from jlearngene.experiments import results
    c = configs.load('tleg:fashion').to_dict()
    ctx = harness.Context(c, num_classes=5)
    ctx.rows = study.make_rows(c)
    row = next(r for r in ctx.rows if r.name == 'ceiling')
    assert row.recipe is ceiling.RECIPE and row.descend['head'] == 'new'
    assert row.recipe.billed_at(row, (64, 3)) == ('source_w64_d3',)
    assert results.pretrained('source_w64_d3') and not results.pretrained('aux_tleg')
    source = row.recipe.source_config(ctx, ctx.shape_configs((64, 3))[0])
    assert (source.depth, source.num_classes) == (3, 5)
    assert row.recipe.source_config(ctx, ctx.shape_configs((64, 6))[0]) == ctx.ref


@pytest.mark.slow
def test_rendering_a_committed_record_leaves_its_results_json_as_committed(tmp_path):
    """`jlearngene render` recomputes a record's summary and verdicts into results.json: on
    every committed record that is the file as committed (render dirties no record)."""
    import glob

    from jlearngene import cli
    root = os.path.dirname(os.path.dirname(__file__))
    records = sorted(glob.glob(os.path.join(root, 'experiments', '**', 'results.json'), recursive=True))
    assert len(records) >= 12
    for i, path in enumerate(records):
        out = tmp_path / str(i)
        assert cli.main(['render', os.path.dirname(path), '--out', str(out)]) == 0
        with open(path, encoding='utf-8') as a, open(out / 'results.json', encoding='utf-8') as b:
            assert json.load(a) == json.load(b), path
