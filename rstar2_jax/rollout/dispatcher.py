"""Capacity-based rollout dispatcher over several engines (rStar2-Agent's load-balanced scheduler).

One long-lived ``Dispatcher`` serves every batch of a run: ``run(problems, seed=..., budget=...)``
rolls each problem's ``n_samples`` trajectories to their end and returns them unscored (rewards are
the scoring stage's, ``rollout.score``). Each engine is driven by its own ``EngineWorker`` thread;
the dispatcher thread owns every trajectory, admits work, routes tool calls to the sandbox pool
asynchronously and feeds results back. Messages are ``rollout.messages`` dataclasses.

Admission is the ``admission`` package's, shared with the simulator: a problem's samples are one
group (they share the prompt's pages), pending groups are ordered by the policy at the batch's start
and ``admission.admit`` (the one admit loop) submits them while the ``AdmissionLedger``'s policy
places them: ``capacity`` on the engine with the most forecast capacity if it fits there, ``static``
an even split up front (KV overflow: the engine preempts the sequence with the least to recompute,
which recomputes later), ``dynamic`` longest-predicted first on the engine that would end its
predicted work with it first, among those with a free slot and room; with ``migrate`` a trajectory
back from a tool may move to an engine where it is predicted to finish sooner (with ``move_kv`` its
K/V goes along, ``sampling.interface.MovesKV``; else, or if the engine cannot export, its context is
prefilled there again; the seconds per step of each engine are measured from its steps and kept by
the ledger). The dispatcher's view of a live trajectory's progress is its tokens at its last turn
boundary plus, while it generates, the engine's model steps since (one token per step at most;
``Stepped.steps``: a decode-loop call runs several). The ledger's length
model and adaptive ratio persist across ``run`` calls: admission starts from what the policy does
now, not from the pessimistic prior, and it remembers each problem's final lengths (the
long-first order). Unless it migrates, a trajectory stays on its engine across turns; its forecast
is dropped when it finishes, aborts or errors.

Versions: each token carries the version of the weights that sampled it, as its engine's worker
reports it (``EngineWorker``: the worker applies ``SwapParams`` and acknowledges with ``Swapped``).
``policy_version`` is the version every engine has acknowledged, never a push not yet applied.

Failures are loud: model output is data (a malformed tool call, a failing tool: a tool error and no
reward), code failures are not. A failing ``engine.step()`` fails the batch (``Crashed``); so does a
refused command, with the worker's original traceback in the message, unless it is one of the
``EXPECTED_REFUSALS`` or ``RolloutConfig.max_errored`` still allows the trajectories it errors
(counted in ``errored_trajectories`` and warned with the traceback).
"""

from __future__ import annotations

import queue
import threading
import time
import warnings
from collections import Counter, deque
from typing import Any, Mapping, Sequence

import numpy as np

from rstar2_jax.admission import EngineShape, admit, new_ledger
from rstar2_jax.rollout.messages import (Admitted, Crashed, Event, Exported, ImportSeq, MoveOut, PushWeights, Refused,
                                         Release, Resume, Stepped, StopWorker, SubmitGroup, SwapParams, Swapped,
                                         ToolDone)
from rstar2_jax.rollout.problem import Problem
from rstar2_jax.rollout.state import Batch, Group, RolloutConfig, RolloutResult
from rstar2_jax.rollout.template import ToolCallError, render_prompt
from rstar2_jax.rollout.tool_runs import ToolRuns
from rstar2_jax.rollout.trajectory import Status, Trajectory, tool_calls_per_traj
from rstar2_jax.rollout.worker import EngineWorker
from rstar2_jax.sampling import Request, StopEvent
from rstar2_jax.sampling.interface import Configured, Engine
from rstar2_jax.sandbox import SandboxBackend
from rstar2_jax.text.tokenizer import Tokenizer

__all__ = ["ADMIT_EVERY", "EXPECTED_REFUSALS", "Dispatcher", "RolloutConfig", "RolloutResult", "is_expected_refusal"]

ADMIT_EVERY = 16  # engine steps between retries of a waiting group (a page of tokens per row)

