"""A scripted policy over a real engine: the engine computes, the script decides the tokens.

``ScriptedPolicy(engine, script)`` implements the ``Engine`` protocol around a ``PagedEngine``.
Each turn the real engine decodes exactly as many tokens as ``script(prompt, child, turn)`` returns
(KV pages, slots, prefill/extend chunks, tool pauses and preemption all real); the stop event then
carries the script's ids, with reason ``stop_token`` (a turn cut by the budget: its first ids, with
the engine's reason; ``cut`` may be overridden). The script's tokens were not drawn by the engine,
so their sampler log-probs are unknown: the events carry NaN, the mismatch metric leaves those tokens
out (``train/mismatch/coverage`` = 0), and the learner refuses ``old_logp_source="sampler"`` and
rollout correction on them (train with ``"recompute"``, correction off).

A trajectory that a dispatcher migrated arrives either with its K/V (``import_seq``: the export
carries the script position) or as a one-sample group whose prompt is its whole context so far;
then ``locate(prompt) -> (original prompt, child, turn) | None`` (optional) names the script's
trajectory and turn it continues (None: a fresh prompt).

Use: a dry-run whose random policy would never earn a reward (so RoC would drop every group and
no update would run) gets rollouts with a known mix of right and wrong answers, and the whole
rollout -> score -> RoC -> update path runs for real.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

from rstar2_jax.sampling.engine import PagedEngine
from rstar2_jax.sampling.interface import EngineStats, Placed, Request, StopEvent

def _unknown(n: int) -> list[float]:
    """Sampler log-probs of ``n`` scripted tokens: NaN, the engine did not draw them."""
    return [math.nan] * n


Script = Callable[[tuple[int, ...], int, int], Sequence[int]]  # (prompt ids, child index, turn) -> ids
Locate = Callable[[tuple[int, ...]], "tuple[tuple[int, ...], int, int] | None"]


class ScriptedPolicy:
    """See the module docstring."""

    def __init__(self, engine: PagedEngine, script: Script, locate: Locate | None = None):
        self.engine, self.script, self.locate = engine, script, locate
        self._state: dict[int, list] = {}  # seq_id -> [prompt, child, turn, this turn's ids]

    @property
    def page_size(self) -> int:
        return self.engine.page_size

    @property
    def usable_pages(self) -> int:
        return self.engine.usable_pages

    @property
    def max_seq_len(self) -> int:
        return self.engine.max_seq_len

    @property
    def params(self) -> Any:
        return self.engine.params

    @property
    def layout(self) -> Any:
        """The wrapped engine's ``placement.EngineLayout`` (None: not tensor-parallel placed)."""
        return self.engine.layout if isinstance(self.engine, Placed) else None

    def _turn(self, prompt: tuple[int, ...], child: int, turn: int) -> list[int]:
        ids = [int(t) for t in self.script(prompt, child, turn)]
        if not ids:
            raise ValueError(f"ScriptedPolicy: empty turn {turn} for child {child}")
        return ids

    def submit(self, request: Request) -> int:
        return self.submit_group(request, 1)[0]

    def submit_group(self, request: Request, n: int) -> list[int]:
        prompt = tuple(int(t) for t in request.prompt)
        found = self.locate(prompt) if self.locate is not None and n == 1 else None
        if found is not None:  # a migrated trajectory: continue its script
            orig, child, turn = found
            ids = self._turn(orig, child, turn)
            req = dataclasses.replace(request, stop_token_ids=(), stop_strings=(),
                                      max_new_tokens=min(len(ids), request.max_new_tokens))
            (sid,) = self.engine.submit_group(req, 1)
            self._state[sid] = [orig, child, turn, ids]
            return [sid]
        turns = [self._turn(prompt, i, 0) for i in range(n)]
        lens = [min(len(t), request.max_new_tokens) for t in turns]
        req = dataclasses.replace(request, stop_token_ids=(), stop_strings=(), max_new_tokens=max(lens))
        ids = self.engine.submit_group(req, n, child_max_new_tokens=lens)
        for i, s in enumerate(ids):
            self._state[s] = [prompt, i, 0, turns[i]]
        return ids

    def resume(self, seq_id: int, appended_tokens: Sequence[int] = (), *, max_new_tokens: int) -> None:
        st = self._state[seq_id]
        st[2] += 1
        st[3] = self._turn(st[0], st[1], st[2])
        self.engine.resume(seq_id, appended_tokens, max_new_tokens=min(len(st[3]), max_new_tokens))

    def release(self, seq_id: int) -> None:
        self._state.pop(seq_id, None)
        self.engine.release(seq_id)

    def export_seq(self, seq_id: int) -> Any:
        """The engine's ``SeqExport`` with the script position in ``meta``."""
        return dataclasses.replace(self.engine.export_seq(seq_id), meta=tuple(self._state[seq_id][:3]))

    def import_seq(self, export: Any, appended_tokens: Sequence[int] = (), *, max_new_tokens: int) -> int:
        """Continue an exported sequence's script at its next turn (as ``resume``)."""
        prompt, child, turn = export.meta
        ids = self._turn(prompt, child, turn + 1)
        sid = self.engine.import_seq(export, appended_tokens, max_new_tokens=min(len(ids), max_new_tokens))
        self._state[sid] = [prompt, child, turn + 1, ids]
        return sid

    def step(self) -> list[StopEvent]:
        out = []
        for ev in self.engine.step():
            ids = self._state[ev.seq_id][3]
            if len(ev.tokens) == len(ids):
                out.append(StopEvent(ev.seq_id, list(ids), _unknown(len(ids)), "stop_token", ids[-1]))
            else:  # the budget cut the turn
                out.append(self.cut(ids, ev))
        return out

    def cut(self, ids: list[int], ev: StopEvent) -> StopEvent:
        """The event of a scripted turn ``ids`` that the engine stopped early (``ev``)."""
        return StopEvent(ev.seq_id, list(ids[: len(ev.tokens)]), _unknown(len(ev.tokens)), ev.reason)

    def has_work(self) -> bool:
        return self.engine.has_work()

    def stats(self) -> EngineStats:
        return self.engine.stats()

    def set_params(self, params: Any) -> None:
        self.engine.set_params(params)

    def swap_params(self, params: Any) -> None:
        """In-flight weight update (``PagedEngine.swap_params``)."""
        self.engine.swap_params(params)

    def tokens(self, seq_id: int) -> list[int]:
        """The engine's tokens of ``seq_id`` (as many as the script's, not the same ids)."""
        return self.engine.tokens(seq_id)
