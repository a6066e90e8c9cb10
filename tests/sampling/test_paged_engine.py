"""PagedEngine: paged decode equals the full forward pass, token for token.

One tiny random policy and one engine shape per module (compiled once); each test builds a fresh
engine on it. The naive reference recomputes ``rstar2_jax.model.logits`` over all tokens per token.
"""

import jax
import numpy as np
import pytest

from rstar2_jax.model import token_logprobs
from rstar2_jax.sampling import EngineConfig, Greedy, PagedEngine, Request, Temperature, TopP, child_key_data
from rstar2_jax.testing.dense_sampler import DenseSampler, naive_generate

MAX_LEN = 64  # a multiple of kv_cache.KV_BLOCK (the dense sampler needs it)
CFG = EngineConfig(num_slots=4, page_size=4, max_seq_len=MAX_LEN, num_pages=64, prefill_chunk=8, prefill_rows=1)


def _engine(policy, cfg=CFG, **kw):
    mcfg, graphdef, params = policy
    return PagedEngine(graphdef, params, mcfg, cfg, **kw)


def _prompt(n, seed):
    return np.random.default_rng(seed).integers(0, 128, size=n).tolist()


def _naive(policy, prompt, key, n, sampler=Greedy()):
    _, graphdef, params = policy
    return naive_generate(graphdef, params, prompt, key, n, sampler=sampler, pad_to=MAX_LEN)


def _run(engine, on_event=None):
    """Step to idle; returns {seq_id: [events]}; checks the page table after every step."""
    out = {}
    while engine.has_work():
        for ev in engine.step():
            out.setdefault(ev.seq_id, []).append(ev)
            if on_event:
                on_event(ev)
        engine.page_table.check_invariants()
    return out


def test_greedy_equals_naive_with_mixed_lengths_groups_slots_and_resume(policy):
    eng = _engine(policy)
    # 5 singles (lengths 1..17: one-token prompt, multi-chunk prompt) + 2 groups = 11 sequences, 4 slots.
    singles = {eng.submit(Request(prompt=_prompt(n, n), key=n, max_new_tokens=m, sampler=Greedy())): (n, m)
               for n, m in [(1, 7), (3, 12), (9, 5), (17, 9), (6, 4)]}
    g_partial = eng.submit_group(Request(prompt=_prompt(10, 100), key=1, max_new_tokens=8, sampler=Greedy()), 3)
    g_aligned = eng.submit_group(Request(prompt=_prompt(5, 101), key=2, max_new_tokens=6, sampler=Greedy()), 2)
    paused_id = next(s for s, (n, _) in singles.items() if n == 9)
    tool = _prompt(7, 999)  # a tool response appended mid-run, while other sequences still decode

    def on_event(ev):
        if ev.seq_id == paused_id and len(eng.tokens(paused_id)) == 9 + 5:
            assert eng.has_work(), "resume should happen while other sequences run"
            eng.resume(paused_id, tool, max_new_tokens=6)

    events = _run(eng, on_event)
    for sid, (n, m) in singles.items():
        want, _ = _naive(policy, _prompt(n, n), n, m)
        assert events[sid][0].tokens == want and events[sid][0].reason == "max_new_tokens"
    # After resume: the model sees prompt + 5 sampled + tool tokens; appended tokens get no log-probs.
    first = events[paused_id][0].tokens
    want2, _ = _naive(policy, _prompt(9, 9) + first + tool, 0, 6)
    assert events[paused_id][1].tokens == want2 and len(events[paused_id][1].logprobs) == 6
    assert eng.tokens(paused_id) == _prompt(9, 9) + first + tool + want2
    for ids, n, m, seed in [(g_partial, 10, 8, 100), (g_aligned, 5, 6, 101)]:
        want, _ = _naive(policy, _prompt(n, seed), 0, m)
        assert all(events[i][0].tokens == want for i in ids)
    stats = eng.stats()
    # template lengths 9 and 4: only the first has a partial last page -> one copy per child
    assert stats.page_copies == 3
    # Prefill chunks of 8; a single uncached token left over goes through a decode row instead:
    # singles 3 + (9 = 8 + 1 decoded) + (17 = 8 + 8 + 1) + 6 and the one-token prompt decodes directly;
    # each group's prompt[:-1] once (9, 4), its children decode their last prompt token;
    # the resume extends by last sampled token + 7 tool tokens.
    assert stats.prefill_tokens == (3 + 8 + 16 + 6) + (9 + 4) + (1 + 7)
    assert stats.preemptions == 0
    for sid in list(events):
        eng.release(sid)
    assert eng.free_pages() == CFG.num_pages - 1
    eng.page_table.check_invariants()


