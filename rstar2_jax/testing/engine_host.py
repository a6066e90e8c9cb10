"""The host of one rollout-benchmark engine in its own process (``deploy.engine_proc.ProcessEngine``):
a tiny random policy whose turns follow a ``sim.workload`` script (``ScriptedTurnsEngine``), plus
calibration and throughput probes on its own core."""

from __future__ import annotations

import time

import numpy as np

from rstar2_jax.sampling import EngineConfig, EngineStats, PagedEngine, Request, StopEvent
from rstar2_jax.testing.scripted import ScriptedPolicy
from rstar2_jax.sim.workload import TOK, filler

class ScriptedTurnsEngine(ScriptedPolicy):
    """A PagedEngine whose turn lengths and recorded tokens follow a script (see module docstring).

    ``scripts[prompt ids][child][turn] = (ids, tool seconds, program)``. Each turn decodes exactly
    ``len(ids)`` real tokens (fewer if the budget cuts it) with no stop tokens; the stop event then
    carries the scripted ids (same count: KV accounting stays exact) and reason ``stop_token``, or
    filler with the engine's reason if the turn was cut (``testing.scripted.ScriptedPolicy``).
    A migrated trajectory (its whole context resubmitted) is located in the script by walking its
    scripted turns, each followed by a tool response ending in ``RESPONSE_END``.
    """

    def __init__(self, engine: PagedEngine, scripts: dict[tuple[int, ...], list[list[tuple]]]):
        super().__init__(engine, lambda prompt, child, turn: scripts[prompt][child][turn][0], self._locate)
        self.scripts = scripts
        self._prompt_lens = sorted({len(p) for p in scripts})

    def _locate(self, context: tuple[int, ...]) -> tuple[tuple[int, ...], int, int] | None:
        """(original prompt, child, next turn) of a resubmitted context, or None (a fresh prompt)."""
        if context in self.scripts:
            return None
        end = list(RESPONSE_END)
        for n in self._prompt_lens:
            prompt = context[:n]
            for child, turns in enumerate(self.scripts.get(prompt, ())):
                pos = n
                for turn, (ids, *_) in enumerate(turns):
                    if list(context[pos:pos + len(ids)]) != list(ids):
                        break
                    pos += len(ids)
                    j = _find(context, end, pos)
                    if j < 0:
                        break
                    pos = j + len(end)
                    if pos == len(context):
                        return prompt, child, turn + 1
        raise KeyError(f"ScriptedTurnsEngine: a resubmitted context of {len(context)} tokens matches no script")

    @property
    def cfg(self):
        return self.engine.cfg

    @property
    def num_pages(self) -> int:
        return self.engine.num_pages

    def cut(self, ids: list[int], ev: StopEvent) -> StopEvent:
        return StopEvent(ev.seq_id, filler(len(ev.tokens)), ev.logprobs, ev.reason)


RESPONSE_END = tuple(TOK.encode("</tool_response><|im_end|>\n<|im_start|>assistant\n<reason>"))


def _find(seq: tuple[int, ...], sub: list[int], start: int) -> int:
    for i in range(start, len(seq) - len(sub) + 1):
        if list(seq[i:i + len(sub)]) == sub:
            return i
    return -1


