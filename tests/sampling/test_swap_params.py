"""In-flight weight updates (``PagedEngine.swap_params``, docs/design.md §5.2): running sequences
continue with the new weights and keep their K/V. A swap in the middle of a decode run samples what a
sequence paused at the same token, moved with its K/V to an engine holding the new weights
(``export_seq``/``import_seq``) and resumed there samples; nothing is prefilled again."""

import numpy as np
import pytest
from flax import nnx

from rstar2_jax.model import Qwen3, split_policy
from rstar2_jax.sampling import EngineConfig, Greedy, PagedEngine, Request, Temperature
from tests.sampling.test_kv_transfer import _finish

CFG = EngineConfig(num_slots=4, page_size=4, max_seq_len=96, num_pages=64, prefill_chunk=8)
PROMPT = np.random.default_rng(0).integers(0, 128, size=11).tolist()
N = 30  # new tokens


@pytest.fixture(scope="module")
def new_params(policy):
    mcfg, _, _ = policy
    return split_policy(Qwen3(mcfg, rngs=nnx.Rngs(1)))[1]  # another policy: the swap shows in the tokens


def _request(sampler, n=N):
    return Request(prompt=PROMPT, key=7, max_new_tokens=n, sampler=sampler)


@pytest.mark.parametrize("sampler", [Greedy(), Temperature(temperature=1.0)], ids=["greedy", "sampled"])
def test_swap_mid_decode_equals_a_move_to_the_new_weights_at_that_token(policy, new_params, sampler):
    mcfg, graphdef, params = policy
    old_only = PagedEngine(graphdef, params, mcfg, CFG)
    want_old = _finish(old_only, old_only.submit(_request(sampler)))

    eng = PagedEngine(graphdef, params, mcfg, CFG)
    other = eng.submit(Request(prompt=PROMPT[:5], key=3, max_new_tokens=N, sampler=sampler))  # a second live row
    sid = eng.submit(_request(sampler))
    while len(eng.tokens(sid)) - len(PROMPT) < 3:  # prefill chunks, then a decode run or two
        eng.step()
    swap_at = len(eng.tokens(sid)) - len(PROMPT)  # tokens sampled with the old weights
    assert 0 < swap_at < N - 5
    prefilled = eng.stats().prefill_tokens
    eng.swap_params(new_params)  # live sequences: set_params would refuse
    with pytest.raises(RuntimeError, match="not idle"):
        eng.set_params(new_params)
    got = _finish(eng, sid)
    assert eng.stats().prefill_tokens == prefilled  # nothing prefilled again: the K/V stayed
    assert len(got.tokens) == N
    assert got.tokens[:swap_at] == want_old.tokens[:swap_at]  # before the swap: the old weights' tokens
    assert got.tokens[swap_at:] != want_old.tokens[swap_at:]  # after: another policy's

    # the same sequence paused after swap_at tokens, its K/V moved to an engine with the new weights
    src = PagedEngine(graphdef, params, mcfg, CFG)
    first = _finish(src, src.submit(_request(sampler, swap_at)))
    exp = src.export_seq(first.seq_id)
    dst = PagedEngine(graphdef, new_params, mcfg, CFG)
    rest = _finish(dst, dst.import_seq(exp, max_new_tokens=N - swap_at))
    assert first.tokens + rest.tokens == got.tokens
    np.testing.assert_allclose(first.logprobs + rest.logprobs, got.logprobs, atol=1e-4)
    assert other in eng.scheduler.seqs  # the other sequence ran on through the swap


def test_swap_with_the_prefix_cache_and_live_sequences_is_refused(policy, new_params):
    import dataclasses

    mcfg, graphdef, params = policy
    eng = PagedEngine(graphdef, params, mcfg, dataclasses.replace(CFG, prefix_cache=True))
    eng.swap_params(new_params)  # idle: allowed (the cache is invalidated)
    eng.submit(_request(Greedy()))
    eng.step()
    with pytest.raises(NotImplementedError, match="prefix cache"):
        eng.swap_params(params)


def test_worker_stamps_each_token_with_the_version_that_sampled_it(policy, new_params):
    """The engine worker (``rollout.worker``) swaps between two steps and reports per-token versions:
    the old version up to the swap's token, the new one after (the tokens: the test above)."""
    import queue

    from rstar2_jax.rollout.messages import Admitted, Stepped, SubmitGroup, SwapParams
    from rstar2_jax.rollout.worker import EngineWorker

    mcfg, graphdef, params = policy
    eng = PagedEngine(graphdef, params, mcfg, CFG)
    out = queue.Queue()
    w = EngineWorker(0, eng, out, 0.0, version=4)
    w._apply(SubmitGroup("g", _request(Greedy()), 2))
    ids = out.get().seq_ids
    steps, stepped = 0, []
    while len(eng.tokens(ids[0])) - len(PROMPT) < 3:
        steps = w._step(steps)
    swap_at = len(eng.tokens(ids[0])) - len(PROMPT)
    w._apply(SwapParams(new_params, 5))
    while eng.has_work():
        steps = w._step(steps)
    while not out.empty():
        msg = out.get()
        if isinstance(msg, Stepped) and msg.events:
            stepped.append(msg)
    (msg,) = stepped  # both samples stop in the same step (a group, greedy, same budget)
    assert msg.versions is not None
    for ev, versions in zip(msg.events, msg.versions):
        assert list(versions) == [4] * swap_at + [5] * (N - swap_at)