def test_sampler_logprobs_equal_policy_forward_logprobs_at_the_sampling_temperature(policy):
    # the engine records log softmax(logits / τ)[token]; the trainer's pass at the same τ gives the same numbers
    from rstar2_jax.rl.mismatch import mismatch_metrics

    mcfg, graphdef, params = policy
    eng = _engine(policy)
    prompt = _prompt(6, 5)
    ids = eng.submit_group(Request(prompt=prompt, key=3, max_new_tokens=12, sampler=Temperature()), 3)
    ids.append(eng.submit(Request(prompt=prompt, key=4, max_new_tokens=12, sampler=TopP(p=0.8, temperature=0.7))))
    temps = [1.0, 1.0, 1.0, 0.7]
    events = _run(eng)
    got, want = [], []
    for sid, tau in zip(ids, temps):
        ev = events[sid][0]
        full = np.asarray(prompt + ev.tokens, np.int32)[None]
        ref = token_logprobs(graphdef, params, full[:, :-1], full[:, 1:], temperature=tau)[0, len(prompt) - 1:]
        np.testing.assert_allclose(ev.logprobs, ref, atol=1e-4)
        got.append(np.asarray(ev.logprobs, np.float32))
        want.append(np.asarray(ref, np.float32))
    n = max(len(g) for g in got)
    pad = lambda xs: np.stack([np.pad(x, (0, n - len(x))) for x in xs])  # noqa: E731
    mask = pad([np.ones_like(g) for g in got])
    m = {k: float(v) for k, v in mismatch_metrics(pad(got), pad(want), mask).items()}
    print("fp32 engine vs trainer mismatch:", m)
    assert m["abs_mean"] < 1e-5 and m["abs_max"] < 1e-4 and abs(m["k3"]) < 1e-9 and abs(m["log_ppl_diff"]) < 1e-5, m


def test_same_key_same_samples_whatever_the_slot_and_batch(policy):
    req = Request(prompt=_prompt(7, 7), key=11, max_new_tokens=10, sampler=Temperature())
    alone = _engine(policy)
    a = alone.submit(req)
    got_alone = _run(alone)[a][0].tokens
    crowded = _engine(policy)
    for i in range(3):  # occupy slots 0-2 first, so req lands in slot 3 next to other work
        crowded.submit(Request(prompt=_prompt(3 + i, i), key=i, max_new_tokens=15))
    b = crowded.submit(req)
    other = crowded.submit(Request(prompt=req.prompt, key=12, max_new_tokens=10))
    events = _run(crowded)
    assert events[b][0].tokens == got_alone
    assert events[other][0].tokens != got_alone  # another key, temperature 1
    # group child i samples exactly as a single request with key fold_in(key, i)
    grp = _engine(policy)
    kids = grp.submit_group(req, 2)
    kid_events = _run(grp)
    for i, kid in enumerate(kids):
        single = _engine(policy)
        s = single.submit(Request(prompt=req.prompt, key=child_key_data(req.key, i), max_new_tokens=10))
        assert _run(single)[s][0].tokens == kid_events[kid][0].tokens
    assert kid_events[kids[0]][0].tokens != kid_events[kids[1]][0].tokens


def test_small_page_pool_preempts_and_still_matches(policy):
    # 13 usable pages x 4 = 52 token positions for 4 slots of sequences that grow to 36 tokens.
    small = EngineConfig(num_slots=4, page_size=4, max_seq_len=MAX_LEN, num_pages=14, prefill_chunk=8,
                         decode_row_buckets=(2,))  # also exercises the smaller decode-row variant
    eng = _engine(policy, small)
    assert eng.warmup() == 9  # {2, 4} decode rows x {without, with} prefill rows, mixed loop at 2/4 rows, copies 1/2/4
    reqs = [Request(prompt=_prompt(6 + i, 50 + i), key=i, max_new_tokens=28, sampler=Greedy()) for i in range(5)]
    reqs.append(Request(prompt=_prompt(8, 60), key=7, max_new_tokens=26, sampler=Temperature()))
    ids = [eng.submit(r) for r in reqs]
    events = {}
    while eng.has_work():
        for ev in eng.step():
            events[ev.seq_id] = ev
            eng.release(ev.seq_id)  # finished sequences free memory for the waiting ones
        eng.page_table.check_invariants()
    assert eng.stats().preemptions > 0
    for sid, r in zip(ids[:-1], reqs[:-1]):
        assert events[sid].tokens == _naive(policy, list(r.prompt), r.key, r.max_new_tokens)[0]
    # sampled request: same tokens and log-probs as in a roomy engine (same per-token keys)
    roomy = _engine(policy)
    s = roomy.submit(reqs[-1])
    ref = _run(roomy)[s][0]
    assert events[ids[-1]].tokens == ref.tokens
    np.testing.assert_allclose(events[ids[-1]].logprobs, ref.logprobs, atol=1e-5)
    assert eng.free_pages() == small.num_pages - 1


