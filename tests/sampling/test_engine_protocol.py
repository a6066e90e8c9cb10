"""Every engine in the repo implements ``sampling.interface.Engine``: ``isinstance`` holds (every
member is present) and each method accepts the calls the protocol declares (its required
arguments alone, and every positional one)."""

import inspect

import pytest
from flax import nnx

from rstar2_jax.model import Qwen3, split_policy
from rstar2_jax.model.config import ModelConfig
from rstar2_jax.sampling import Engine, EngineConfig, PagedEngine
from rstar2_jax.deploy.engine_proc import ProcessEngine
from rstar2_jax.testing.engine_host import EngineHost, ScriptedTurnsEngine
from tests.rollout.fakes import ScriptedEngine
from tests.deploy.test_engine_proc import TOK, make_engine, script

PROPERTIES = ("page_size", "usable_pages", "max_seq_len")
METHODS = ("submit", "submit_group", "step", "resume", "release", "has_work", "stats", "set_params")
ECFG = EngineConfig(num_slots=2, page_size=4, max_seq_len=32, num_pages=9, prefill_chunk=4)
P = inspect.Parameter


def _calls(name: str) -> list[tuple[int, tuple[str, ...]]]:
    """(positional count, keyword names) of the minimal and the fullest positional call of ``name``."""
    params = list(inspect.signature(getattr(Engine, name)).parameters.values())[1:]  # drop self
    positional = [p for p in params if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
    keywords = tuple(p.name for p in params if p.kind is P.KEYWORD_ONLY and p.default is P.empty)
    required = sum(p.default is P.empty for p in positional)
    return [(required, keywords), (len(positional), keywords)]


def _check(engine) -> None:
    assert isinstance(engine, Engine), type(engine).__name__
    for name in PROPERTIES:
        assert isinstance(getattr(engine, name), int), name
    for name in METHODS:
        sig = inspect.signature(getattr(engine, name))
        for n_pos, kw in _calls(name):
            try:
                sig.bind(*range(n_pos), **dict.fromkeys(kw))
            except TypeError as e:
                pytest.fail(f"{type(engine).__name__}.{name}{sig} does not take {n_pos} positional "
                            f"+ {kw} as Engine.{name} declares: {e}")


def test_the_protocol_lists_what_this_test_checks():
    declared = {n for n in vars(Engine) if not n.startswith("_")}
    assert declared == set(PROPERTIES) | set(METHODS)


def test_paged_engine_and_the_scripted_engines():
    mcfg = ModelConfig.tiny(num_layers=1)
    graphdef, params = split_policy(Qwen3(mcfg, rngs=nnx.Rngs(0)))
    paged = PagedEngine(graphdef, params, mcfg, ECFG)  # built only: nothing compiles
    _check(paged)
    _check(ScriptedEngine(TOK, script))
    _check(ScriptedTurnsEngine(paged, {}))
    host = EngineHost({"num_layers": 1}, ECFG)  # compiles its two step variants
    host.reset({})
    _check(host)


def test_process_engine():
    with ProcessEngine(make_engine) as proc:
        _check(proc)
