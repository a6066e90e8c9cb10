"""Capacity-based rollout dispatcher over several engines (rStar2-Agent's load-balanced scheduler).

Each engine is driven by its own thread; the dispatcher thread owns every trajectory, admits
work, routes tool calls to the sandbox pool asynchronously and feeds results back. Engines in one
process share the GIL with each other and the dispatcher (two measured 1.15x one engine's steps/s
on 2 cores); ``engine_proc.ProcessEngine`` runs each engine in its own process pinned to its cores
behind the same API (2.08x), as one engine per device group does on accelerators.

Admission (``policy="capacity"``): a problem's 2G samples are one group (they share the prompt's
pages). The dispatcher forecasts each engine's KV pages over the next ``B`` tokens from its live
trajectories' progress (tokens at their last turn boundary plus the engine steps since) and a
length model learnt online from this batch and earlier ones (``capacity``: Kaplan-Meier survival,
pessimistic prior; a group's samples correlated)::

    capacity(e) = usable_pages(e) - ratio * max_tau (mean_e(tau) + sigma * sd_e(tau))

The head group goes to the engine with the most capacity if its samples fit that bound
(``capacity.fits``); an engine with no live trajectory takes the part that fits (at least one
sample; the rest stays at the head). ``reserve="budget"`` forecasts every live trajectory at its
full budget instead (worst case: no overflow possible at ratio >= 1). Choosing, reserving and
submitting is one step of the dispatcher thread, so two admissions never race. ``ratio`` adapts
(``capacity.AdaptiveRatio``): ``+ratio_up`` when an engine reports a preemption, ``* ratio_decay``
per admission otherwise. A trajectory stays on its engine across turns; its forecast is dropped
when it finishes, aborts or errors.

``policy="static"`` is the common baseline: groups split evenly across engines up front, each
engine given all of its share at once and run to completion (KV overflow: the engine preempts the
newest sequence, which recomputes later).
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections import Counter, deque
from typing import Any, Callable, Sequence

import numpy as np

from rstar2_jax.rollout.capacity import AdaptiveRatio, AdmissionConfig, LengthModel, fits, forecast
from rstar2_jax.rollout.template import TemplateConfig, ToolCall, ToolCallError, render_prompt
from rstar2_jax.rollout.trajectory import Status, Trajectory
from rstar2_jax.sampling import PagedEngine, Request, Sampler, StopEvent, Temperature
from rstar2_jax.sandbox import CodeRequest, CodeResult
from rstar2_jax.tokenizer import Tokenizer

RewardBatchFn = Callable[[list[list[str]], list[str]], list[tuple[float, dict]]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RolloutConfig(AdmissionConfig):
    """What to roll out (samples, budget, sampler, template) and, inherited, how to admit it."""

    n_samples: int = 2  # 2G: rollouts per problem before RoC keeps G
    budget: int = 256  # response tokens per trajectory, tool tokens included
    sampler: Sampler = Temperature(temperature=1.0)
    template: TemplateConfig = TemplateConfig()
    tool_timeout_s: float | None = None  # None: the pool's limits

    def __post_init__(self) -> None:
        if self.n_samples < 1:
            raise ValueError(f"RolloutConfig.n_samples must be >= 1, got {self.n_samples}")
        if self.budget < 1:
            raise ValueError(f"RolloutConfig.budget must be >= 1, got {self.budget}")
        super().__post_init__()


@dataclasses.dataclass
class RolloutResult:
    trajectories: list[Trajectory]
    metrics: dict[str, Any]
    timeline: list[list[tuple[float, int]]]  # per engine: (seconds since start, KV pages in use)


@dataclasses.dataclass(eq=False)
class _Group:
    trajs: list[Trajectory]
    prompt: list[int]
    key: int
    engine: int = -1
    live: int = 0  # admitted trajectories not yet done


class _EngineThread(threading.Thread):
    """Owns one engine: applies commands, steps while there is work, reports events."""

    def __init__(self, idx: int, engine: PagedEngine, out: queue.Queue, t0: float):
        super().__init__(daemon=True, name=f"engine-{idx}")
        self.idx, self.engine, self.out, self.t0 = idx, engine, out, t0
        self.cmds: queue.Queue = queue.Queue()
        self.busy_s = 0.0
        self.timeline: list[tuple[float, int]] = []

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as e:  # noqa: BLE001 - a dead engine thread must not leave run() waiting forever
            self.out.put(("crashed", self.idx, e))

    def _loop(self) -> None:
        while True:
            try:
                cmd = self.cmds.get(block=not self.engine.has_work())
            except queue.Empty:
                cmd = None
            if cmd is not None:
                if cmd[0] == "stop":
                    return
                self._apply(cmd)
                continue  # drain all pending commands before stepping
            t = time.perf_counter()
            events = self.engine.step()
            self.busy_s += time.perf_counter() - t
            st = self.engine.stats()
            self.timeline.append((time.perf_counter() - self.t0, st["kv_pages_in_use"]))
            self.out.put(("events", self.idx, events, st["preemptions"]))

    def _apply(self, cmd: tuple) -> None:
        kind, *args = cmd
        try:
            if kind == "group":
                group, request = args
                self.out.put(("admitted", self.idx, group, self.engine.submit_group(request, len(group.trajs))))
            elif kind == "resume":
                seq_id, tokens, max_new = args
                self.engine.resume(seq_id, tokens, max_new_tokens=max_new)
            elif kind == "release":
                self.engine.release(args[0])
                self.timeline.append((time.perf_counter() - self.t0, self.engine.stats()["kv_pages_in_use"]))
        except Exception as e:  # an engine refusal fails those trajectories, not the batch
            self.out.put(("engine_error", self.idx, kind, args, f"{type(e).__name__}: {e}"))


class Dispatcher:
    """Runs a batch of problems to finished, rewarded trajectories over ``engines``.

    ``lengths``: final response lengths (tokens) of earlier batches' trajectories, to seed the
    length model (``self.model.lengths()`` after a run gives them for the next dispatcher); the
    model also keeps learning across ``run`` calls of one dispatcher.
    """

    def __init__(self, engines: Sequence[PagedEngine], pool: Any, tokenizer: Tokenizer,
                 reward_fn: RewardBatchFn, cfg: RolloutConfig, lengths: Sequence[int] = ()):
        if not engines:
            raise ValueError("Dispatcher needs at least one engine")
        self.engines, self.pool, self.tok, self.reward_fn, self.cfg = list(engines), pool, tokenizer, reward_fn, cfg
        self.ratio = AdaptiveRatio(cfg.reserve_ratio, cfg.reserve_ratio_min, cfg.reserve_ratio_max,
                                   cfg.ratio_up, cfg.ratio_decay)
        self.model = LengthModel(cfg.budget, cfg.prior_weight, lengths) if cfg.reserve == "estimate" else None
        self.stop_ids = tuple(sorted({tokenizer.eos_id, *self._ids(*cfg.template.stop_markers)}))

    def _ids(self, *tokens: str) -> list[int]:
        out = []
        for t in tokens:
            try:
                out.append(self.tok.token_id(t))
            except KeyError:
                pass  # not a single token: matched as a stop string instead
        return out

    def _request(self, prompt: list[int], key: int, max_new: int) -> Request:
        strings = tuple(s for s in self.cfg.template.stop_markers if not self._ids(s))
        return Request(prompt=prompt, key=key, max_new_tokens=max_new, sampler=self.cfg.sampler,
                       stop_token_ids=self.stop_ids, stop_strings=strings)

    # -- capacity bookkeeping (dispatcher thread only) --------------------------------------------
    def _account(self, t: Trajectory, e: int, live: bool) -> None:
        """``t`` was admitted, reached a turn boundary or ended: refresh ``e``'s forecast."""
        if not live:
            self._live_t[e].pop(t.uid, None)
            if self.model is not None:
                self.model.track(t.uid, None)
        else:
            self._live_t[e][t.uid] = t
            self._mark[t.uid] = self._clock[e]
        self._refresh(e)

    def _refresh(self, e: int) -> None:
        """Forecast ``e``'s pages from its live trajectories' progress: tokens at their last turn
        boundary plus, while generating, the engine steps since (one token per step at most). The
        static policy never reads a forecast: nothing to do."""
        if self.cfg.policy == "static":
            return
        ps, b, clock = self.engines[e].cfg.page_size, self.cfg.budget, self._clock[e]
        ts = list(self._live_t[e].values())
        used = [len(t.response_tokens) + (clock - self._mark[t.uid] if t.status is Status.GENERATING else 0)
                for t in ts]
        if self.model is not None:
            for t, u in zip(ts, used):
                self.model.track(t.uid, u)
        self._curve[e], self._var[e] = forecast(self.model, used, [len(t.prompt_tokens) % ps for t in ts], b, ps,
                                                [self._group_of[t.uid].key for t in ts])

    def _usable(self, e: int) -> int:
        return self.engines[e].num_pages - 1

    def _capacity(self, e: int) -> float:
        sd = self.cfg.reserve_sigma * np.sqrt(self._var[e])
        return self._usable(e) - self.ratio.value * float(np.max(self._curve[e] + self._shared[e] + sd))

    def _submit_group(self, g: _Group, e: int) -> None:
        g.engine, g.live = e, len(g.trajs)
        self._shared[e] += len(g.prompt) // self.engines[e].cfg.page_size  # full prompt pages, shared
        self._live_n[e] += g.live
        for t in g.trajs:
            self._group_of[t.uid] = g
            self._live_t[e][t.uid] = t
            self._mark[t.uid] = self._clock[e]
        self._refresh(e)
        self.workers[e].cmds.put(("group", g, self._request(g.prompt, g.key, self.cfg.budget)))

    def _admit(self) -> None:
        while self._pending:
            g = self._pending[0]
            if self.cfg.policy == "static":
                self._submit_group(self._pending.popleft(), g.engine)
                continue
            e = int(np.argmax([self._capacity(e) for e in range(len(self.engines))]))
            self._refresh(e)  # the others' forecasts are as of their last turn boundary
            ps, n = self.engines[e].cfg.page_size, len(g.trajs)
            sample = forecast(self.model, [0], [len(g.prompt) % ps], self.cfg.budget, ps)
            k = fits(self._curve[e] + self._shared[e], self._var[e], sample, len(g.prompt) // ps, n,
                     self.ratio.value, self.cfg.reserve_sigma, self._usable(e))
            if k < n:
                if self._live_n[e]:
                    return  # wait for memory
                k = max(k, 1)  # an empty engine takes the part of the group that fits
                self._pending[0] = _Group(g.trajs[k:], g.prompt, key=(g.key * 7919 + k) % (1 << 62))
                self._pending.appendleft(_Group(g.trajs[:k], g.prompt, key=g.key))
            self._submit_group(self._pending.popleft(), e)
            self.ratio.on_admission()

    # -- event handling ----------------------------------------------------------------------------
    def _finish_seq(self, t: Trajectory, e: int, seq_id: int | None) -> None:
        if seq_id is not None:
            self.workers[e].cmds.put(("release", seq_id))
        self._n_done += 1
        g = self._group_of.get(t.uid)
        if g is None:
            return  # never admitted
        self._account(t, e, False)
        self._live_n[e] -= 1
        g.live -= 1
        if g.live == 0:
            self._shared[e] -= len(g.prompt) // self.engines[e].cfg.page_size
        if self.model is not None and t.done_reason != "error":
            self.model.add(len(t.response_tokens))

    def _on_event(self, e: int, ev: StopEvent) -> None:
        t = self._by_seq[(e, ev.seq_id)]
        t.on_generated(ev.tokens, ev.logprobs, ev.reason in ("max_new_tokens", "max_seq_len"),
                       self.tok, self.cfg.template)
        if t.status is Status.DONE:
            self._finish_seq(t, e, ev.seq_id)
            return
        self._account(t, e, True)
        if isinstance(t.pending_call, ToolCallError):
            self._on_tool(t, t.pending_call, 0.0)
        else:
            call: ToolCall = t.pending_call
            t0 = time.perf_counter()
            try:
                fut = self.pool.submit(CodeRequest(code=call.code, stdin=call.stdin, timeout_s=self.cfg.tool_timeout_s))
                fut.add_done_callback(lambda f, t=t, t0=t0: self._out.put(("tool", t, f, t0)))
            except Exception as ex:  # pool refused: a tool error, not a crash
                self._on_tool(t, CodeResult("sandbox_error", "", str(ex), None, 0.0, False), 0.0)

    def _on_tool(self, t: Trajectory, result: Any, latency: float) -> None:
        e, seq_id = self._seq_of[t.uid]
        if not isinstance(result, ToolCallError):
            self._tool_latency.append(latency)
        tokens = t.on_tool_result(result, latency, self.tok, self.cfg.template)
        if tokens is None:
            self._finish_seq(t, e, seq_id)
        else:
            self._account(t, e, True)
            self.workers[e].cmds.put(("resume", seq_id, tokens, t.remaining))

    def _handle(self, msg: tuple) -> None:
        kind = msg[0]
        if kind == "events":
            _, e, events, preemptions = msg
            self._clock[e] += 1
            if preemptions > self._preempt[e]:
                self.ratio.on_preemption(preemptions - self._preempt[e])
                self._preempt[e] = preemptions
            for ev in events:
                self._on_event(e, ev)
        elif kind == "admitted":
            _, e, g, seq_ids = msg
            for t, s in zip(g.trajs, seq_ids):
                self._by_seq[(e, s)] = t
                self._seq_of[t.uid] = (e, s)
        elif kind == "tool":
            _, t, fut, t0 = msg
            try:
                result = fut.result()
            except Exception as ex:
                result = CodeResult("sandbox_error", "", f"{type(ex).__name__}: {ex}", None, 0.0, False)
            self._on_tool(t, result, time.perf_counter() - t0)
        elif kind == "crashed":  # the engine's state is undefined now: fail the whole batch loudly
            _, e, exc = msg
            raise RuntimeError(f"engine {e} crashed: {type(exc).__name__}: {exc}") from exc
        elif kind == "engine_error":
            _, e, what, args, err = msg
            if what == "release":
                return  # the trajectory is already done; nothing to fail
            trajs = args[0].trajs if what == "group" else [self._by_seq.get((e, args[0]))]
            for t in trajs:
                if t is not None and t.status is not Status.DONE:
                    t.finish("error", err)
                    self._finish_seq(t, e, self._seq_of.get(t.uid, (e, None))[1] if what != "group" else None)

    # -- main entry ------------------------------------------------------------------------------
    def run(self, problems: Sequence[Any], seed: int = 0, show_progress: bool = False) -> RolloutResult:
        """Roll out ``n_samples`` trajectories per problem (objects with ``id``, ``problem``, ``answer``)."""
        from tqdm.auto import tqdm

        cfg = self.cfg
        trajs: list[Trajectory] = []
        self._pending: deque[_Group] = deque()
        # Per engine: forecast pages of its live trajectories (f64[B // Z + 1]), their groups' shared
        # prompt pages, live trajectory count, the live trajectories themselves.
        self._curve = [np.zeros(cfg.budget // e.cfg.page_size + 1) for e in self.engines]
        self._var = [np.zeros(cfg.budget // e.cfg.page_size + 1) for e in self.engines]
        self._shared = [0] * len(self.engines)
        self._live_n = [0] * len(self.engines)
        self._live_t: list[dict[int, Trajectory]] = [{} for _ in self.engines]
        self._clock = [0] * len(self.engines)  # engine steps seen
        self._mark: dict[int, int] = {}  # uid -> engine step when its current turn was handed over
        self._group_of: dict[int, _Group] = {}
        max_len = min(e.cfg.max_seq_len for e in self.engines)
        self._n_done = 0
        for gi, p in enumerate(problems):
            text = str(getattr(p, "problem", "") or "")
            prompt = self.tok.encode(render_prompt(text, cfg.template))
            group = _Group([], prompt, key=seed * 1_000_003 + gi)
            for j in range(cfg.n_samples):
                t = Trajectory(uid=len(trajs), group_id=gi, problem_id=str(getattr(p, "id", gi)),
                               gold=str(getattr(p, "answer", "")), prompt_tokens=prompt, budget=cfg.budget)
                trajs.append(t)
                group.trajs.append(t)
            if not text.strip():
                err = "empty problem"
            elif len(prompt) + cfg.budget > max_len:
                err = f"prompt ({len(prompt)} tokens) + budget ({cfg.budget}) exceeds max_seq_len ({max_len})"
            else:
                err = None
            if err:
                for t in group.trajs:
                    t.finish("error", err)
                    self._n_done += 1
            else:
                self._pending.append(group)
        if cfg.policy == "static":  # even contiguous split up front
            for i, g in enumerate(self._pending):
                g.engine = i * len(self.engines) // len(self._pending)
        self._out: queue.Queue = queue.Queue()
        self._by_seq: dict[tuple[int, int], Trajectory] = {}
        self._seq_of: dict[int, tuple[int, int]] = {}
        self._tool_latency: list[float] = []
        self._preempt = [e.stats()["preemptions"] for e in self.engines]
        preempt0 = list(self._preempt)
        t0 = time.perf_counter()
        self.workers = [_EngineThread(i, e, self._out, t0) for i, e in enumerate(self.engines)]
        for w in self.workers:
            w.start()
        bar = tqdm(total=len(trajs), desc="rollout", disable=not show_progress, leave=False)
        bar.update(self._n_done)
        try:
            while self._n_done < len(trajs):
                self._admit()
                before = self._n_done
                self._handle(self._out.get())
                bar.update(self._n_done - before)
        finally:
            for w in self.workers:
                w.cmds.put(("stop",))
            for w in self.workers:
                w.join()
            bar.close()
        makespan = time.perf_counter() - t0
        self._reward(trajs)
        metrics = self._metrics(trajs, makespan, preempt0)
        return RolloutResult(trajs, metrics, [w.timeline for w in self.workers])

    def _reward(self, trajs: list[Trajectory]) -> None:
        todo = [t for t in trajs if t.done_reason != "error"]
        t0 = time.perf_counter()
        for t, (r, info) in zip(todo, self.reward_fn([list(t.turns) for t in todo], [t.gold for t in todo])):
            t.reward, t.reward_info = float(r), info
        self._reward_s = time.perf_counter() - t0

    def _metrics(self, trajs: list[Trajectory], makespan: float, preempt0: list[int]) -> dict[str, Any]:
        sampled = sum(sum(t.loss_mask) for t in trajs)
        lat = np.asarray(self._tool_latency) if self._tool_latency else np.zeros(1)
        return {
            "makespan_s": makespan, "reward_s": self._reward_s, "output_tokens": sampled,
            "tokens_per_s": sampled / max(makespan, 1e-9),
            "preemptions": int(sum(self._preempt) - sum(preempt0)),
            "idle_fraction": [max(0.0, 1 - w.busy_s / max(makespan, 1e-9)) for w in self.workers],
            "kv_peak_pages": [max((u for _, u in w.timeline), default=0) for w in self.workers],
            "kv_total_pages": [e.num_pages - 1 for e in self.engines],
            "tool_calls": len(self._tool_latency), "tool_latency_p50_s": float(np.percentile(lat, 50)),
            "tool_latency_p99_s": float(np.percentile(lat, 99)), "tool_time_s": float(np.sum(self._tool_latency)),
            "turns_per_traj": float(np.mean([len(t.turns) for t in trajs])),
            "tool_calls_per_traj": float(np.mean([len(t.tools) for t in trajs])),
            "done_reasons": dict(Counter(t.done_reason for t in trajs)),
            "reserve_ratio": self.ratio.value,
            "length_model_n": self.model.n if self.model is not None else 0,
        }