EXPECTED_REFUSALS: dict[str, str] = {
    # command -> the refusal the dispatcher handles (counted in ``expected_refusals``), and why it is legitimate
    "Release": "the engine no longer holds the sequence (ValueError/KeyError 'unknown sequence'): it already "
               "finished and was released; releasing is idempotent, nothing is lost or leaked",
}
"""The refusals that are not failures. Every other refused command fails the batch (or, within
``RolloutConfig.max_errored``, errors its trajectories, warned and counted). Why the others are not
expected: engines have no capacity refusals (``submit_group``/``resume``/``import_seq`` queue what does
not fit now and the admission waits for room, ``admission.admit``); what they refuse is a request that
can never run (longer than ``max_seq_len`` or than the KV pool, bad token ids), and ``_build`` already
finishes a problem whose prompt plus budget cannot fit as an errored trajectory (data), before any
submit. So a refused submit, resume, import or move-out is a bug or a broken engine. Not refusals
either: a failed K/V export of a ``MoveOut`` (the worker answers ``Exported(export=None)``; the
context is prefilled again, counted in ``kv_export_errors``), and sandbox failures (tool errors).
A refused ``SwapParams`` always fails (the engine cannot take weights in flight)."""


def is_expected_refusal(msg: Refused) -> bool:
    """Whether ``msg`` is one of the ``EXPECTED_REFUSALS``."""
    return (isinstance(msg.command, Release) and msg.exc_type in ("ValueError", "KeyError")
            and "unknown sequence" in msg.error)


def _shape(engine: Engine) -> EngineShape:
    """The ledger's view of an engine (slots and prefill chunk from its config when it declares one)."""
    cfg = engine.cfg if isinstance(engine, Configured) else None  # a process-hosted engine may relay None
    if cfg is None:
        return EngineShape(engine.page_size, engine.usable_pages)
    return EngineShape(engine.page_size, engine.usable_pages, cfg.num_slots, cfg.prefill_chunk)


