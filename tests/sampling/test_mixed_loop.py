"""The mixed loop (K iterations of decode rows + prefill/extend chunks per call) gives exactly what
single steps give.

Each test runs one workload on an engine with ``decode_steps=8`` and on the same shape with
``decode_steps=1`` (every call one ``paged_step``, itself checked against the dense sampler and a
recompute decoder in ``test_paged_engine``) and compares every stop event: tokens, reasons and
stops exactly, log-probs to 2e-6. The loop body is the single step's math, but a schedule can put
a row's token into a step variant of another shape (e.g. a single step that also carries another
sequence's extend chunk), and XLA's matmuls then round differently in the last fp32 bit. Pages of
4 tokens, chunks of 8: an 8-iteration window always crosses a page, and prompts and tool responses
take several chunks, which arrive inside windows.
"""

import dataclasses

import numpy as np
import pytest

from rstar2_jax.sampling import EngineConfig, Greedy, PagedEngine, Request, Temperature, TopK
from rstar2_jax.sampling import mixed_loop as mixed_mod
from rstar2_jax.sampling.mixed_loop import mixed_loop
from rstar2_jax.utils.compiles import CompileCounter
from rstar2_jax.utils.config_io import build

MAX_LEN = 96
BASE = dict(num_slots=4, page_size=4, max_seq_len=MAX_LEN, prefill_chunk=8, prefill_rows=1)


def _decode(ids):  # a toy detokenizer: one letter per token id
    return "".join(chr(65 + t % 26) for t in ids)


def _prompt(n, seed):
    return np.random.default_rng(seed).integers(0, 128, size=n).tolist()


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for sid in a:
        for x, y in zip(a[sid], b[sid], strict=True):
            assert (x.tokens, x.reason, x.stop) == (y.tokens, y.reason, y.stop), sid
            np.testing.assert_allclose(x.logprobs, y.logprobs, rtol=0, atol=2e-6)


def _run(policy, num_pages, submit, turns=None, *, k=8, **over):
    """Step an engine to idle releasing finished sequences unless ``turns()``'s ``on_event`` keeps
    them; returns (events by seq id, stats, step() calls that ran the device)."""
    on_event = turns() if turns is not None else None
    mcfg, graphdef, params = policy
    cfg = EngineConfig(**{**BASE, **over}, num_pages=num_pages, decode_steps=k)
    eng = PagedEngine(graphdef, params, mcfg, cfg, decode_fn=_decode)
    submit(eng)
    out, calls = {}, 0
    while eng.has_work():
        evs = eng.step()
        calls += 1
        for ev in evs:
            out.setdefault(ev.seq_id, []).append(ev)
            if on_event is None or not on_event(eng, ev):
                eng.release(ev.seq_id)
        eng.page_table.check_invariants()
    assert eng.free_pages() == num_pages - 1  # no page leaked, every reservation given back
    assert eng.stats().seqs_holding_pages == 0
    return out, eng.stats(), calls


def _compare(policy, num_pages, submit, turns=None, **over):
    """Single steps and the mixed loop: the same events, in fewer device calls."""
    single, s1, c1 = _run(policy, num_pages, submit, turns, k=1, **over)
    new, sn, cn = _run(policy, num_pages, submit, turns, **over)
    _assert_same(single, new)
    assert sn.mixed_loop_calls > 0 and s1.mixed_loop_calls == 0
    assert cn < c1  # fewer device calls than single steps
    return new, sn, s1, (c1, cn)


