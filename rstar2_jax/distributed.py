"""Multi-process (multi-host) JAX: start-up and global arrays, so one trainer runs in 1 or N processes.

JAX on several hosts is multi-controller: every process runs the same program, owns its local
devices, and jitted code over a ``Mesh`` of ``jax.devices()`` (all processes) runs as one SPMD
program with XLA's collectives between the hosts. What differs from one process is only:

  1. start-up: :func:`initialize` joins the processes (``jax.distributed.initialize``) before any
     other JAX call; it is a no-op when there is one process, so call it unconditionally;
  2. host data -> global arrays: every process holds the same host copy of a batch (same seed,
     same data order) or of the initial params; :func:`global_batch` / :func:`global_params` build
     global ``jax.Array``s from it, each process filling only its own devices' shards (no
     communication; ``jax.make_array_from_callback``). Or each process holds only its own rows
     (:func:`process_rows`) and :func:`process_local_batch` assembles the global batch;
  3. global arrays -> host: :func:`to_host` gathers sharded leaves with ``process_allgather``
     (a collective: call it in every process, in the same order).

Where the process layout comes from (first found wins, per field):
  explicit arguments > ``RSTAR2_COORDINATOR`` / ``RSTAR2_NUM_PROCESSES`` / ``RSTAR2_PROCESS_ID``
  > ``JAX_COORDINATOR_ADDRESS`` / ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID`` > cluster auto-detection
  by JAX (SLURM under ``srun``; Open MPI under ``mpirun``). Nothing set and no cluster: one process.
  (TPU pods are not detected here: call ``jax.distributed.initialize()`` there.)

CPU collectives: a multi-process CPU run needs a cross-process collectives implementation (XLA's
default for CPU is none in older jaxlibs); :func:`initialize` selects ``gloo`` (TCP, in jaxlib; ``mpi``
needs an MPI library loaded and is not used here). The setting only affects the CPU backend, so
GPU runs are unchanged.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, Sharding

from rstar2_jax.model.sharding import batch_sharding, param_shardings

ENV_VARS = {  # field -> env names, in priority order
    "coordinator_address": ("RSTAR2_COORDINATOR", "JAX_COORDINATOR_ADDRESS"),
    "num_processes": ("RSTAR2_NUM_PROCESSES", "JAX_NUM_PROCESSES"),
    "process_id": ("RSTAR2_PROCESS_ID", "JAX_PROCESS_ID"),
}
# the variables JAX's own SLURM detection reads (jax._src.clusters.slurm_cluster); srun sets them all
SLURM_VARS = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProcessSetup:
    """How this process takes part: ``num_processes`` 1 means plain single-process JAX."""

    coordinator_address: str | None  # "host:port" of process 0's coordinator service
    num_processes: int | None  # None: left to the cluster auto-detection
    process_id: int | None  # 0 .. num_processes - 1 (None: auto-detected)
    source: str  # "single" | "args" | "env" | "slurm" | "openmpi" | "running" (where it came from)

    @property
    def multi(self) -> bool:
        return self.num_processes != 1


def _cluster(env: Mapping[str, str]) -> tuple[str, int] | None:
    """(name, number of tasks) of a launcher JAX auto-detects, when it started > 1 task."""
    if all(v in env for v in SLURM_VARS):
        return "slurm", int(env["SLURM_NTASKS"])
    if "OMPI_COMM_WORLD_SIZE" in env and "OMPI_MCA_orte_hnp_uri" in env:
        return "openmpi", int(env["OMPI_COMM_WORLD_SIZE"])
    return None


def resolve(coordinator_address: str | None = None, num_processes: int | None = None,
            process_id: int | None = None, *, env: Mapping[str, str] | None = None) -> ProcessSetup:
    """The process layout from arguments, then env vars, then a detected cluster (pure; no JAX call).

    Raises ``ValueError`` when a multi-process layout is asked for but incomplete and no cluster
    launcher can fill the gaps (e.g. ``RSTAR2_NUM_PROCESSES=2`` without a process id).
    """
    env = os.environ if env is None else env
    given = {"coordinator_address": coordinator_address, "num_processes": num_processes, "process_id": process_id}
    found = dict(given)
    from_env = False
    for field, names in ENV_VARS.items():
        for name in names:
            if found[field] is None and env.get(name, "") != "":
                found[field], from_env = env[name], True
    for field in ("num_processes", "process_id"):
        found[field] = None if found[field] is None else int(found[field])
    source = "env" if from_env else "args"
    cluster = _cluster(env)
    if found["num_processes"] == 1 or (found["num_processes"] is None and (cluster is None or cluster[1] <= 1)):
        if found["num_processes"] is None and found["process_id"] not in (None, 0):
            raise ValueError(f"process id {found['process_id']} given without a number of processes "
                             f"(set RSTAR2_NUM_PROCESSES)")
        return ProcessSetup(coordinator_address=None, num_processes=1, process_id=0, source="single")
    missing = [f for f, v in found.items() if v is None]
    if missing and cluster is None:
        raise ValueError(f"multi-process run without {missing}: set " +
                         ", ".join(ENV_VARS[f][0] for f in missing) + " (or pass them, or launch with srun)")
    if missing:
        source = cluster[0]
    return ProcessSetup(**found, source=source)


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, local_device_ids: int | list[int] | None = None,
               cpu_collectives: str = "gloo", initialization_timeout: int = 300) -> ProcessSetup:
    """Join the processes of a multi-process run (``jax.distributed.initialize``); no-op for one.

    Call first thing in every process, before any JAX computation or ``jax.devices()``. Calling it
    again after a successful start returns the running layout. ``local_device_ids`` restricts this
    process to some local GPUs (JAX's default under srun with one task per GPU is its SLURM_LOCALID).
    """
    if jax.distributed.is_initialized():
        return ProcessSetup(coordinator_address=None, num_processes=jax.process_count(),
                            process_id=jax.process_index(), source="running")
    setup = resolve(coordinator_address, num_processes, process_id)
    if not setup.multi:
        return setup
    jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
    jax.distributed.initialize(setup.coordinator_address, setup.num_processes, setup.process_id,
                               local_device_ids=local_device_ids, initialization_timeout=initialization_timeout)
    return dataclasses.replace(setup, num_processes=jax.process_count(), process_id=jax.process_index())


def is_main_process() -> bool:
    """True in process 0 (the one that logs, writes metrics files and evaluates)."""
    return jax.process_index() == 0


def put_global(x: Any, sharding: Sharding) -> jax.Array:
    """``x`` (a host array every process holds identically) as a global array with ``sharding``.

    Fully addressable sharding (one process): ``jax.device_put``. Otherwise each process copies
    its own devices' slices from its host copy (``make_array_from_callback``): no communication,
    where ``device_put`` would first all-gather ``x`` to check that it is equal everywhere.
    """
    if sharding.is_fully_addressable:
        return jax.device_put(x, sharding)
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])


def global_batch(batch: Mapping[str, Any], mesh: Mesh) -> dict[str, jax.Array]:
    """Every ``[B, ...]`` array of ``batch`` split over ("data","fsdp") of ``mesh`` (all processes);
    the same as ``rl.train_step.shard_batch``."""
    return {k: put_global(np.asarray(v), batch_sharding(mesh, np.ndim(v))) for k, v in batch.items()}


def process_rows(mesh: Mesh, n_rows: int) -> slice:
    """The rows ``[lo, hi)`` of an ``n_rows`` global batch whose shards live on this process's
    devices: what this process supplies to :func:`process_local_batch` (all rows in one process)."""
    index = batch_sharding(mesh, 1).addressable_devices_indices_map((n_rows,)).values()
    rows = sorted({(i[0].start or 0, n_rows if i[0].stop is None else i[0].stop) for i in index})
    lo, hi = rows[0][0], rows[-1][1]
    if sum(b - a for a, b in rows) != hi - lo:
        raise ValueError(f"this process's batch rows {rows} are not contiguous: order the mesh devices by process")
    return slice(lo, hi)


def process_local_batch(batch: Mapping[str, Any], mesh: Mesh) -> dict[str, jax.Array]:
    """Global batch arrays from each process's own rows (``batch[k][i]`` is global row
    ``process_rows(mesh, B).start + i``), e.g. when each process rolled out its share of the
    problems. One process: the same as :func:`global_batch`."""
    return {k: jax.make_array_from_process_local_data(batch_sharding(mesh, np.ndim(v)), np.asarray(v))
            for k, v in batch.items()}


def global_params(params: nnx.State, mesh: Mesh) -> nnx.State:
    """``params`` (initialised or loaded identically in every process) placed by their logical
    axes on ``mesh`` (``model.param_shardings``); one process: the same as ``model.shard_params``.

    Each process reads its own shards from its full host copy: fine for the tiny and mid-size
    policies here. An HF checkpoint is loaded without a full host copy by ``model.hf_io.load_hf``
    (each process reads only its devices' slices from the safetensors files)."""
    shardings = param_shardings(params, mesh)
    return jax.tree.map(lambda v, s: v.replace(put_global(v.get_value(), s.get_value())), params, shardings,
                        is_leaf=lambda x: isinstance(x, nnx.Variable))


def to_host(tree: Any) -> Any:
    """Every array leaf as a full numpy array in every process (a collective when a leaf has shards
    on other processes: call it everywhere, in the same order)."""
    from jax.experimental import multihost_utils

    def one(x):
        if isinstance(x, jax.Array) and not (x.is_fully_addressable or x.is_fully_replicated):
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return np.asarray(x)
    return jax.tree.map(one, tree)


def sync(name: str) -> None:
    """Barrier across processes (e.g. before process 0 reads files the others wrote); no-op for one."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(name)


def allgather_rows(x: np.ndarray) -> list[np.ndarray]:
    """Every process's ``x`` (``[n_i, ...]``, ``n_i`` may differ; same trailing shape and dtype), in
    process order; bit-exact (float64 travels as raw uint32 words, so no x64 mode is needed). A
    collective: call it in every process, in the same order. One process: ``[x]``, no JAX call."""
    x = np.ascontiguousarray(x)
    if jax.process_count() == 1:
        return [x]
    from jax.experimental import multihost_utils

    words = x.reshape(len(x), int(np.prod(x.shape[1:], dtype=np.int64))).view(np.uint8)
    words = np.pad(words, ((0, 0), (0, -words.shape[1] % 4))).view(np.uint32)  # [n, w]
    counts = np.asarray(multihost_utils.process_allgather(np.asarray([len(x)], np.int32))).reshape(-1)
    padded = np.zeros((int(counts.max()), words.shape[1]), np.uint32)
    padded[:len(x)] = words
    got = np.asarray(multihost_utils.process_allgather(padded))  # [P, max_n, w]
    nbytes = int(np.prod(x.shape[1:], dtype=np.int64)) * x.dtype.itemsize
    return [got[p, :c].view(np.uint8)[:, :nbytes].copy().view(x.dtype).reshape(c, *x.shape[1:])
            for p, c in enumerate(counts)]


def allgather_json(obj: Any) -> list[Any]:
    """Every process's JSON-able ``obj``, in process order (a collective; one process: ``[obj]``)."""
    import json

    if jax.process_count() == 1:
        return [obj]
    data = np.frombuffer(json.dumps(obj).encode("utf-8"), np.uint8).reshape(-1, 1)
    return [json.loads(x.tobytes().decode("utf-8")) for x in allgather_rows(data)]


def contiguous_shard(n: int, num_parts: int | None = None, part: int | None = None) -> slice:
    """Items ``[lo, hi)`` of ``n`` that process ``part`` of ``num_parts`` takes (default: this process
    of all); sizes differ by at most one, in process order."""
    num_parts = jax.process_count() if num_parts is None else num_parts
    part = jax.process_index() if part is None else part
    return slice(n * part // num_parts, n * (part + 1) // num_parts)
