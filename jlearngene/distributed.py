"""Starting jax's distributed runtime: one process per host (or per GPU), all in one run.

`initialize` is called once per process, before anything touches a jax device; after it,
`jax.devices()` lists every process's devices and `fit` trains over all of them. Where the
settings come from, first match wins (`resolve`):

1. arguments (the `jlearngene train` flags `--coordinator_address`, `--num_processes`,
   `--process_id`);
2. the environment: `JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES`, `JAX_PROCESS_ID`;
3. a cluster that `jax.distributed.initialize` detects itself (its `ClusterEnv`s: SLURM
   under `srun`, a Cloud TPU pod slice, Open MPI, Kubernetes) with more than one process:
   jax derives the coordinator, the process count and this process's id;
4. otherwise one process, and nothing is started (nor for settings of one process,
   `num_processes=1`).

On CPU the cross-process collectives are gloo's (`jax_cpu_collectives_implementation`),
so the same code runs as several processes on one machine (the tests do: 2 processes x 4
devices on 127.0.0.1).
"""
from __future__ import annotations

import dataclasses
import logging
import os

log = logging.getLogger(__name__)

SOURCES = ('args', 'env', 'cluster', 'single')
ENV_ADDRESS, ENV_COUNT, ENV_ID = 'JAX_COORDINATOR_ADDRESS', 'JAX_NUM_PROCESSES', 'JAX_PROCESS_ID'


class DistributedError(ValueError):
    """Inconsistent or incomplete multi-process settings; the message names the setting."""


@dataclasses.dataclass(frozen=True)
class Setup:
    """Where this process stands: `source` is one of SOURCES; `cluster` names the jax
    `ClusterEnv` that detected a cluster (source 'cluster'), whose coordinator address jax
    finds when it starts."""
    source: str
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    cluster: str | None = None

    @property
    def multi_process(self) -> bool:
        """True when more than one process takes part.

        That is every setting other than 'single' that does not name one process (explicit
        settings with `num_processes=1` start no runtime)."""
        return self.source != 'single' and (self.num_processes is None or self.num_processes > 1)


def _int(value, name: str) -> int | None:
    if value is None or value == '':
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise DistributedError(f'{name} must be an integer, got {value!r}') from None


def detected_cluster():
    """The cluster environment `jax.distributed.initialize` would detect.

    Returns:
        The first of jax's auto-detected `ClusterEnv` classes (not opt-in only) whose
        environment is present, or `None`.
    """
    from jax._src import clusters   # the registry jax.distributed.initialize consults
    return next((c for c in clusters.ClusterEnv._cluster_types
                 if not c.opt_in_only_method and c.is_env_present()), None)


def resolve(coordinator_address: str | None = None, num_processes: int | None = None,
            process_id: int | None = None) -> Setup:
    """The multi-process settings of this process; nothing is started.

    The first source that gives any setting wins (see the module docstring for the order):
    the arguments, the `JAX_*` environment variables, a detected cluster with more than one
    process, else a single process.

    Args:
        coordinator_address: 'host:port' of process 0's coordinator service, or `None`.
        num_processes: how many processes take part, or `None`.
        process_id: this process's index in 0..`num_processes` - 1, or `None`.

    Returns:
        The `Setup`; its `source` says which source gave it.

    Raises:
        DistributedError: a source gives some of the three settings but not all; a count or
          id is not an integer; the id is not in [0, count) or the count is < 1; the address
          is not host:port; or a detected cluster's own settings are incomplete.
    """
    env = os.environ
    for source, (addr, count, pid) in (
            ('args', (coordinator_address, num_processes, process_id)),
            ('env', (env.get(ENV_ADDRESS), env.get(ENV_COUNT), env.get(ENV_ID)))):
        names = (('--coordinator_address', '--num_processes', '--process_id') if source == 'args'
                 else (ENV_ADDRESS, ENV_COUNT, ENV_ID))
        count, pid = _int(count, names[1]), _int(pid, names[2])
        given = [v not in (None, '') for v in (addr, count, pid)]
        if not any(given):
            continue
        if not all(given):
            missing = [n for n, g in zip(names, given) if not g]
            raise DistributedError(f'multi-process settings from {source}: {", ".join(missing)} '
                                   f'missing (give all of {", ".join(names)})')
        if count < 1 or not 0 <= pid < count:
            raise DistributedError(f'{names[2]}={pid} must be in [0, {names[1]}={count})')
        if ':' not in str(addr):
            raise DistributedError(f'{names[0]}={addr!r} must be host:port')
        return Setup(source, str(addr), count, pid)
    cluster = detected_cluster()
    if cluster is not None:
        try:
            count, pid = cluster.get_process_count(), cluster.get_process_id()
        except (KeyError, ValueError) as e:   # a variable jax reads is missing or not a number
            raise DistributedError(f'{cluster.__name__} detected, but its settings are '
                                   f'incomplete: {type(e).__name__}: {e}') from None
        if count > 1:
            return Setup('cluster', None, count, pid, cluster.__name__)
    return Setup('single')


_STARTED: Setup | None = None


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, timeout_s: int = 300) -> Setup:
    """Start jax's distributed runtime as `resolve` says.

    A no-op for one process (also one given explicitly, `num_processes=1`), and when this
    process started it already with the same settings. Must run before any jax device is
    used; on CPU it selects gloo collectives.

    Args:
        coordinator_address: 'host:port' of process 0's coordinator service, or `None`.
        num_processes: how many processes take part, or `None`.
        process_id: this process's index, or `None`.
        timeout_s: seconds to wait for the other processes to connect.

    Returns:
        The `Setup` this process runs under. For a started runtime it has jax's process count
        and index filled in; for one process it is `Setup('single')`.

    Raises:
        DistributedError: the settings are inconsistent or incomplete (from `resolve`), or
          the runtime already runs with other multi-process settings.
    """
    global _STARTED
    setup = resolve(coordinator_address, num_processes, process_id)
    if _STARTED is not None:
        if setup.source != 'single' and setup != _STARTED:
            raise DistributedError(f'the distributed runtime runs as {_STARTED}; cannot start it '
                                   f'again as {setup}')
        return _STARTED
    if not setup.multi_process:   # one process, however it was given: nothing to start
        return Setup('single')
    import jax
    # The CPU devices' collectives across processes (GPU and TPU devices ignore it).
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
    # A detected cluster (no coordinator address): jax finds it as it detected the cluster.
    jax.distributed.initialize(setup.coordinator_address, setup.num_processes, setup.process_id,
                               initialization_timeout=int(timeout_s))
    _STARTED = Setup(setup.source, setup.coordinator_address, jax.process_count(),
                     jax.process_index(), setup.cluster)
    log.info('distributed runtime: process %d of %d (%s)', jax.process_index(),
             jax.process_count(), setup.cluster or setup.source)
    return _STARTED


def shutdown() -> None:
    """Stop the runtime this process started (the processes leave together)."""
    global _STARTED
    if _STARTED is not None:
        import jax
        jax.distributed.shutdown()
        _STARTED = None


def is_main_process() -> bool:
    """Whether this is process 0: the one that writes metrics, logs, config files and plots.

    Returns:
        `True` when `jax.process_index()` is 0.
    """
    import jax
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Wait until every process reaches the barrier `name` (no-op for one process).

    Args:
        name: the barrier's name; every process must pass the same one.
    """
    import jax
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(name)