def test_stops_inside_a_window_and_page_boundaries(policy):
    # decode-only windows: the first request stops on a token it first samples at index >= 3 (inside
    # the first 8-step window); the others stop on ids that temperature-1 sampling over 128 tokens
    # hits at some point or on budgets that are not multiples of 8
    first = Request(prompt=_prompt(5, 1), key=0, max_new_tokens=12, sampler=Temperature())
    probe, _, _ = _run(policy, 64, lambda e: e.submit(first), k=1)
    toks = next(iter(probe.values()))[0].tokens
    stop_tok = next(t for i, t in enumerate(toks) if i >= 3 and t not in toks[:i])

    def submit(e):
        e.submit(dataclasses.replace(first, stop_token_ids=(stop_tok,)))
        for i in range(6):  # more requests than slots: admission into slots freed mid-window
            e.submit(Request(prompt=_prompt(3 + 2 * i, 10 + i), key=i, max_new_tokens=11 + 3 * i,
                             sampler=TopK(k=20) if i == 2 else Temperature(),
                             stop_token_ids=tuple(range(7 * i, 7 * i + 6))))

    looped, s8, s1, _ = _compare(policy, 64, submit)
    reasons = [ev.reason for evs in looped.values() for ev in evs]
    assert "stop_token" in reasons and "max_new_tokens" in reasons
    cut = [len(evs[0].tokens) for evs in looped.values() if evs[0].reason == "stop_token"]
    assert any(n % 8 for n in cut)  # a stop landed strictly inside a window
    assert s8.decode_tokens == s1.decode_tokens and s8.steps == s1.steps  # same model steps, fewer calls


def test_decode_only_preemption_pressure(policy):
    # 13 usable pages x 4 = 52 positions for 4 slots growing to ~36 tokens each: reservations for a
    # whole window often fail (the window halves or falls back to single steps, which preempt)
    reqs = [Request(prompt=_prompt(6 + i, 50 + i), key=i, max_new_tokens=28,
                    sampler=Greedy() if i % 2 else Temperature()) for i in range(6)]
    _, s8, _, _ = _compare(policy, 14, lambda e: [e.submit(r) for r in reqs])
    assert s8.preemptions > 0


def _tool_turns(tool_len, turns):
    """A maker of ``on_event``: resume each sequence with a tool response of ``tool_len`` tokens
    ``turns`` times."""
    return lambda: _on_event(tool_len, turns, {})


def _on_event(tool_len, turns, seen):
    def on_event(e, ev):
        n = seen.get(ev.seq_id, 0)
        if n >= turns or len(e.tokens(ev.seq_id)) + tool_len + 12 > MAX_LEN:
            return False
        seen[ev.seq_id] = n + 1
        e.resume(ev.seq_id, _prompt(tool_len, 1000 + 10 * ev.seq_id + n), max_new_tokens=6 + 3 * n)
        return True

    return on_event


def test_chunks_arrive_inside_windows(policy):
    # more requests than slots, long prompts (several chunks) while others decode, tool responses
    # (extend chunks of 11 tokens: one left over goes through a decode row) on every stop
    def submit(e):
        for i in range(7):
            e.submit(Request(prompt=_prompt(5 + 4 * i, 10 + i), key=i, max_new_tokens=9 + 2 * i,
                             sampler=TopK(k=20) if i == 2 else Greedy() if i == 4 else Temperature(),
                             stop_token_ids=tuple(range(9 * i, 9 * i + 3))))

    new, sn, s1, _ = _compare(policy, 128, submit, _tool_turns(11, 2))
    assert sum(len(v) for v in new.values()) > 7  # resumed segments ran
    assert sn.decode_tokens == s1.decode_tokens and sn.prefill_tokens == s1.prefill_tokens
    assert sn.discarded_tokens == 0


def test_stop_strings_decode_in_the_loop(policy):
    def submit(e):
        for i in range(5):
            e.submit(Request(prompt=_prompt(6 + 3 * i, 40 + i), key=i, max_new_tokens=30,
                             sampler=Temperature(), stop_strings=("Q", "XY") if i % 2 == 0 else ("BA",),
                             stop_token_ids=tuple(range(100, 100 + 9 * (i == 1)))))  # 9 ids > STOP_WIDTH

    new, sn, s1, _ = _compare(policy, 128, submit, _tool_turns(9, 1))
    reasons = [ev.reason for evs in new.values() for ev in evs]
    assert "stop_string" in reasons
    assert sn.discarded_tokens > 0  # rows ran past stops the device does not see, and were cut
    assert s1.discarded_tokens == 0


