"""Per-token policy versions under in-flight weight updates: a token carries the version of the weights
that sampled it (the worker's, acknowledged by ``Swapped``), never a push its engine had not applied yet.

Both tests place the push deterministically: the engine's own ``step`` pushes and waits until the
dispatcher has forwarded the ``SwapParams`` (so the worker applies it right after this step), so the
outcome does not depend on thread timing; the only wait is a synchronisation with a failing timeout.
"""

import threading

import jax
import pytest
from flax import nnx

from rstar2_jax.train.async_loop import oldest_version, stale_filter, staleness_counts
from rstar2_jax.model import Qwen3, split_policy
from rstar2_jax.model.config import ModelConfig
from rstar2_jax.rollout import TemplateConfig
from rstar2_jax.rollout.dispatcher import Dispatcher, RolloutConfig
from rstar2_jax.rollout.messages import PushWeights
from rstar2_jax.rollout.service import Rollout
from rstar2_jax.sampling import EngineConfig, PagedEngine
from rstar2_jax.text.tokenizer import ByteTokenizer
from tests.rollout.fakes import InstantPool, ScriptedEngine
from tests.rollout.test_scripted_rollout import P, call

TOK = ByteTokenizer()
SYNC_TIMEOUT_S = 120.0  # a synchronisation, not a measurement: only a deadlock reaches it


def _forwarding(dispatcher: Dispatcher) -> threading.Event:
    """An event set once the dispatcher has forwarded a ``PushWeights`` to its workers."""
    forwarded, handle = threading.Event(), dispatcher._handle

    def wrapped(msg):
        handle(msg)
        if isinstance(msg, PushWeights):
            forwarded.set()

    dispatcher._handle = wrapped
    return forwarded


def _push_and_wait(push, forwarded: threading.Event) -> None:
    push()
    if not forwarded.wait(SYNC_TIMEOUT_S):
        raise AssertionError("the dispatcher never forwarded the push")


class _PushOnStep(ScriptedEngine):
    """Pushes new weights from inside its ``at``-th step, after the dispatcher has taken the push and
    before this step's (old-weight) events are reported: the old code stamped them with the new version."""

    def __init__(self, *a, at: int, push, **kw):
        super().__init__(*a, **kw)
        self.at, self.push, self.n = at, push, 0

    def step(self):
        events = super().step()
        self.n += 1
        if self.n == self.at:
            self.push()
        return events


def test_stop_events_sampled_before_the_swap_keep_the_old_version():
    script = lambda prompt, child, turn: [f"compute{call('6*7')}", "no idea<|im_end|>"][turn]  # noqa: E731
    cfg = RolloutConfig(n_samples=3, budget=300, template=TemplateConfig.toy(report_exec_time=False))
    holder = {}
    eng = _PushOnStep(TOK, script, at=1, push=lambda: _push_and_wait(lambda: holder["d"].push(["params-1"], 1),
                                                                     holder["forwarded"]))
    d = holder["d"] = Dispatcher([eng], InstantPool(), TOK, cfg)
    holder["forwarded"] = _forwarding(d)
    res = d.run([P("a", "a")])
    for t in res.trajectories:
        sampled = [v for v, m in zip(t.versions, t.loss_mask) if m]
        n0 = len(TOK.encode(t.turns[0]))
        assert sampled == [0] * n0 + [1] * (len(sampled) - n0) and len(sampled) > n0, sampled
    assert d.policy_version == 1 and eng.params == "params-1"
    # the learner at version 1: every trajectory has tokens 1 behind, so k = 0 drops the group
    keep, c = stale_filter(res.trajectories, 1, 0, "drop")
    assert keep == [False] * 3 and c.dropped_groups == 1


# -- the real paged engine ---------------------------------------------------------------------------------
ECFG = EngineConfig(num_slots=8, page_size=16, max_seq_len=192, num_pages=64, prefill_chunk=32, decode_steps=1)
MIN_BEFORE = 10  # the push lands once every live sample has sampled this many tokens of its turn


