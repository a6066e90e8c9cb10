"""The engine's multi-step device call and how its tokens are booked (a ``PagedEngine`` mixin).

``_run_mixed``: one ``mixed_loop`` call (decode rows plus planned prefill/extend chunks); it books
each row's tokens in order through the engine's ``_on_sample`` (``stop_reason``). A stop
the device did not see (a stop string, or a stop id past ``STOP_WIDTH``) cuts the row there: the
tokens it sampled after it are dropped (``discarded_tokens``, at most K - 1 per row), its
``cached`` becomes ``len(tokens) - 1`` (K/V written past that is never read: attention stops at a
row's position and a later feed overwrites it) and its reserved pages are trimmed. Tokens equal
single steps' because a token's key depends only on (sequence key, index).
"""

from __future__ import annotations

import numpy as np

from rstar2_jax.sampling import mixed_loop as mixed_mod
from rstar2_jax.sampling.interface import StopEvent
from rstar2_jax.sampling.sequence import GroupTemplate, Seq, SeqState


class LoopRunner:
    """Mixin of ``PagedEngine`` (uses its scheduler, cache, params, stats and ``_on_sample``)."""

    def _mixed(self, plan: mixed_mod.MixedPlan, rd: int | None = None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, dict[int, int]]:
        """One ``mixed_loop`` call (cache donated) on the smallest row bucket that holds the window's
        slots (or ``rd`` rows); host tokens/log-probs [K,R], counts [R], iterations, slot -> row."""
        sa, sched = self._slot_arrays, self.scheduler
        sa.sync(sched.slots)
        rows = mixed_mod.plan_rows(plan)
        rd = rd if rd is not None else next(r for r in self._row_buckets if r >= len(rows))
        spec = self._mixed_specs[rd]
        batch = mixed_mod.build_mixed_batch(plan, sa, sched.block_tables, spec, bool(sched.waiting), rows)
        self.cache, tokens, logprobs, counts, n = mixed_mod.mixed_loop(self.graphdef, self.params, self.cache, batch,
                                                                       spec)
        return (np.asarray(tokens), np.asarray(logprobs), np.asarray(counts), int(n),
                {slot: r for r, slot in enumerate(rows)})

    def _run_mixed(self, plan: mixed_mod.MixedPlan) -> list[StopEvent]:
        """Run a planned mixed window; book the chunks it fed, then each row's tokens; fork the
        templates it prefilled. Events come in the order single steps would give them."""
        tokens, logprobs, counts, n_run, row_of = self._mixed(plan)
        self._stats["steps"] += n_run
        self._stats["mixed_loop_calls"] += 1
        done = []
        for row in plan.chunks[:n_run]:
            for s, n in row:
                s.cached += n
                self._stats["prefill_tokens"] += n
                if isinstance(s, GroupTemplate) and s.uncached == 0:
                    done.append(s)
        keyed = []
        for s, (it, kind) in plan.first.items():
            if plan.limits[s] == 0:
                continue
            b = row_of[s.slot]
            n = int(counts[b])
            if n:
                ev, m = self._book(s, tokens[it:it + n, b], logprobs[it:it + n, b])
                s.cached = len(s.tokens) - 1
                self._stats["decode_tokens"] += m - (kind == "chunk")
                by_chunk = kind == "chunk" and m == 1
                keyed += [((it + m - 1, by_chunk, s.order if by_chunk else len(s.tokens) - 1, s.slot), e) for e in ev]
            self.scheduler.trim(s)
        for t in done:  # after every row is booked: a fork may preempt any of them
            if t.state is SeqState.ACTIVE:  # else an earlier fork preempted it: it prefills again
                self._copy_pages(self.scheduler.fork(t))
        return [e for _, e in sorted(keyed, key=lambda x: x[0])]

    def _book(self, s: Seq, tokens: np.ndarray, logprobs: np.ndarray) -> tuple[list[StopEvent], int]:
        """Book ``tokens`` of ``s`` in order up to its first stop; returns its events and the
        tokens kept (the rest are discarded)."""
        for j in range(len(tokens)):
            ev = self._on_sample(s, int(tokens[j]), float(logprobs[j]))
            if ev:
                self._stats["discarded_tokens"] += len(tokens) - j - 1
                return ev, j + 1
        return [], len(tokens)
