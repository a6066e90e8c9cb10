"""A scripted fake engine with PagedEngine's API: emits predetermined turns (no JAX)."""

from __future__ import annotations

import dataclasses
import threading
import time
import types
from typing import Callable

from rstar2_jax.sampling import EngineStats, StopEvent


@dataclasses.dataclass
class _Cfg:
    page_size: int = 16
    max_seq_len: int = 4096
    num_slots: int = 0  # 0: unlimited (what the dispatcher's ledger reads)
    prefill_chunk: int = 0  # 0: unknown (one step per prefill)


class StepClock:
    """A ``perf_counter`` per thread that each scripted step advances by its nominal seconds (``step_s``,
    or 1 ms for a fast engine), installed in ``rollout.worker`` (which times each ``engine.step()``): the
    step speeds the dispatcher measures are then the nominal ones on any machine, loaded or not (each
    worker runs its engine in a thread of its own)."""

    FAST_S = 0.001

    def __init__(self):
        self.local = threading.local()

    def perf_counter(self) -> float:
        return getattr(self.local, "t", 0.0)

    def advance(self, dt: float) -> None:
        self.local.t = self.perf_counter() + dt

    def install(self, monkeypatch) -> "StepClock":
        import rstar2_jax.rollout.worker as worker

        monkeypatch.setattr(worker, "time", types.SimpleNamespace(perf_counter=self.perf_counter))
        return self


class ScriptedEngine:
    """``script(problem_tokens, child_index, turn_index) -> turn text``; one whole turn per step
    (each step sleeps ``step_s``: a slower engine). A migrated trajectory arrives as a fresh
    one-sample group whose prompt is its whole context (child 0, turn 0).

    With ``honor_stops`` the turn is cut after the first stop token (as a real engine does);
    without it the whole scripted turn is emitted (e.g. two tool calls in one turn).
    """

    def __init__(self, tokenizer, script: Callable[[list[int], int, int], str], *, honor_stops: bool = True,
                 num_pages: int = 1024, page_size: int = 16, max_seq_len: int = 4096, num_slots: int = 0,
                 step_s: float = 0.0, logprob: float = -0.5, clock: StepClock | None = None):
        self.tok, self.script, self.honor_stops, self.step_s = tokenizer, script, honor_stops, step_s
        self.clock = clock  # advanced by each step's nominal seconds (StepClock)
        self.logprob = logprob  # every emitted token's sampler log-prob (NaN: not drawn, as ScriptedPolicy's)
        self.cfg = _Cfg(page_size, max_seq_len, num_slots)
        self.num_pages = num_pages
        self._seqs: dict[int, dict] = {}
        self._active: list[int] = []
        self._next = 0
        self.released: list[int] = []

    @property
    def page_size(self) -> int:
        return self.cfg.page_size

    @property
    def usable_pages(self) -> int:
        return self.num_pages - 1

    @property
    def max_seq_len(self) -> int:
        return self.cfg.max_seq_len

    def submit(self, request) -> int:
        return self.submit_group(request, 1)[0]

    def submit_group(self, request, n: int) -> list[int]:
        ids = []
        for i in range(n):
            sid = self._next
            self._next += 1
            self._seqs[sid] = dict(prompt=list(request.prompt), child=i, turn=0, tokens=list(request.prompt),
                                   max_new=request.max_new_tokens, stops=set(request.stop_token_ids))
            self._active.append(sid)
            ids.append(sid)
        return ids

    def resume(self, seq_id: int, appended_tokens=(), *, max_new_tokens: int) -> None:
        s = self._seqs[seq_id]
        s["tokens"].extend(appended_tokens)
        s["turn"] += 1
        s["max_new"] = max_new_tokens
        self._active.append(seq_id)

    def set_params(self, params) -> None:  # weights do not change what a script says
        self.params = params

    swap_params = set_params  # in-flight updates: live sequences go on

    def tokens(self, seq_id: int) -> list[int]:
        return list(self._seqs[seq_id]["tokens"])

    def release(self, seq_id: int) -> None:
        self._seqs.pop(seq_id)
        self.released.append(seq_id)

    def has_work(self) -> bool:
        return bool(self._active)

    def step(self) -> list[StopEvent]:
        if self.step_s:
            time.sleep(self.step_s)  # a slower device (really: the fast engine runs out of work first)
        if self.clock is not None:
            self.clock.advance(self.step_s or StepClock.FAST_S)
        events = []
        for sid in self._active:
            s = self._seqs[sid]
            ids = self.tok.encode(self.script(s["prompt"], s["child"], s["turn"]))
            reason = "stop_token"
            if self.honor_stops:
                for i, t in enumerate(ids):
                    if t in s["stops"]:
                        ids = ids[: i + 1]
                        break
            if len(ids) > s["max_new"]:
                ids, reason = ids[: s["max_new"]], "max_new_tokens"
            s["tokens"].extend(ids)
            events.append(StopEvent(sid, ids, [self.logprob] * len(ids), reason))
        self._active = []
        return events

    def stats(self) -> EngineStats:
        used = sum(-(-len(s["tokens"]) // self.cfg.page_size) for s in self._seqs.values())
        return EngineStats(kv_pages_in_use=used, kv_pages_total=self.usable_pages)


# -- the scripted workload both the dispatcher and the simulator run (ledger agreement tests) ------
ANSWER = "x" * 40 + "</reason><answer>\\boxed{1}</answer><|im_end|>"  # every sample's one turn


@dataclasses.dataclass(frozen=True)
class Problem:
    id: str
    problem: str
    answer: str = "1"


def scripted_problems(n: int = 6) -> list[Problem]:
    """``n`` problems ``p0..`` with prompts growing by 7 characters."""
    return [Problem(f"p{i}", "q" * (10 + 7 * i)) for i in range(n)]


def record_ledgers(monkeypatch) -> tuple[list, list[int]]:
    """Patch ``AdmissionLedger`` so that every ledger built is appended to the first list, and the
    number of admissions each had made when its first trajectory finished to the second."""
    from rstar2_jax.admission.book import AdmissionLedger

    ledgers, first_finish = [], []
    orig_init, orig_finish = AdmissionLedger.__init__, AdmissionLedger.on_finish

    def init(self, *a, **kw):
        orig_init(self, *a, **kw)
        ledgers.append(self)

    def on_finish(self, *a, **kw):
        if len(first_finish) < len(ledgers):
            first_finish.append(len(self.admissions))
        orig_finish(self, *a, **kw)

    monkeypatch.setattr(AdmissionLedger, "__init__", init)
    monkeypatch.setattr(AdmissionLedger, "on_finish", on_finish)
    return ledgers, first_finish


class InstantPool:
    """Answers every sandbox call at once with ``1`` (the part of ``SandboxBackend`` the dispatcher uses)."""

    def __init__(self):
        self.calls = 0

    def submit(self, req):
        import concurrent.futures

        from rstar2_jax.sandbox import CodeResult

        self.calls += 1
        f = concurrent.futures.Future()
        f.set_result(CodeResult("ok", "1\n", "", 0, 0.01, False))
        return f
