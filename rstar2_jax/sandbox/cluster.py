"""RaySandboxPool: the sandbox pool over a Ray cluster (one actor per node, each hosting a ``SandboxPool``).

Usage (``pip install -e '.[ray]'``; ``ray.init`` first, or let the pool call ``ray.init(address=...)``)::

    from rstar2_jax.sandbox import CodeRequest, SandboxLimits
    from rstar2_jax.sandbox.cluster import ClusterConfig, RaySandboxPool

    with RaySandboxPool(limits=SandboxLimits(wall_s=5.0), config=ClusterConfig(workers_per_node=32)) as pool:
        pool.run(CodeRequest(code="1 + 1")).stdout                     # '2\\n'
        pool.run_batch([CodeRequest(code=f"{i}") for i in range(1000)])  # results in order
        pool.submit(CodeRequest(code="1"))                             # concurrent.futures.Future

Same API as ``SandboxPool`` (``submit``, ``run``, ``run_batch``, ``run_async``, ``stats``, ``close``,
``limits``, ``isolation``), so the rollout's dispatcher and the verifier take either backend.

* Placement: one actor per alive node that has CPUs (and ``config.node_resource`` if set), pinned to it
  (``NodeAffinitySchedulingStrategy``, soft), reserving ``num_cpus`` = its workers (``workers_per_node``,
  capped at the node's CPUs; the node's CPU count when None). No GPU is asked for: CPU-only nodes serve.
* Client: ``submit`` puts the call in a bounded queue (``max_pending`` calls queued or in flight); when it is
  full the caller waits up to ``submit_timeout_s``, then gets ``SandboxBusyError`` naming the numbers.
  One batching thread sends up to ``batch_size`` (64) calls per actor request, or what has waited
  ``batch_deadline_s`` (20 ms), to the healthy actor with the fewest outstanding calls that has room
  (each actor holds at most ``inflight_per_worker`` x workers calls, and at least 4 batches, so that a batch
  held back by one slow call does not idle the node; the rest waits here, where it can still go to any actor).
* Faults: when an actor request fails (the actor died mid-batch, or its node), each of its calls that has
  run once goes once more to an actor (another one when any other is healthy; the restarted one
  otherwise); a call that already ran twice comes back as ``sandbox_error``. **A call may run at most twice.**
  Every submitted call gets exactly one result; futures never raise. Actors restart (Ray ``max_restarts``;
  ``max_task_retries=0``: the client, not Ray, retries), are probed with ``ping`` and used again once they
  answer; one not back within ``restart_timeout_s`` (or dead more than ``max_restarts`` times) is dropped,
  and when none is left every waiting call is answered with ``sandbox_error``.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import threading
import time
from typing import Any, Sequence

from .actor import ClusterConfig, SandboxActor, SandboxBusyError
from .backend import SandboxBackend, percentile_ms
from .isolation import Isolation
from .limits import STATUSES, CodeRequest, CodeResult, SandboxLimits, SessionState

try:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
except ImportError:  # pragma: no cover - the optional extra
    ray = None

__all__ = ["ClusterConfig", "RaySandboxPool", "SandboxActor", "SandboxBusyError"]


class _Call:
    __slots__ = ("req", "future", "runs", "submitted", "failed_on")

    def __init__(self, req: CodeRequest) -> None:
        self.req, self.future, self.runs = req, concurrent.futures.Future(), 0
        self.submitted, self.failed_on = time.monotonic(), -1


class _Actor:
    """Client-side state of one actor."""

    def __init__(self, index: int, handle: Any, workers: int, capacity: int) -> None:
        self.index, self.handle, self.workers, self.capacity = index, handle, workers, capacity
        self.outstanding = 0
        self.healthy = True
        self.down_since = 0.0
        self.deaths = 0
        self.info: dict = {}


def _result(t: Sequence) -> CodeResult:
    return CodeResult(*t)


def _payload(req: CodeRequest) -> tuple:
    return (req.code, req.stdin, req.wrap, req.timeout_s, req.session, req.history)


class RaySandboxPool(SandboxBackend):
    """The ``SandboxBackend`` over Ray actors, one per node. See the module docstring."""

    submit_blocks = True  # a full queue blocks ``submit``

    def __init__(self, limits: SandboxLimits = SandboxLimits(), config: ClusterConfig = ClusterConfig()) -> None:
        if ray is None:
            raise RuntimeError("RaySandboxPool needs Ray: pip install -e '.[ray]'")
        if not isinstance(limits, SandboxLimits):
            raise ValueError(f"RaySandboxPool.limits must be a SandboxLimits, got {type(limits).__name__}")
        if not isinstance(config, ClusterConfig):
            raise ValueError(f"RaySandboxPool.config must be a ClusterConfig, got {type(config).__name__}")
        self.limits, self.config = limits, config
        if not ray.is_initialized():
            ray.init(address=config.address, include_dashboard=False, log_to_driver=False)
        self._cv = threading.Condition()
        self._queue: collections.deque[_Call] = collections.deque()  # new calls, FIFO
        self._retry: collections.deque[_Call] = collections.deque()  # calls of failed requests, sent first
        self._pending = 0  # queued + in flight
        self._closed = False
        self._counts = collections.Counter({s: 0 for s in STATUSES})
        self._latency: collections.deque[float] = collections.deque(maxlen=20_000)
        self._batches = self._batched_calls = self._retried = self._failures = self._dropped = 0
        self._sessions: dict[str, list] = {}  # session key -> [its actor, cells answered]
        self._actors = self._start_actors()
        self._batcher = threading.Thread(target=self._batch_loop, name="rstar2-ray-batcher", daemon=True)
        self._batcher.start()

    # ------------------------------------------------------------------ actors
    def _start_actors(self) -> list[_Actor]:
        cfg = self.config
        nodes = [n for n in ray.nodes() if n.get("Alive") and n["Resources"].get("CPU", 0) >= 1
                 and (cfg.node_resource is None or n["Resources"].get(cfg.node_resource, 0) > 0)]
        nodes.sort(key=lambda n: n["NodeID"])
        if cfg.max_nodes is not None:
            nodes = nodes[:cfg.max_nodes]
        if not nodes:
            raise RuntimeError(f"RaySandboxPool: no alive Ray node with CPUs"
                               f"{'' if cfg.node_resource is None else ' and resource ' + repr(cfg.node_resource)}")
        remote = ray.remote(SandboxActor)
        actors = []
        for i, node in enumerate(nodes):
            cpus = int(node["Resources"]["CPU"])
            workers = min(cfg.workers_per_node or cpus, cpus)
            handle = remote.options(
                num_cpus=workers, max_restarts=cfg.max_restarts, max_task_retries=0, max_concurrency=1000,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node["NodeID"], soft=True),
                **({"runtime_env": cfg.runtime_env} if cfg.runtime_env else {})).remote(workers, self.limits)
            capacity = max(workers * cfg.inflight_per_worker, 4 * cfg.batch_size)  # batches overlap
            actors.append(_Actor(i, handle, workers, capacity))
        refs = [a.handle.ping.remote() for a in actors]
        try:
            infos = ray.get(refs, timeout=cfg.startup_timeout_s)
        except Exception as exc:
            for a in actors:
                ray.kill(a.handle, no_restart=True)
            raise RuntimeError(f"RaySandboxPool: actors not ready within {cfg.startup_timeout_s} s: "
                               f"{type(exc).__name__}: {exc}") from exc
        for a, info in zip(actors, infos):
            a.info = info
        return actors

    def actor_infos(self) -> list[dict]:
        """pid, node id, workers and isolation of each actor (as of its last ping)."""
        with self._cv:
            return [dict(a.info, index=a.index, healthy=a.healthy) for a in self._actors]

    def _ping(self, actor: _Actor) -> None:
        """Probe a failed actor until it answers (healthy again) or ``restart_timeout_s`` passes (dropped)."""
        try:
            ref = actor.handle.ping.remote()
        except Exception:  # noqa: BLE001 - the handle itself is unusable
            self._drop(actor, "its handle failed")
            return

        def done(f) -> None:
            try:
                info = f.result()
            except Exception:  # noqa: BLE001 - still restarting (or gone): try again later
                if time.monotonic() - actor.down_since > self.config.restart_timeout_s:
                    self._drop(actor, f"not back within {self.config.restart_timeout_s} s")
                elif not self._closed:
                    threading.Timer(0.5, self._ping, args=(actor,)).start()
                return
            with self._cv:
                actor.info, actor.healthy = info, True
                self._cv.notify_all()

        ref.future().add_done_callback(done)

    def _drop(self, actor: _Actor, why: str) -> None:
        failed: list[_Call] = []
        with self._cv:
            if actor not in self._actors:
                return
            self._actors.remove(actor)
            self._dropped += 1
            if not self._actors:  # nothing can run them any more
                failed = [*self._retry, *self._queue]
                self._retry.clear()
                self._queue.clear()
            self._cv.notify_all()
        for call in failed:
            self._answer(call, CodeResult.sandbox_error(
                f"sandbox error: no sandbox actor left (actor {actor.index} {why})"))

    # ------------------------------------------------------------------ submitting
    def submit(self, req: CodeRequest) -> "concurrent.futures.Future[CodeResult]":
        """Queue one call; waits (up to ``submit_timeout_s``) while the queue is full. The future always
        completes with a ``CodeResult``. Raises ``SandboxBusyError`` (a full cluster) or ``RuntimeError``."""
        if not isinstance(req, CodeRequest):
            raise TypeError(f"RaySandboxPool.submit expects a CodeRequest, got {type(req).__name__}")
        call = _Call(req)
        deadline = time.monotonic() + self.config.submit_timeout_s
        with self._cv:
            while self._pending >= self.config.max_pending and not self._closed and self._actors:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SandboxBusyError(
                        f"RaySandboxPool full: {self._pending} calls pending (max_pending="
                        f"{self.config.max_pending}) for {self.config.submit_timeout_s} s; "
                        f"{sum(a.healthy for a in self._actors)}/{len(self._actors)} actors healthy")
                self._cv.wait(left)
            if self._closed:
                raise RuntimeError("RaySandboxPool is closed")
            if not self._actors:
                raise RuntimeError("RaySandboxPool has no sandbox actor left")
            self._pending += 1
            if req.session is not None:
                actor = self._session_actor(req.session)
            else:
                self._queue.append(call)
                if len(self._queue) + len(self._retry) >= self.config.batch_size or len(self._queue) == 1:
                    self._cv.notify_all()
                return call.future
        self._send_cell(actor, call)
        return call.future

    # ------------------------------------------------------------------ sessions
    def _session_actor(self, key: str) -> _Actor:
        """The actor holding session ``key`` (placed on the healthy one with the fewest sessions). Called
        with ``_cv`` held."""
        entry = self._sessions.get(key)
        if entry is None or not entry[0].healthy and any(a.healthy for a in self._actors):
            healthy = [a for a in self._actors if a.healthy] or self._actors
            load = collections.Counter(e[0].index for e in self._sessions.values())
            actor = min(healthy, key=lambda a: (load[a.index] / a.workers, a.index))
            entry = self._sessions[key] = [actor, entry[1] if entry else 0]
        return entry[0]

    def _send_cell(self, actor: _Actor, call: _Call) -> None:
        """A session's cell goes straight to its actor, alone (cells of a session run one at a time, in the
        order they are submitted: submit the next after the last one's result). Never retried: a failed
        actor ends the session (the next cell says RESTARTED)."""
        key = call.req.session

        def done(f) -> None:
            try:
                result = _result(f.result()[0])
            except Exception as exc:  # noqa: BLE001 - the actor (or its node) failed: the session is gone
                result = CodeResult.sandbox_error(f"sandbox error: actor {actor.index} failed: {type(exc).__name__}")
                result = dataclasses.replace(result, session=SessionState.KEPT, session_ended=True)
                self._ping(actor)
            with self._cv:
                entry = self._sessions.get(key)
                if entry is not None:
                    if result.session == SessionState.NEW and entry[1]:  # the actor restarted since
                        result = dataclasses.replace(result, session=SessionState.RESTARTED)
                    entry[1] += 1
            self._answer(call, result)

        call.runs += 1
        try:
            actor.handle.run_batch.remote([_payload(call.req)]).future().add_done_callback(done)
        except Exception as exc:  # noqa: BLE001
            self._answer(call, CodeResult.sandbox_error(f"sandbox error: {type(exc).__name__}: {exc}"))

    def end_session(self, session: str) -> None:
        """End ``session`` on its actor (``SandboxBackend.end_session``); does not wait."""
        with self._cv:
            entry = self._sessions.pop(session, None)
        if entry is not None:
            try:
                entry[0].handle.end_session.remote(session)
            except Exception:  # noqa: BLE001 - a dead actor took its sessions with it
                pass

    # ------------------------------------------------------------------ batching
    def _take(self, actor: _Actor, n: int) -> list[_Call]:
        """Up to ``n`` calls for ``actor``: retries first (not back to the actor they failed on while
        another actor is healthy), then new calls in submission order."""
        others = any(a.healthy and a is not actor for a in self._actors)
        batch: list[_Call] = []
        keep: list[_Call] = []
        while self._retry and len(batch) < n:
            call = self._retry.popleft()
            (keep if others and call.failed_on == actor.index else batch).append(call)
        self._retry.extendleft(reversed(keep))
        while self._queue and len(batch) < n:
            batch.append(self._queue.popleft())
        return batch

    def _batch_loop(self) -> None:
        cfg = self.config
        while True:
            with self._cv:
                while True:
                    waiting = len(self._queue) + len(self._retry)
                    if self._closed and not waiting and not any(a.outstanding for a in self._actors):
                        return
                    ready = [a for a in self._actors if a.healthy and a.outstanding < a.capacity]
                    if not waiting or not ready:
                        self._cv.wait(0.05)
                        continue
                    actor = min(ready, key=lambda a: (a.outstanding / a.workers, a.index))
                    room = min(cfg.batch_size, actor.capacity - actor.outstanding)
                    oldest = (self._retry or self._queue)[0].submitted
                    age = time.monotonic() - oldest
                    if waiting < room and age < cfg.batch_deadline_s and not self._closed:
                        self._cv.wait(cfg.batch_deadline_s - age)
                        continue
                    batch = self._take(actor, room)
                    if not batch:  # only retries bound elsewhere are waiting
                        self._cv.wait(0.01)
                        continue
                    actor.outstanding += len(batch)
                    break
            for call in batch:
                call.runs += 1
            self._send(actor, batch)

    def _send(self, actor: _Actor, batch: list[_Call]) -> None:
        try:
            ref = actor.handle.run_batch.remote([_payload(c.req) for c in batch])
        except Exception as exc:  # noqa: BLE001 - e.g. a handle of a dead actor
            self._on_failure(actor, batch, exc)
            return
        with self._cv:
            self._batches += 1
            self._batched_calls += len(batch)
        ref.future().add_done_callback(lambda f: self._on_done(actor, batch, f))

    def _on_done(self, actor: _Actor, batch: list[_Call], f: concurrent.futures.Future) -> None:
        try:
            results = f.result()
            if len(results) != len(batch):
                raise RuntimeError(f"actor returned {len(results)} results for {len(batch)} calls")
        except Exception as exc:  # noqa: BLE001 - RayActorError and friends: the actor (or its node) failed
            self._on_failure(actor, batch, exc)
            return
        with self._cv:
            actor.outstanding -= len(batch)
            self._cv.notify_all()
        for call, t in zip(batch, results):
            self._answer(call, _result(t))

    def _on_failure(self, actor: _Actor, batch: list[_Call], exc: BaseException) -> None:
        give_up: list[_Call] = []
        with self._cv:
            actor.outstanding -= len(batch)
            self._failures += 1
            first_failure = actor.healthy
            if first_failure:
                actor.healthy, actor.down_since = False, time.monotonic()
                actor.deaths += 1
            for call in reversed(batch):
                if call.runs < 2 and self._actors and not (self._closed and not self._actors):
                    call.failed_on = actor.index
                    self._retry.appendleft(call)
                    self._retried += 1
                else:
                    give_up.append(call)
            self._cv.notify_all()
        for call in reversed(give_up):
            self._answer(call, CodeResult.sandbox_error(f"sandbox error: actor {actor.index} failed on the call's "
                                                        f"second run: {type(exc).__name__}: {str(exc)[:200]}"))
        if first_failure:
            if 0 <= self.config.max_restarts < actor.deaths:
                self._drop(actor, f"died {actor.deaths} times (max_restarts={self.config.max_restarts})")
            else:
                self._ping(actor)

    def _answer(self, call: _Call, result: CodeResult) -> None:
        if call.future.done():  # never a second result
            return
        call.future.set_result(result)
        with self._cv:
            self._pending -= 1
            self._counts[result.status] += 1
            self._latency.append(time.monotonic() - call.submitted)
            self._cv.notify_all()

    # ------------------------------------------------------------------ bookkeeping
    @property
    def isolation(self) -> Isolation | None:
        """What the first actor's workers achieved (``Isolation.mode``)."""
        with self._cv:
            for a in self._actors:
                if a.info.get("isolation"):
                    return Isolation(**a.info["isolation"])
        return None

    def stats(self) -> dict:
        """Calls, statuses, latency p50/p99 (ms, submit -> result), batching, retries, actors."""
        with self._cv:
            latency = sorted(self._latency)
            actors = [a for a in self._actors if a.healthy]
        try:  # interpreters alive on the actors (persistent sessions)
            live = sum(s.get("live_sessions", 0) for s in ray.get([a.handle.stats.remote() for a in actors],
                                                                    timeout=30))
        except Exception:  # noqa: BLE001 - an actor going down meanwhile
            live = None
        with self._cv:
            return {
                "backend": "ray",
                "live_sessions": live, "session_keys": len(self._sessions),
                "calls": sum(self._counts.values()), "statuses": dict(self._counts),
                "latency_p50_ms": percentile_ms(latency, 50), "latency_p99_ms": percentile_ms(latency, 99),
                "pending": self._pending, "queue_depth": len(self._queue) + len(self._retry),
                "batches": self._batches,
                "mean_batch": self._batched_calls / self._batches if self._batches else None,
                "retried": self._retried, "failed_requests": self._failures, "dropped_actors": self._dropped,
                "actors": len(self._actors), "healthy_actors": sum(a.healthy for a in self._actors),
                "workers": sum(a.workers for a in self._actors),
                "actor_deaths": sum(a.deaths for a in self._actors),
                "isolation": self.isolation.mode if self.isolation else None,
                "closed": self._closed,
            }

    # ------------------------------------------------------------------ lifetime
    def close(self, *, cancel_pending: bool = False) -> None:
        """Stop accepting calls; finish queued ones (or answer them with sandbox_error); kill the actors."""
        with self._cv:
            if self._closed:
                return
            self._closed = True
            cancelled = [*self._retry, *self._queue] if cancel_pending else []
            if cancel_pending:
                self._retry.clear()
                self._queue.clear()
            self._cv.notify_all()
        for call in cancelled:
            self._answer(call, CodeResult.sandbox_error("sandbox error: pool closed"))
        self._batcher.join()
        for a in list(self._actors):
            try:
                ray.kill(a.handle, no_restart=True)
            except Exception:  # noqa: BLE001
                pass
