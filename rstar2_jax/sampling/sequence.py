"""Host-side records of the engine's sequences: the state machine, a sequence, a group template.

Plain Python/NumPy, no JAX. A ``Seq`` is a token list ``tokens`` of which the first ``cached`` have
K/V in the paged cache (its pages are in the ``PageTable`` under ``Seq.id``). A ``GroupTemplate``
is the prefill-only sequence of ``submit_group``: it feeds ``prompt[:-1]`` once, then its pages are
forked into its children (see ``Scheduler.fork``) and it is released.

States (``SeqState``) and the only legal moves (``TRANSITIONS``)::

    FORKING --fork--> WAITING --admit--> ACTIVE --stop--> PAUSED --resume--> WAITING
                         ^                 |
                         +----preempt------+        (any state) --release / forked--> RELEASED

Every state change goes through ``Seq.to``, which asserts the move is in the table. Preempting a
sequence that is not in a slot (``WAITING``/``PAUSED``) frees its pages without a state change.
"""

from __future__ import annotations

import enum
from typing import Callable, Sequence

import numpy as np

from rstar2_jax.sampling.sampling_fns import RowParams


class SeqState(enum.Enum):
    """Where a sequence is in the engine (see ``TRANSITIONS``)."""

    FORKING = "forking"  # a group child before its template's prefill ends: no pages, not queued
    WAITING = "waiting"  # queued for a slot, oldest first (may hold pages: resumed or a fork child)
    ACTIVE = "active"  # in a slot: fed by prefill/extend chunks or decoding one token per step
    PAUSED = "paused"  # stopped (a StopEvent went out), out of its slot, keeps its pages
    RELEASED = "released"  # forgotten: released by the caller, or a template after its fork


S = SeqState
# state -> the states it may move to, with the event that moves it.
TRANSITIONS: dict[SeqState, frozenset[SeqState]] = {
    S.FORKING: frozenset({S.WAITING,  # its template was prefilled and forked
                          S.RELEASED}),  # released before the fork
    S.WAITING: frozenset({S.ACTIVE,  # admitted: its pages fit and a slot is free
                          S.RELEASED}),  # released (aborted) while queued
    S.ACTIVE: frozenset({S.PAUSED,  # sampled a stop (token, string, max_new_tokens, max_seq_len)
                         S.WAITING,  # preempted: pages freed, re-queued to recompute its K/V
                         S.RELEASED}),  # released mid-run, or a template whose prefill was forked
    S.PAUSED: frozenset({S.WAITING,  # resumed with appended tokens
                         S.RELEASED}),  # released by the caller
    S.RELEASED: frozenset(),
}
del S


class Seq:
    """One sequence: its tokens, sampling parameters, stop rules and place in the engine.

    ``order`` is ``(submission counter, child index)``: larger is newer (FIFO admission, and
    preemption's tie-break). ``preempted``: how often its K/V was freed (a preempted sequence
    returns to a slot only with headroom, ``Scheduler.admit``; ``swapped``: its K/V kept on the host
    meanwhile, if the engine swaps). ``key_data`` is the raw PRNG key (u32[2] for
    threefry); the token at index ``i`` is sampled with ``fold_in(key, i)``.
    """

    __slots__ = ("id", "order", "tokens", "cached", "key_data", "params", "stop_ids", "stop_strings",
                 "max_new", "seg_start", "seg_logprobs", "state", "slot", "template", "preempted", "swapped")

    def __init__(self, seq_id: int, order: tuple[int, int], tokens: Sequence[int], key_data: np.ndarray,
                 params: RowParams, *, stop_ids: Sequence[int] = (), stop_strings: Sequence[str] = (),
                 max_new: int = 0, state: SeqState = SeqState.WAITING):
        self.id = seq_id
        self.order = order
        self.tokens = [int(t) for t in tokens]
        self.cached = 0  # tokens[:cached] have K/V in the cache
        self.key_data = key_data
        self.params = params  # (temperature, top_k, top_p, greedy) of its sampler
        self.stop_ids = frozenset(int(t) for t in stop_ids)
        self.stop_strings = tuple(stop_strings)
        self.max_new = max_new  # token budget of the current segment (since submit / resume)
        self.seg_start = len(self.tokens)  # index of the segment's first sampled token
        self.seg_logprobs: list[float] = []
        self.state = state
        self.slot: int | None = None  # while ACTIVE
        self.template: GroupTemplate | None = None  # while FORKING
        self.preempted = 0  # times its K/V was freed to make room
        self.swapped = None  # host K/V of tokens[:n] while preempted with swap (``kv_transfer.SwapSpace``)

    @property
    def uncached(self) -> int:
        """Tokens still to feed: 1 for a decoding sequence, more for a (re)prefill or an extend."""
        return len(self.tokens) - self.cached

    def to(self, state: SeqState) -> None:
        """Move to ``state``; ``AssertionError`` unless ``TRANSITIONS`` allows it."""
        assert state in TRANSITIONS[self.state], f"sequence {self.id}: illegal {self.state.name} -> {state.name}"
        self.state = state

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id}, {self.state.name}, {self.cached}/{len(self.tokens)} cached)"


class GroupTemplate(Seq):
    """The shared prefill of a group: ``prompt[:-1]`` of the children, fed once and never sampled.

    ``children`` are ``FORKING`` (each with ``template`` = this) until the prefill ends; then the
    scheduler forks the template's pages into them and releases it. Releasing every child first
    releases the template too.
    """

    __slots__ = ("children",)

    def __init__(self, seq_id: int, order: tuple[int, int], tokens: Sequence[int], children: list[Seq]):
        super().__init__(seq_id, order, tokens, children[0].key_data, children[0].params)
        self.children = children
        for c in children:
            c.template = self


def stop_reason(seq: Seq, token: int, max_seq_len: int,
                decode_fn: Callable[[list[int]], str] | None) -> tuple[str | None, int | str | None]:
    """Why ``seq`` stops after sampling ``token`` (already appended), and the stop token or string;
    ``(None, None)``: it goes on. Checked in this order: a stop token, a stop string, the segment's
    ``max_new_tokens``, the engine's ``max_seq_len``."""
    if token in seq.stop_ids:  # a stop token (eos, <|im_end|>, </tool_call>): kept in the output
        return "stop_token", token
    if seq.stop_strings:  # text of the new tokens contains a stop string
        # decode only a tail window: a match must end in the newest token (else we stopped before)
        longest = max(len(s) for s in seq.stop_strings)
        text = decode_fn(seq.tokens[max(seq.seg_start, len(seq.tokens) - 2 * longest - 8):])
        stop = next((s for s in seq.stop_strings if s in text), None)
        if stop is not None:
            return "stop_string", stop
    if len(seq.tokens) - seq.seg_start >= seq.max_new:  # the segment's budget is spent
        return "max_new_tokens", None
    if len(seq.tokens) >= max_seq_len:  # no position left for another token
        return "max_seq_len", None
    return None, None
