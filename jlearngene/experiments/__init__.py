"""Experiments inside the package, so an installed wheel runs them (`jlearngene train --config NAME`).

* `configs/`: the bundled ml_collections config files (`get_config(arg)`), by name:
  `jlearngene train --config tleg:smoke --workdir DIR` (`configs.resolve`, `configs.load`).
  A study's config is its declaration: shapes, methods, budgets as fractions of S.
* `study`: the study harness under the fair protocol (Scratch's lr sweep and plateau, seeds,
  every FLOP counted, verdicts), `report`: its tables and plot from `results.json`.
* one module per experiment, named by the config's `experiment` field: a study's own part
  (`tleg`, `letra`, `cluster`, `scala`, `mango`, `compare`: `STUDY = study.Study(...)`, its
  claims and at most one small function).
* `harness`: the pieces the studies run from (data, one training run, distillation,
  results files); `study.run_experiment`, which every experiment config goes through.

From Python::

    from jlearngene.experiments import configs, study
    results = study.run_experiment(configs.load('tleg:smoke'), '/tmp/tleg')
    print(results['table'])
"""
