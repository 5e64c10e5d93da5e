"""Experiments inside the package, so an installed wheel runs them (`jlearngene demo`).

* `configs/`: the bundled ml_collections config files (`get_config(arg)`), by name:
  `jlearngene train --config tleg:smoke --workdir DIR` (`configs.resolve`, `configs.load`).
* `harness`: one comparison of learngene methods at equal budgets, for any config whose
  `task` is 'experiment': data, teacher/ancestor, upstream genes trained by distillation,
  descendants fine-tuned at the same budget, result tables and plots (`harness.run`).
* one method part per experiment (`tleg`): what that experiment changes, as
  `PART = harness.Part(...)`, named by the config's `experiment` field.

From Python::

    from jlearngene.experiments import configs, harness
    results = harness.run(configs.load('tleg:smoke', {'seed': 1}), '/tmp/tleg')
    print(results['table'])
"""