def test_preemption_pressure(policy):
    # 15 usable pages x 4 = 60 positions for 4 slots growing to ~40 tokens each
    def submit(e):
        for i in range(6):
            e.submit(Request(prompt=_prompt(10 + i, 50 + i), key=i, max_new_tokens=28,
                             sampler=Greedy() if i % 2 else Temperature()))

    _, sn, _, _ = _compare(policy, 16, submit, _tool_turns(9, 1))
    assert sn.preemptions > 0


def test_forks_and_resumes(policy):
    def submit(e):  # templates of 13 and 20 tokens (2 and 3 chunks); 13: a partial last page copied per child
        e.submit_group(Request(prompt=_prompt(14, 3), key=5, max_new_tokens=13, sampler=Temperature()), 3,
                       child_max_new_tokens=[13, 9, 20])
        e.submit(Request(prompt=_prompt(17, 4), key=9, max_new_tokens=15, stop_strings=("Q",)))
        e.submit_group(Request(prompt=_prompt(21, 5), key=6, max_new_tokens=11, sampler=TopK(k=5)), 2)

    new, sn, s1, _ = _compare(policy, 128, submit, _tool_turns(10, 1))
    assert sn.page_copies == s1.page_copies == 3


def test_bfloat16_kv_and_buckets(policy, monkeypatch):
    """The mixed loop runs the smallest decode-row bucket that holds a window's slots (rows gathered
    from the slots, outputs scattered back): both buckets ran, the small one when few slots are busy."""
    def submit(e):
        for i in range(5):
            e.submit(Request(prompt=_prompt(9 + 5 * i, 70 + i), key=i, max_new_tokens=12, sampler=Temperature()))

    rows, loop = [], mixed_mod.mixed_loop

    def spy(graphdef, params, cache, batch, spec):
        rows.append(spec.rows)
        return loop(graphdef, params, cache, batch, spec)

    monkeypatch.setattr(mixed_mod, "mixed_loop", spy)
    _compare(policy, 128, submit, _tool_turns(13, 1), kv_dtype="bfloat16", decode_row_buckets=(2,),
             prefill_rows=2)
    assert set(rows) == {2, BASE["num_slots"]}, rows


def test_compiles_once_per_shape(policy):
    mcfg, graphdef, params = policy
    cfg = EngineConfig(**BASE, num_pages=128, decode_steps=8)
    counter = CompileCounter()
    sizes = []
    for r in range(2):  # a second engine of the same shape reuses every compiled variant
        eng = PagedEngine(graphdef, params, mcfg, cfg, decode_fn=_decode)
        eng.warmup()
        counter.take()
        for i in range(6):
            eng.submit(Request(prompt=_prompt(4 + 5 * i, i), key=i, max_new_tokens=9 + i, stop_token_ids=(3, 4),
                               stop_strings=("Q",) if i % 2 else ()))
        for ev in eng.run_until_idle():
            eng.release(ev.seq_id)
        assert counter.take() == 0  # warmup compiled everything the run needed
        assert eng.stats().mixed_loop_calls > 0
        sizes.append(mixed_loop._cache_size())
    assert sizes[0] == sizes[1]


def test_the_old_path_flag_is_gone():
    # issue 43 retired ``mixed_steps=False``: a config that still sets the field fails naming it
    with pytest.raises(TypeError, match="mixed_steps"):
        EngineConfig(num_pages=8, mixed_steps=True)
    with pytest.raises(ValueError, match=r"engine\.mixed_steps: unknown field"):
        build(EngineConfig, {"num_pages": 8, "mixed_steps": True}, where="engine")