class Dispatcher:
    """Runs batches of problems to finished trajectories over ``engines`` (see module docstring).

    ``lengths``: final response lengths (tokens) of earlier trajectories, to seed the length model;
    ``history``: final lengths per problem id from earlier batches (the dynamic policy's order);
    ``step_s``: per engine, seconds per step known from earlier batches (the dynamic policy's
    speeds before this dispatcher has measured its own; a moving average of its steps after).
    """

    def __init__(self, engines: Sequence[Engine], pool: SandboxBackend | None, tokenizer: Tokenizer,
                 cfg: RolloutConfig, *,
                 lengths: Sequence[int] = (), history: Mapping[str, Sequence[int]] | None = None,
                 step_s: Sequence[float] | None = None):
        if not engines:
            raise ValueError("Dispatcher needs at least one engine")
        self.engines, self.pool, self.tok, self.cfg = list(engines), pool, tokenizer, cfg
        # version of the weights every engine holds (``Rollout.sync``; in a batch, the versions the workers
        # acknowledged, ``Swapped``); the tokens' versions are the workers' own (``EngineWorker``)
        self.policy_version = 0
        self._push_lock = threading.Lock()  # in-flight updates (``push``): whether a batch runs, what waits
        self._running, self._pending_push = False, None
        self.ledger = new_ledger(cfg.admission, cfg.budget, [_shape(e) for e in engines], lengths, history)
        for e, x in enumerate(step_s or ()):
            self.ledger.set_step_s(e, x)  # then a moving average of the measured steps
        markers = (tokenizer.eos_id, *cfg.template.stop_markers)
        self.stop_ids = tuple(sorted({i for m in markers if (i := self._id(m)) is not None}))
        self.stop_strings = tuple(m for m in cfg.template.stop_markers if self._id(m) is None)

    def _id(self, marker: int | str) -> int | None:
        if isinstance(marker, int):
            return marker
        try:
            return self.tok.token_id(marker)
        except KeyError:
            return None  # not a single token: matched as a stop string instead

    # -- main entry ------------------------------------------------------------------------------
    def run(self, problems: Sequence[Problem], *, seed: int = 0, budget: int | None = None,
            show_progress: bool = False, first_group: int = 0) -> RolloutResult:
        """Roll out ``n_samples`` trajectories per problem (``rollout.problem.Problem``);
        ``budget`` overrides ``cfg.budget`` for this batch (e.g. a recipe stage). ``first_group``: the
        global index of ``problems[0]`` when this is one process's shard of a batch (group ids and
        sampling keys are the global ones, so the shard rolls out as in a one-process run)."""
        from tqdm.auto import tqdm

        self.b = Batch(budget=self.cfg.budget if budget is None else budget, n_engines=len(self.engines))
        self.tools = ToolRuns(self.pool, self.cfg, self.b.out)  # this batch's calls and sessions
        trajs = self._build(problems, seed, first_group)
        self.ledger.new_batch(self.b.budget, self._progress)
        groups = list(self.b.pending)
        self.b.pending = deque(groups[i] for i in self.ledger.order([g.problem for g in groups]))
        start = [e.stats() for e in self.engines]
        self.b.preempt = [s.preemptions for s in start]
        preempt0 = list(self.b.preempt)
        t0 = time.perf_counter()
        with self._push_lock:  # weights pushed since the last batch: every engine is idle now
            push, self._pending_push, self._running = self._pending_push, None, True
        if push is not None and push.version > self.policy_version:
            for e, p in zip(self.engines, push.params):
                e.swap_params(p)
            self.policy_version = push.version
        self.b.held = [self.policy_version] * len(self.engines)
        self.workers = [EngineWorker(i, e, self.b.out, t0, self.policy_version) for i, e in enumerate(self.engines)]
        for w in self.workers:
            w.start()
        bar = tqdm(total=len(trajs), desc="rollout", disable=not show_progress, leave=False)
        bar.update(self.b.n_done)
        try:
            while self.b.n_done < len(trajs):
                if self.b.admit_due:
                    self._admit()
                before = self.b.n_done
                self._handle(self.b.out.get())
                bar.update(self.b.n_done - before)
        finally:
            for w in self.workers:
                w.commands.put(StopWorker())
            for w in self.workers:
                w.join()
            self.tools.end_all()  # sessions of trajectories a failing batch left live
            bar.close()
            late: list[Event] = []  # what the workers reported after the last trajectory finished
            with self._push_lock:  # a push not yet forwarded waits for the next batch
                self._running = False
                while True:
                    try:
                        msg = self.b.out.get_nowait()
                    except queue.Empty:
                        break
                    if isinstance(msg, PushWeights):
                        self._pending_push = msg
                    elif isinstance(msg, Swapped):  # applied before its worker stopped
                        self._on_swapped(msg)
                    elif isinstance(msg, (Refused, Crashed)):
                        late.append(msg)
        for msg in late:  # e.g. the final Releases: an expected refusal is counted, any other fails the batch
            self._handle(msg)
        metrics = self._metrics(trajs, time.perf_counter() - t0, preempt0)
        metrics["unshared_children"] = sum(e.stats().unshared_children - s.unshared_children
                                           for e, s in zip(self.engines, start))  # forks that found no room
        spans = [(self.b.t_start.get(t.uid, t0) - t0, self.b.t_end.get(t.uid, t0) - t0) for t in trajs]
        return RolloutResult(trajs, metrics, [w.timeline for w in self.workers], spans)

    def _build(self, problems: Sequence[Problem], seed: int, first_group: int = 0) -> list[Trajectory]:
        """The batch's trajectories (into ``self.b``); problems that cannot run finish as errors right away."""
        trajs, budget = self.b.trajs, self.b.budget
        max_len = min(e.max_seq_len for e in self.engines)
        max_kv = min(e.usable_pages * e.page_size for e in self.engines)  # positions an engine's pool holds
        for gi, p in enumerate(problems, start=first_group):
            text = str(p.problem or "")
            prompt = self.tok.encode(render_prompt(text, self.cfg.template))
            group = Group([], prompt, key=seed * 1_000_003 + gi, problem=str(p.id))
            for _ in range(self.cfg.n_samples):
                t = Trajectory(uid=len(trajs), group_id=gi, problem_id=str(p.id), gold=str(p.answer),
                               prompt_tokens=prompt, budget=budget)
                trajs.append(t)
                group.trajs.append(t)
                self.b.by_uid[t.uid] = t
            if not text.strip():
                err = "empty problem"
            elif len(prompt) + budget > max_len:
                err = f"prompt ({len(prompt)} tokens) + budget ({budget}) exceeds max_seq_len ({max_len})"
            elif len(prompt) + budget > max_kv:
                err = f"prompt ({len(prompt)} tokens) + budget ({budget}) exceeds an engine's KV pool ({max_kv} tokens)"
            else:
                err = None
            if err:
                for t in group.trajs:
                    t.finish("error", err)
                    self.b.n_done += 1
            else:
                self.b.pending.append(group)
        return trajs

    def push(self, params: Sequence[Any], version: int) -> None:
        """In-flight weight update (any thread): ``params[i]`` for engine i. While a batch runs the
        workers swap them in between steps (``PagedEngine.swap_params``: live sequences keep their K/V)
        and report each token's version; else they are swapped in at the next batch's start."""
        msg = PushWeights(tuple(params), int(version))
        with self._push_lock:
            if self._running:
                self.b.out.put(msg)
            else:
                self._pending_push = msg

    # -- admission ---------------------------------------------------------------------------------
    def _progress(self, uid: int) -> int:
        t = self.b.by_uid[uid]
        e = self.b.engine_of[uid]
        return len(t.response_tokens) + (self.b.clock[e] - self.b.mark[uid] if t.status is Status.GENERATING else 0)

    def _admit(self) -> None:
        """Submit pending groups while the ledger places them (``admission.admit``, the simulator's
        loop too). A group that has to wait is tried
        again only after an event that may have made room (``_handle`` sets ``_admit_due``): a
        stop, a finish, a preemption, a refusal, or every ``ADMIT_EVERY`` steps of an engine (the
        forecast follows progress), not after every step (a placement costs about a millisecond
        of host time, which the engines' host threads compete for)."""
        self.b.admit_due = False
        admit(self.ledger, self.b.pending, self._submit)

    def _submit(self, g: Group, e: int) -> None:
        g.engine = e
        now = time.perf_counter()
        for t in g.trajs:
            self.b.group_of[t.uid] = g
            self.b.engine_of[t.uid] = e
            self.b.mark[t.uid] = self.b.clock[e]
            self.b.t_start.setdefault(t.uid, now)
        self.b.fresh_prefill += len(g.prompt)
        self.ledger.on_submit(e, g, len(g.prompt), [t.uid for t in g.trajs], g.problem)
        request = Request(prompt=g.prompt, key=g.key, max_new_tokens=self.b.budget, sampler=self.cfg.sampler,
                          stop_token_ids=self.stop_ids, stop_strings=self.stop_strings)
        self.workers[e].commands.put(SubmitGroup(g, request, len(g.trajs)))

    # -- events ------------------------------------------------------------------------------------
    def _handle(self, msg: Event) -> None:
        if isinstance(msg, Stepped):
            e = msg.engine
            tick = self.b.clock[e] // ADMIT_EVERY
            self.b.clock[e] += msg.steps  # a decode loop ran several steps (a token each per row)
            if msg.steps:
                self.ledger.observe_step_s(e, msg.step_s / msg.steps)
            self.b.admit_due |= bool(msg.events) or msg.preemptions > self.b.preempt[e] or \
                self.b.clock[e] // ADMIT_EVERY > tick
            if msg.preemptions > self.b.preempt[e]:
                self.ledger.on_preemptions(msg.preemptions - self.b.preempt[e])
                self.b.preempt[e] = msg.preemptions
            for i, ev in enumerate(msg.events):  # without per-token versions: the worker's held version
                self._on_stop(e, ev, msg.version if msg.versions is None else msg.versions[i])
            return
        if isinstance(msg, PushWeights):  # policy_version moves when the workers acknowledge (Swapped)
            for w, p in zip(self.workers, msg.params):
                w.commands.put(SwapParams(p, msg.version))
            return
        if isinstance(msg, Swapped):
            self._on_swapped(msg)
            return
        self.b.admit_due = True  # a tool answered, a group was admitted, a command was refused
        if isinstance(msg, Admitted):
            for t, s in zip(msg.group.trajs, msg.seq_ids):
                self.b.by_seq[(msg.engine, s)] = t
                self.b.seq_of[t.uid] = (msg.engine, s)
        elif isinstance(msg, ToolDone):
            done = self.tools.done(msg)  # None: more calls of the turn to wait for, or the trajectory ended
            if done is not None:
                self._on_tool(self.b.by_uid[msg.uid], *done)
        elif isinstance(msg, Crashed):  # the engine's state is undefined now: fail the whole batch loudly
            raise RuntimeError(f"engine {msg.engine} crashed: {type(msg.exc).__name__}: {msg.exc}\n\n"
                               f"Original traceback (engine worker thread):\n{msg.traceback}") from msg.exc
        elif isinstance(msg, Exported):
            self._moved_out(msg)
        elif isinstance(msg, Refused):
            self._on_refused(msg)

    def _on_swapped(self, msg: Swapped) -> None:
        """Engine ``msg.engine`` holds ``msg.version``'s weights now; ``policy_version``: what all hold."""
        self.b.held[msg.engine] = max(self.b.held[msg.engine], msg.version)
        self.policy_version = max(self.policy_version, min(self.b.held))

    def _on_refused(self, msg: Refused) -> None:
        """An expected refusal (``EXPECTED_REFUSALS``) is counted; any other fails the batch with the
        worker's traceback, unless ``cfg.max_errored`` still allows erroring its trajectories."""
        cmd, e = msg.command, msg.engine
        if is_expected_refusal(msg):
            self.b.expected_refusals[type(cmd).__name__] += 1
            return
        what = f"engine {e} refused {type(cmd).__name__}: {msg.error}"
        tb = f"\n\nOriginal traceback (engine worker thread):\n{msg.traceback}"
        if isinstance(cmd, SwapParams):
            raise RuntimeError(f"engine {e} cannot take weights in flight: {msg.error}{tb}")
        if isinstance(cmd, Release):  # the trajectory is done: nothing to error, but the engine's state is in doubt
            raise RuntimeError(what + tb)
        trajs = cmd.group.trajs if isinstance(cmd, (SubmitGroup, MoveOut, ImportSeq)) else \
            [self.b.by_seq.get((e, cmd.seq_id))]
        trajs = [t for t in trajs if t is not None and t.status is not Status.DONE]
        if self.b.errored + len(trajs) > self.cfg.max_errored:
            raise RuntimeError(f"{what} ({self.b.errored} + {len(trajs)} errored trajectories > "
                               f"RolloutConfig.max_errored={self.cfg.max_errored}){tb}")
        self.b.errored += len(trajs)
        warnings.warn(f"{what}: {len(trajs)} trajectories errored ({self.b.errored} of max_errored="
                      f"{self.cfg.max_errored} in this batch){tb}", RuntimeWarning, stacklevel=2)
        for t in trajs:
            t.finish("error", msg.error)
            self._finish(t, self.b.seq_of.get(t.uid, (e, None))[1] if isinstance(cmd, Resume) else None)

    def _on_stop(self, e: int, ev: StopEvent, versions: int | Sequence[int]) -> None:
        """``versions``: the version of each of ``ev``'s tokens (one int: all of them), as its worker reports."""
        t = self.b.by_seq[(e, ev.seq_id)]
        t.on_generated(ev.tokens, ev.logprobs, ev.reason in ("max_new_tokens", "max_seq_len"),
                       self.tok, self.cfg.template, version=versions)
        if t.status is Status.DONE:
            self._finish(t, ev.seq_id)
            return
        self.b.mark[t.uid] = self.b.clock[e]
        self.ledger.on_progress(e, t.uid, waiting=True)
        done = self.tools.start(t)  # the turn's calls (``rollout.tool_runs``); results now if none waits
        if done is not None:
            self._on_tool(t, *done)

    def _on_tool(self, t: Trajectory, results: list[Any], latencies: list[float]) -> None:
        """Every call of ``t``'s turn answered (call order): append the responses and resume it."""
        e, seq_id = self.b.seq_of[t.uid]
        self.b.tool_latency.extend(x for r, x in zip(results, latencies) if not isinstance(r, ToolCallError))
        tokens = t.on_tool_results(results, latencies, self.tok, self.cfg.template)
        if tokens is None:
            self._finish(t, seq_id)
            return
        self.b.fresh_prefill += len(tokens)
        context = len(t.prompt_tokens) + len(t.response_tokens)
        f = self.ledger.migration(e, t.uid, context) if self.ledger.speeds_known else None
        if f is not None:
            self._migrate(t, e, seq_id, f, tokens)
            return
        self.b.mark[t.uid] = self.b.clock[e]
        self.ledger.on_progress(e, t.uid)
        self.workers[e].commands.put(Resume(seq_id, tokens, t.remaining))

    def _migrate(self, t: Trajectory, e: int, seq_id: int, f: int, tokens: list[int]) -> None:
        """Move ``t`` (back from a tool on ``e``; ``tokens``: the tool response) to ``f``: with
        ``move_kv`` the engine exports its K/V first (``MoveOut``, then ``_moved_out``); else it is
        freed on ``e`` and its whole context submitted to ``f`` as a one-sample group."""
        context = list(t.prompt_tokens) + list(t.response_tokens)
        self.b.by_seq.pop((e, seq_id), None)
        g = Group([t], context, key=(self.b.group_of[t.uid].key * 31 + len(t.turns) * 7 + 1) % (1 << 62),
                   engine=f, problem=self.b.group_of[t.uid].problem)
        self.ledger.on_move(e, f, t.uid, len(context), len(t.response_tokens))
        self.b.group_of[t.uid], self.b.engine_of[t.uid] = g, f
        self.b.mark[t.uid] = self.b.clock[f]
        self.b.migrations += 1
        if self.cfg.admission.move_kv:
            self.workers[e].commands.put(MoveOut(seq_id, g, f, tokens, t.remaining))
            return
        self.workers[e].commands.put(Release(seq_id))
        self._resubmit(g, t)

    def _moved_out(self, msg: Exported) -> None:
        """``msg.command``'s trajectory left its engine: import it where it goes (or resubmit its context)."""
        cmd = msg.command
        (t,) = cmd.group.trajs
        if t.status is Status.DONE:
            return
        if msg.export is None:
            if msg.error:
                self.b.export_errors[msg.error] += 1
            self._resubmit(cmd.group, t)
            return
        self.b.kv_moved += msg.export.cached
        self.workers[cmd.dest].commands.put(ImportSeq(cmd.group, msg.export, cmd.tokens, cmd.max_new_tokens))

    def _resubmit(self, g: Group, t: Trajectory) -> None:
        self.b.migrated_tokens += len(g.prompt)
        request = Request(prompt=g.prompt, key=g.key, max_new_tokens=t.remaining, sampler=self.cfg.sampler,
                          stop_token_ids=self.stop_ids, stop_strings=self.stop_strings)
        self.workers[g.engine].commands.put(SubmitGroup(g, request, 1))

    def _finish(self, t: Trajectory, seq_id: int | None) -> None:
        g = self.b.group_of.get(t.uid)
        self.b.n_done += 1
        self.b.t_end[t.uid] = time.perf_counter()
        self.tools.end(t.uid)  # its session, if it has one, ends with it
        if g is None:
            return  # never admitted
        e = self.b.engine_of[t.uid]
        if seq_id is not None:
            self.workers[e].commands.put(Release(seq_id))
        self.ledger.on_finish(e, t.uid, None if t.done_reason == "error" else len(t.response_tokens))

    def _metrics(self, trajs: list[Trajectory], makespan: float, preempt0: list[int]) -> dict[str, Any]:
        sampled = sum(sum(t.loss_mask) for t in trajs)
        lat = np.asarray(self.b.tool_latency) if self.b.tool_latency else np.zeros(1)
        traj_lat = np.asarray([self.b.t_end[u] - s for u, s in self.b.t_start.items() if u in self.b.t_end] or [0.0])
        return {
            "traj_latency_p50_s": float(np.percentile(traj_lat, 50)),
            "traj_latency_p90_s": float(np.percentile(traj_lat, 90)),  # first submission -> end
            "fresh_prefill_tokens": self.b.fresh_prefill,  # prompts (once per group) + tool responses
            "migrations": self.b.migrations, "migrated_tokens": self.b.migrated_tokens,  # contexts prefilled again
            "kv_moved_tokens": self.b.kv_moved,  # cached positions that moved with their K/V (not recomputed)
            "kv_export_errors": dict(self.b.export_errors),  # why an export failed -> count (normally empty)
            "errored_trajectories": self.b.errored,  # errored by failing commands (RolloutConfig.max_errored)
            "expected_refusals": dict(self.b.expected_refusals),  # EXPECTED_REFUSALS handled, by command
            "policy": self.cfg.admission.policy.value, "step_s": self.ledger.measured_step_s(),
            "makespan_s": makespan, "output_tokens": sampled, "tokens_per_s": sampled / max(makespan, 1e-9),
            "preemptions": int(sum(self.b.preempt) - sum(preempt0)),
            "idle_fraction": [max(0.0, 1 - w.busy_s / max(makespan, 1e-9)) for w in self.workers],
            "kv_peak_pages": [max((u for _, u in w.timeline), default=0) for w in self.workers],
            "kv_total_pages": [e.usable_pages for e in self.engines],
            "tool_sessions_ended": self.tools.sessions_ended,  # persistent jupyter sessions ended (one per user)
            "tool_calls": len(self.b.tool_latency), "tool_latency_p50_s": float(np.percentile(lat, 50)),
            "tool_latency_p99_s": float(np.percentile(lat, 99)), "tool_time_s": float(np.sum(self.b.tool_latency)),
            "turns_per_traj": float(np.mean([len(t.turns) for t in trajs])),
            "tool_calls_per_traj": tool_calls_per_traj(trajs),
            "done_reasons": dict(Counter(t.done_reason for t in trajs)),
            "reserve_ratio": self.ledger.ratio.value,
            "length_model_n": self.ledger.lengths_seen,
        }
