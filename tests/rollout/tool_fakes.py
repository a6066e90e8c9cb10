"""An in-test sandbox backend with sessions (the ``SandboxBackend`` protocol, no processes) and the
scripted-dispatcher helpers the tool tests share.

``SessionPool`` runs each cell with ``exec`` in a dict namespace: one per session key (``CodeRequest.session``),
a fresh one per replayed call (``history`` first, its output and errors dropped) or per plain call. Its futures
complete on a thread of its own once ``gate`` requests are pending (or ``gate_timeout_s`` passed): with
``gate=2`` two calls must be in flight together for a run to go on without waiting. It logs every submit and
completion (``log``) and the most requests in flight at once (``max_in_flight``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import io
import threading

from rstar2_jax.sandbox import CodeResult, SandboxLimits


class SessionPool:
    submit_blocks = False

    def __init__(self, *, gate: int = 1, gate_timeout_s: float = 10.0, reverse: bool = False):
        self.limits = SandboxLimits()
        self.gate, self.gate_timeout_s, self.reverse = gate, gate_timeout_s, reverse  # reverse: last submitted first
        self.requests: list = []
        self.log: list[tuple[str, str]] = []  # ("submit" | "done", code)
        self.ended: list[str] = []  # end_session keys, in order
        self.namespaces: dict[str, dict] = {}
        self.dead: set[str] = set()  # keys whose session ended: their next cell restarts
        self.in_flight = self.max_in_flight = 0
        self.key_in_flight: dict[str, int] = {}  # session key -> its cells in flight
        self.max_key_in_flight = 0
        self._pending: list = []
        self._cv = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._complete_loop, daemon=True)
        self._thread.start()

    # -- SandboxBackend ------------------------------------------------------------------------------
    def submit(self, req):
        f = concurrent.futures.Future()
        with self._cv:
            self.requests.append(req)
            self.log.append(("submit", req.code))
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            if req.session is not None:
                self.key_in_flight[req.session] = self.key_in_flight.get(req.session, 0) + 1
                self.max_key_in_flight = max(self.max_key_in_flight, self.key_in_flight[req.session])
            self._pending.append((req, f))
            self._cv.notify_all()
        return f

    def end_session(self, key: str) -> None:
        with self._cv:
            self.ended.append(key)
            self.namespaces.pop(key, None)
            self.dead.add(key)

    def stats(self) -> dict:
        return {"calls": len(self.requests)}

    @property
    def isolation(self):
        return None

    def close(self, *, cancel_pending: bool = False) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    # -- internals ------------------------------------------------------------------------------------
    def _complete_loop(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._closed or len(self._pending) >= self.gate, self.gate_timeout_s)
                if self._closed:
                    return
                batch, self._pending = self._pending, []
            for req, f in reversed(batch) if self.reverse else batch:
                result = self._run(req)
                with self._cv:
                    self.in_flight -= 1
                    if req.session is not None:
                        self.key_in_flight[req.session] -= 1
                    self.log.append(("done", req.code))
                f.set_result(result)

    def _run(self, req) -> CodeResult:
        state = ""
        if req.session is not None:
            with self._cv:
                if req.session in self.namespaces:
                    state = "kept"
                else:
                    state = "restarted" if req.session in self.dead else "new"
                    self.namespaces[req.session] = {}
                ns = self.namespaces[req.session]
        else:
            ns = {}
            for cell in req.history:  # replay: output discarded, errors ignored
                with contextlib.suppress(Exception), contextlib.redirect_stdout(io.StringIO()):
                    exec(cell, ns)  # noqa: S102 - test code only
        if "BREAK" in req.code:  # a cell that breaks a limit ends its session
            if req.session is not None:
                with self._cv:
                    self.namespaces.pop(req.session, None)
                    self.dead.add(req.session)
            return CodeResult("timeout", "", "", None, 0.01, False, session=state, session_ended=req.session is not None)
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                exec(req.code, ns)  # noqa: S102 - test code only
        except Exception as e:  # noqa: BLE001
            return CodeResult("runtime_error", out.getvalue(), f"{type(e).__name__}: {e}", 1, 0.01, False, session=state)
        return CodeResult("ok", out.getvalue(), "", 0, 0.01, False, session=state)