# -- one engine per process ------------------------------------------------------------------------
class EngineHost:
    """Lives in an engine's process: the tiny random policy, a fresh scripted engine per run
    (``reset``; compiled steps are reused), calibration and a throughput probe on its own core."""

    def __init__(self, model_kw: dict, ecfg: EngineConfig):
        from flax import nnx

        from rstar2_jax.model import Qwen3, split_policy
        from rstar2_jax.model.config import ModelConfig

        self.mcfg = ModelConfig.tiny(**model_kw)
        self.graphdef, self.params = split_policy(Qwen3(self.mcfg, rngs=nnx.Rngs(0)))
        self.cfg, self.num_pages = ecfg, ecfg.num_pages
        self.page_size, self.usable_pages, self.max_seq_len = ecfg.page_size, ecfg.num_pages - 1, ecfg.max_seq_len
        self.engine: ScriptedTurnsEngine | None = None
        self.slowdown = 1.0  # step wall time x this (a slower device: the extra time is slept)
        self._new().warmup()  # compile every step variant once (not timed)

    def set_slowdown(self, factor: float) -> None:
        """Emulate a device ``factor`` times slower: after each real step, sleep ``factor - 1`` times
        its duration (the core is left idle, as a slower accelerator leaves its host)."""
        if factor < 1:
            raise ValueError(f"EngineHost.set_slowdown: factor must be >= 1, got {factor}")
        self.slowdown = float(factor)

    def _new(self) -> PagedEngine:
        return PagedEngine(self.graphdef, self.params, self.mcfg, self.cfg, decode_fn=TOK.decode)

    def reset(self, scripts: dict) -> None:
        """A fresh engine (empty page table, zero stats) following ``scripts`` (prompt ids -> samples)."""
        self.engine = ScriptedTurnsEngine(self._new(), scripts)

    def submit(self, request: Request) -> int:
        return self.engine.submit(request)

    def submit_group(self, request: Request, n: int) -> list[int]:
        return self.engine.submit_group(request, n)

    def resume(self, seq_id: int, appended_tokens=(), *, max_new_tokens: int) -> None:
        self.engine.resume(seq_id, appended_tokens, max_new_tokens=max_new_tokens)

    def release(self, seq_id: int) -> None:
        self.engine.release(seq_id)

    def export_seq(self, seq_id: int):
        return self.engine.export_seq(seq_id)

    def import_seq(self, export, appended_tokens=(), *, max_new_tokens: int) -> int:
        return self.engine.import_seq(export, appended_tokens, max_new_tokens=max_new_tokens)

    def step(self) -> list[StopEvent]:
        t = time.perf_counter()
        out = self.engine.step()
        if self.slowdown > 1:
            time.sleep((time.perf_counter() - t) * (self.slowdown - 1))
        return out

    def has_work(self) -> bool:
        return self.engine is not None and self.engine.has_work()

    def stats(self) -> EngineStats:
        return self.engine.stats() if self.engine is not None else EngineStats()

    def set_params(self, params) -> None:
        """New weights for this run's engine (idle) and the ones ``reset`` builds."""
        if self.engine is not None:
            self.engine.set_params(params)
        self.params = params

    def check(self) -> None:
        """Every sequence released and the page table consistent."""
        pt = self.engine.engine.page_table
        assert pt.used_pages() == 0, f"{pt.used_pages()} pages leaked"
        pt.check_invariants()

    def calibrate(self, prompt_len: int, n_steps: int = 30) -> tuple[float, float, float]:
        """Step seconds ``a + b * rows`` (decode only, mid-length rows) and ``c``, what feeding one
        prefill chunk adds to a step, fitted on this engine alone on its core."""
        rows, secs, extra = [], [], []
        for r in sorted({1, self.cfg.num_slots // 4, self.cfg.num_slots // 2, self.cfg.num_slots}):
            eng = self._decoding(r, prompt_len + 149, n_steps + 60, settle=10)
            rows.append(r)
            secs.append(_seconds_per_step(eng, n_steps))
            chunks = 8  # a long request keeps the prefill lane busy for this many steps
            eng.submit(Request(prompt=[i % 200 + 1 for i in range(chunks * self.cfg.prefill_chunk + 1)], key=-1,
                               max_new_tokens=1))
            eng.step()  # admission
            extra.append(_seconds_per_step(eng, chunks - 1) - secs[-1])
        b, a = np.polyfit(rows, secs, 1)
        return max(float(a), 0.0), max(float(b), 1e-6), max(float(np.median(extra)), 0.0)

    def ctx_cost(self, rows: int, short: int, long: int, n_steps: int = 30) -> float:
        """Seconds a step adds per 1000 context tokens of its rows: ``rows`` decoding rows at a
        ``short`` and at a ``long`` context, on this engine alone."""
        t = [_seconds_per_step(self._decoding(rows, n, n_steps + 20, settle=10), n_steps) for n in (short, long)]
        return max((t[1] - t[0]) / (rows * (long - short) / 1e3), 0.0)

    def probe_step_s(self, n_steps: int = 20) -> float:
        """Seconds per model step of this engine as it runs now (its slowdown included), half its
        slots decoding (a ``step()`` call may run a decode loop of several): the speed a long-lived
        dispatcher knows from earlier batches."""
        eng = self._decoding(self.cfg.num_slots // 2, 199, n_steps * self.cfg.decode_steps + 20, settle=5)
        steps0, t0 = eng.stats().steps, time.perf_counter()
        for _ in range(n_steps):
            t = time.perf_counter()
            eng.step()
            if self.slowdown > 1:
                time.sleep((time.perf_counter() - t) * (self.slowdown - 1))
        return (time.perf_counter() - t0) / max(eng.stats().steps - steps0, 1)

    def steps_per_s(self, n_steps: int) -> float:
        """Steps per second of an engine decoding half its slots (the concurrency probe)."""
        return 1.0 / _seconds_per_step(self._decoding(self.cfg.num_slots // 2, 199, n_steps + 20, settle=5), n_steps)

    def _decoding(self, rows: int, prompt_len: int, max_new: int, settle: int) -> PagedEngine:
        """A fresh engine with ``rows`` requests, stepped ``settle`` times (prompts prefilled)."""
        eng = self._new()
        for i in range(rows):
            eng.submit(Request(prompt=[j % 200 + 1 for j in range(prompt_len)], key=i, max_new_tokens=max_new))
        for _ in range(settle):
            eng.step()
        return eng


def _seconds_per_step(eng: PagedEngine, n_steps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n_steps):
        eng.step()
    return (time.perf_counter() - t0) / n_steps