def test_stop_tokens_and_stop_strings_pause_and_keep_pages(policy):
    prompt = _prompt(5, 3)
    want, _ = _naive(policy, prompt, 0, 12)
    decode_fn = lambda ids: "".join(chr(0x100 + i) for i in ids)  # one char per token
    eng = _engine(policy, decode_fn=decode_fn)
    a = eng.submit(Request(prompt=prompt, key=0, max_new_tokens=12, sampler=Greedy(), stop_token_ids=(want[3],)))
    b = eng.submit(Request(prompt=prompt, key=0, max_new_tokens=12, sampler=Greedy(),
                           stop_strings=(decode_fn(want[4:6]),)))
    events = _run(eng)
    cut = want.index(want[3]) + 1
    assert events[a][0].tokens == want[:cut] and events[a][0].reason == "stop_token"
    stop_at = next(j for j in range(1, 13) if decode_fn(want[4:6]) in decode_fn(want[:j]))
    assert events[b][0].reason == "stop_string" and events[b][0].tokens == want[:stop_at]
    assert eng.free_pages() < CFG.num_pages - 1  # paused sequences keep their pages
    eng.release(a)
    eng.release(b)
    assert eng.free_pages() == CFG.num_pages - 1


def test_registered_attention_kernel_is_used_and_matches(policy):
    from rstar2_jax.sampling import kv_cache, register_attention_kernel
    calls = []

    def kernel(q_rqnh, layer, bt_rm, pos_rq):  # the reference, called through the hook
        calls.append(q_rqnh.shape)
        return kv_cache.paged_attention(q_rqnh, layer, bt_rm, pos_rq)

    register_attention_kernel("test_reference", kernel)
    cfg = EngineConfig(num_slots=2, page_size=4, max_seq_len=MAX_LEN, num_pages=32, attention_impl="test_reference")
    eng = _engine(policy, cfg)
    sid = eng.submit(Request(prompt=_prompt(5, 1), key=0, max_new_tokens=6, sampler=Greedy()))
    assert _run(eng)[sid][0].tokens == _naive(policy, _prompt(5, 1), 0, 6)[0]
    # [rows, Q, N, H], traced per layer: decode rows (Q = 1) and the chunk rows (Q = prefill_chunk) both
    assert (2, 1, 4, 16) in calls and (cfg.prefill_rows, 1, 4, 16) not in calls[:0]
    assert {q for _, q, _, _ in calls} == {1, cfg.prefill_chunk}


def test_misuse_errors_are_clear(policy):
    _, _, params = policy
    eng = _engine(policy)
    with pytest.raises(ValueError, match="max_seq_len"):
        eng.submit(Request(prompt=[1] * 60, key=0, max_new_tokens=5))
    tiny_pool = _engine(policy, EngineConfig(num_slots=4, page_size=4, max_seq_len=MAX_LEN, num_pages=5))
    with pytest.raises(ValueError, match="can never fit"):
        tiny_pool.submit(Request(prompt=[1] * 10, key=0, max_new_tokens=10))
    with pytest.raises(ValueError, match="attention_impl"):
        EngineConfig(num_pages=8, attention_impl="no_such_kernel")
    with pytest.raises(ValueError, match="exactly one"):
        EngineConfig()
    with pytest.raises(ValueError, match="decode_fn"):
        eng.submit(Request(prompt=[1], key=0, max_new_tokens=2, stop_strings=("x",)))
    sid = eng.submit(Request(prompt=[1, 2], key=0, max_new_tokens=2))
    with pytest.raises(ValueError, match="not paused"):
        eng.resume(sid, [3], max_new_tokens=2)
    with pytest.raises(RuntimeError, match="not idle"):
        eng.set_params(params)
    eng.release(sid)  # abort while waiting
    eng.set_params(params)
    assert not eng.has_work() and eng.free_pages() == CFG.num_pages - 1


def test_dense_sampler_equals_naive(policy):
    mcfg, graphdef, params = policy
    ds = DenseSampler(graphdef, params, mcfg, batch_size=2, max_prompt_len=12, max_len=MAX_LEN)
    prompts = [_prompt(n, n) for n in (3, 12, 5)]
    for sampler in (Greedy(), Temperature()):
        out = ds.generate(prompts, [0, 1, 2], [6, 3, 9], sampler=sampler)
        for i, p in enumerate(prompts):
            toks, lps = _naive(policy, p, i, [6, 3, 9][i], sampler)
            assert out[i][0] == toks
            np.testing.assert_allclose(out[i][1], lps, atol=1e-4)
