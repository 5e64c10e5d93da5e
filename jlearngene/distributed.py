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
4. otherwise one process, and nothing is started.

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
        """Whether more than one process takes part (the settings did not resolve to one process)."""
        return self.source != 'single'


def _int(value, name: str) -> int | None:
    if value is None or value == '':
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise DistributedError(f'{name} must be an integer, got {value!r}') from None


def detected_cluster():
    """The cluster environment `jax.distributed.initialize` would detect (the first of its
    auto-detected `ClusterEnv`s present), or None."""
    from jax._src import clusters   # the registry jax.distributed.initialize consults
    return next((c for c in clusters.ClusterEnv._cluster_types
                 if not c.opt_in_only_method and c.is_env_present()), None)


def resolve(coordinator_address: str | None = None, num_processes: int | None = None,
            process_id: int | None = None) -> Setup:
    """The multi-process settings of this process (see the module docstring for the order);
    nothing is started."""
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
    """Start jax's distributed runtime as `resolve` says (no-op for one process, and when
    this process started it already). Must run before any jax device is used. Returns the
    `Setup`. `timeout_s` bounds the wait for the other processes to connect."""
    global _STARTED
    setup = resolve(coordinator_address, num_processes, process_id)
    if _STARTED is not None:
        if setup.multi_process and setup != _STARTED:
            raise DistributedError(f'the distributed runtime runs as {_STARTED}; cannot start it '
                                   f'again as {setup}')
        return _STARTED
    if not setup.multi_process:
        return setup
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
    """Process 0: the one that writes metrics, logs, config files and plots."""
    import jax
    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Wait until every process reaches the barrier `name` (no-op for one process)."""
    import jax
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(name)
