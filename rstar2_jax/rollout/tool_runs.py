"""The dispatcher's tool calls of one batch (docs/design.md §3.3): a turn's calls to the sandbox pool.

Every pending call of a trajectory's turn (``Trajectory.pending_calls``) becomes a ``CodeRequest``;
undecodable ones answer at once with their ``ToolCallError``. Calls run concurrently, at most
``RolloutConfig.max_parallel_calls`` of a turn at a time (1: one after another), except the cells of a
persistent session, which run one after another (a session runs one cell at a time). Results come
back as ``ToolDone`` events on the dispatcher's queue; when a turn's last result is in, ``start`` /
``done`` return every result in call order.

The jupyter tool (``TemplateConfig.tool == "jupyter"``) keeps state across a trajectory's calls:

* ``RolloutConfig.tool_session == "persistent"``: each trajectory has a session key unique over the
  pool's life (a uuid4 per batch + the trajectory's uid); its cells go to that session
  (``CodeRequest.session``) and ``end`` ends it (``SandboxBackend.end_session``) once, whatever ended the
  trajectory (``Dispatcher._finish`` and, for a batch that stops early or fails, ``end_all``).
* ``"replay"`` (the release's SimJupyterTool): each cell runs in a fresh process after every earlier
  decoded jupyter cell of the trajectory (``CodeRequest.history``; output discarded, errors ignored),
  earlier calls of the same turn included.
"""

from __future__ import annotations

import dataclasses
import queue
import time
import uuid
import warnings
from collections import deque
from typing import Any

from rstar2_jax.rollout.messages import ToolDone
from rstar2_jax.rollout.template import ToolCall, ToolCallError
from rstar2_jax.rollout.trajectory import Trajectory
from rstar2_jax.sandbox import CodeRequest, CodeResult

Results = tuple[list[Any], list[float]]  # a turn's results (CodeResult or ToolCallError) and latencies, call order


@dataclasses.dataclass(eq=False)
class _Turn:
    results: list[Any]
    latencies: list[float]
    waiting: deque[tuple[int, CodeRequest]]  # (call index, request) not submitted yet, in order
    left: int  # results not in yet
    in_flight: int = 0


class ToolRuns:
    """Routes one batch's tool calls (see module docstring). ``out``: the dispatcher's event queue."""

    def __init__(self, pool: Any, cfg: Any, out: queue.Queue):  # cfg: rollout.state.RolloutConfig
        self.pool, self.cfg, self.out = pool, cfg, out
        jupyter = cfg.template.tool == "jupyter"
        self.persistent = jupyter and cfg.tool_session == "persistent"
        self.replay = jupyter and cfg.tool_session == "replay"
        self.batch = uuid.uuid4().hex
        self.turns: dict[int, _Turn] = {}  # uid -> its turn's calls while it waits for them
        self.cells: dict[int, list[str]] = {}  # replay: uid -> its decoded jupyter cells so far
        self.opened: set[int] = set()  # persistent: uids whose session got a cell and is not ended yet
        self.sessions_ended = 0

    def session_key(self, uid: int) -> str:
        return f"{self.batch}-{uid}"

    def start(self, t: Trajectory) -> Results | None:
        """Submit ``t``'s pending calls; their results now if none has to wait for the pool, else None."""
        n = len(t.pending_calls)
        turn = _Turn([None] * n, [0.0] * n, deque(), n)
        for i, call in enumerate(t.pending_calls):
            if isinstance(call, ToolCallError):
                turn.results[i], turn.left = call, turn.left - 1
            else:
                turn.waiting.append((i, self._request(t.uid, call)))
        self.turns[t.uid] = turn
        self._pump(t.uid, turn)
        return self._complete(t.uid)

    def done(self, msg: ToolDone) -> Results | None:
        """One call's result is in; the turn's results when it was the last, else None (also for a
        trajectory that ended meanwhile)."""
        turn = self.turns.get(msg.uid)
        if turn is None:
            return None
        try:
            result = msg.future.result()
        except Exception as ex:  # noqa: BLE001 - a backend failure is a tool error, not a crash
            result = CodeResult.sandbox_error(f"{type(ex).__name__}: {ex}")
        turn.in_flight -= 1
        self._record(turn, msg.index, result, time.perf_counter() - msg.t0)
        self._pump(msg.uid, turn)
        return self._complete(msg.uid)

    def end(self, uid: int) -> None:
        """``uid`` ended (any reason): drop its calls; end its session (once) if it has one."""
        self.turns.pop(uid, None)
        self.cells.pop(uid, None)
        if uid not in self.opened:
            return
        self.opened.discard(uid)
        self.sessions_ended += 1
        try:
            self.pool.end_session(self.session_key(uid))
        except Exception as ex:  # noqa: BLE001 - a pool that cannot end it (closed) frees it itself
            warnings.warn(f"end_session({self.session_key(uid)!r}) failed: {type(ex).__name__}: {ex}",
                          RuntimeWarning, stacklevel=2)

    def end_all(self) -> None:
        """End every session still open (the batch is over, finished or not)."""
        for uid in sorted(self.opened):
            self.end(uid)
        self.turns.clear()
        self.cells.clear()

    # -- internals ------------------------------------------------------------------------------------
    def _request(self, uid: int, call: ToolCall) -> CodeRequest:
        timeout = self.cfg.tool_timeout_s
        if self.persistent:
            return CodeRequest(code=call.code, session=self.session_key(uid), timeout_s=timeout)
        if self.replay:
            cells = self.cells.setdefault(uid, [])
            req = CodeRequest(code=call.code, history=tuple(cells), timeout_s=timeout)
            cells.append(call.code)
            return req
        return CodeRequest(code=call.code, stdin=call.stdin, timeout_s=timeout)

    def _pump(self, uid: int, turn: _Turn) -> None:
        limit = 1 if self.persistent else self.cfg.max_parallel_calls
        while turn.waiting and turn.in_flight < limit:
            i, req = turn.waiting.popleft()
            if self.persistent:
                self.opened.add(uid)
            t0 = time.perf_counter()
            try:
                fut = self.pool.submit(req)
            except Exception as ex:  # noqa: BLE001 - pool refused: a tool error, not a crash
                self._record(turn, i, CodeResult.sandbox_error(str(ex)), 0.0)
                continue
            turn.in_flight += 1
            fut.add_done_callback(lambda f, uid=uid, t0=t0, i=i: self.out.put(ToolDone(uid, f, t0, i)))

    @staticmethod
    def _record(turn: _Turn, i: int, result: Any, latency: float) -> None:
        turn.results[i], turn.latencies[i] = result, latency
        turn.left -= 1

    def _complete(self, uid: int) -> Results | None:
        turn = self.turns[uid]
        if turn.left:
            return None
        del self.turns[uid]
        return turn.results, turn.latencies