class _PagedPushAt(PagedEngine):
    """A ``PagedEngine`` that calls ``hook(self)`` after the first step at which every live sample has
    sampled at least ``MIN_BEFORE`` tokens (a count of tokens, not a time)."""

    hook = None
    live: tuple = ()  # the worker's live sequence ids (its ``marks``), set by the test
    prompt_len = 0
    fired = False

    def step(self):
        events = super().step()
        live = [s for s in self.live() if s not in {ev.seq_id for ev in events}]
        if not self.fired and live and min(len(self.tokens(s)) - self.prompt_len for s in live) >= MIN_BEFORE:
            self.fired = True
            self.hook(self)
        return events


@pytest.fixture(scope="module")
def policy():
    cfg = ModelConfig.tiny(vocab_size=TOK.vocab_size)
    graphdef, params = split_policy(Qwen3(cfg, rngs=nnx.Rngs(0)))
    return cfg, graphdef, params


def test_paged_engine_inflight_push_mid_turn_stamps_each_token(policy):
    cfg, graphdef, params = policy
    tpl = TemplateConfig.toy(report_exec_time=False)
    rcfg = RolloutConfig(n_samples=4, budget=40, template=tpl)
    eng = _PagedPushAt(graphdef, params, cfg, ECFG, decode_fn=TOK.decode, device=jax.devices()[0])
    rollout = Rollout([eng], InstantPool(), TOK, rcfg)
    rollout.sync(params, version=0)
    forwarded = _forwarding(rollout.dispatcher)
    new = jax.tree.map(lambda x: x * 0.5, params)  # other weights: what follows the swap really changes
    at_push: dict[int, int] = {}  # seq id -> its tokens when the push landed (the swap follows this step)

    def hook(e):
        for s in e.live():
            at_push[s] = len(e.tokens(s))
        _push_and_wait(lambda: rollout.push(new, version=1), forwarded)

    eng.hook = hook
    eng.live = lambda: list(rollout.dispatcher.workers[0].marks)
    from rstar2_jax.rollout import render_prompt
    eng.prompt_len = len(TOK.encode(render_prompt("What is 2 + 2?", tpl)))
    res = rollout.generate([P("p0", "What is 2 + 2?", "4")], seed=0)
    assert eng.fired and rollout.version == 1
    n_old = n_new = mid_turn = 0
    for t in res.trajectories:
        _, sid = rollout.dispatcher.b.seq_of[t.uid]
        cut = at_push.get(sid, len(t.prompt_tokens) + len(t.response_tokens)) - len(t.prompt_tokens)
        want = [0 if i < cut else 1 for i in range(len(t.response_tokens))]
        got = [v if m else w for v, m, w in zip(t.versions, t.loss_mask, want)]  # appended tokens: -1, not sampled
        assert got == want, (t.uid, cut)
        sampled = [v for v, m in zip(t.versions, t.loss_mask) if m]
        n_old, n_new = n_old + sampled.count(0), n_new + sampled.count(1)
        mid_turn += len(t.turns) == 1 and 0 < sampled.count(0) and 0 < sampled.count(1)
    print(f"paged in-flight push: {n_old} tokens at version 0, {n_new} at version 1, "
          f"{mid_turn} of {len(res.trajectories)} trajectories switched mid-turn")
    assert n_old >= MIN_BEFORE * mid_turn and n_new > 0 and mid_turn >= 1
    # the staleness filter sees the true ages: the learner at version 1 -> the old tokens are 1 behind
    assert staleness_counts(res.trajectories, 1, 1).tolist() == [n_new, n_old]
    assert {oldest_version(t) for t in res.trajectories} == {0}
    assert stale_filter(res.trajectories, 1, 0, "drop")[1].dropped_samples == 4
    assert stale_filter(res.trajectories, 1, 1, "drop")[1].dropped_samples == 0
