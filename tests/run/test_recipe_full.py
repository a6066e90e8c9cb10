"""The recipe's full path (not ``--dry-run``): a local HF checkpoint directory written by
``model.hf_io.export_hf``, an HF ``tokenizer.json`` with the Qwen chat specials (``tokenizers``), the
full rStar2 template, a training mesh over the 8 fake devices and 4 engines x tensor-parallel 2.

A random policy never earns a reward (RoC would drop every group), so the SFT data teaches one
answer format with the right and a wrong value equally often for the RL problems: sampled at
temperature 1 the policy then answers each right about half the time, groups are mixed, and the RL
steps update for real.
"""

import gc
import json
import math
import weakref

import jax
import pytest
from flax import nnx

from rstar2_jax.model import Qwen3, split_policy
from rstar2_jax.model.config import ModelConfig
from rstar2_jax.model.hf_io import export_hf
from rstar2_jax.rollout.template import TOOL_NAME, TemplateConfig, render_prompt
from rstar2_jax.text.tokenizer import CHAT_SPECIALS, HFTokenizer, train_byte_bpe


PROBLEMS = [("p0", "What is 3 + 4?", "7"), ("p1", "What is 2 + 5?", "7"), ("p2", "What is 10 - 3?", "7"),
            ("p3", "What is 1 + 6?", "7")]


def _answer(value: str) -> str:
    return f"<reason>Add.</reason><answer>\\boxed{{{value}}}</answer>"


def _records() -> list[dict]:
    """Per RL problem: the right and a wrong answer (4x each); plus tool-call traces."""
    recs = []
    for _, text, gold in PROBLEMS:
        for value in (gold, "8") * 4:
            recs.append({"messages": [{"role": "user", "content": text},
                                      {"role": "assistant", "content": _answer(value)}]})
    call = [{"type": "function", "function": {"name": TOOL_NAME, "arguments": {"code": "print(6 * 7)", "input": ""}}}]
    recs += [{"messages": [{"role": "user", "content": "What is 6 * 7?"},
                           {"role": "assistant", "content": "<reason>Use python.\n", "tool_calls": call},
                           {"role": "tool", "content": "42"},
                           {"role": "assistant", "content": "<reason>Done.</reason><answer>\\boxed{42}</answer>"}]}] * 2
    return recs


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("full")
    model = root / "model"
    tpl = TemplateConfig()
    texts = [render_prompt(text, tpl) + _answer("7") + _answer("8") for _, text, _ in PROBLEMS]
    tok = train_byte_bpe(texts * 4, 1000, specials=CHAT_SPECIALS, eos="<|endoftext|>", pad="<|pad|>")
    tok.save(model)
    mcfg = ModelConfig.tiny(vocab_size=tok.vocab_size)
    graphdef, params = split_policy(Qwen3(mcfg, rngs=nnx.Rngs(0)))
    export_hf(model, graphdef, params, mcfg)
    (root / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _records()))
    (root / "rl.jsonl").write_text("".join(json.dumps({"id": i, "problem": p, "answer": a}) + "\n"
                                           for i, p, a in PROBLEMS))
    # a RunSpec file; partial sections over their defaults (the test checks they reach the built objects)
    cfg = {"model": {"path": str(model), "dtype": "float32", "tokenizer": "hf"},
           "mesh": {"data": 1, "fsdp": 8, "tensor": 1},
           "data": {"sft_data": str(root / "sft.jsonl"), "rl_data": str(root / "rl.jsonl"), "sft_shards": 8,
                    "max_prompt_tokens": 1024},
           "sft": {"seq_len": 256, "batch_size": 8, "epochs": 30.0, "optim": {"lr": 1e-2, "warmup_steps": 0}},
           "rl": {"roc": {"keep_per_group": 2}, "optim": {"lr": 1e-4, "warmup_steps": 0}, "temperature": 1.0,
                  "old_logp_source": "recompute", "logprob_chunk_size": 128, "loss": {"eps_high": 0.28}},
           "rollout": {"n_samples": 4, "template": "full", "admission": {"prior_weight": 2.0}},
           "engine": {"slots": 8, "kv_memory_gb": 0.01, "page_size": 8},
           "placement": {"engines_per_process": None, "devices_per_engine": 2},
           "sandbox": {"workers": 1, "limits": {"wall_s": 6.0, "cpu_s": 5.0, "memory_mb": 2048,
                                                "preload": ["numpy", "sympy", "rstar2_jax.rewards.worker"]}},
           "eval": {"every": 50, "k": 1},
           "schedule": {"problems_per_step": 4,
                        "stages": {"stage1_budget": 48, "stage2_budget": 48, "stage1_max_steps": 1,
                                   "stage2_max_steps": 1, "stage3_steps": 1, "trunc_target": 1.0, "trunc_tol": 0.5,
                                   "trunc_window": 1, "filter_k": 2, "filter_pool": 4}},
           "checkpoint": {"every": 10, "every_sft": 10}}
    (root / "config.json").write_text(json.dumps(cfg))
    return root


def _record_built(monkeypatch, script) -> dict:
    """Wrap the script's constructors to record the engine configs, sandbox limits, rollout config and RL
    config it builds (each still builds the real object)."""
    from rstar2_jax.deploy import placement  # the engines are built by placement.place_engines

    built: dict = {"engine": []}

    class Engine(placement.PagedEngine):
        def __init__(self, *args, **kwargs):
            built["engine"].append(args[3])
            super().__init__(*args, **kwargs)

    def wrap(name, record):
        real = getattr(script, name)

        def make(*args, **kwargs):
            record(args, kwargs)
            return real(*args, **kwargs)
        monkeypatch.setattr(script, name, make)

    monkeypatch.setattr(placement, "PagedEngine", Engine)
    wrap("open_pool", lambda a, k: built.update(limits=k["limits"]))
    def on_rollout(a, k):  # built after SFT: by then nothing holds the initial params (one copy in RL)
        gc.collect()
        built.update(rollout=a[3], initial_alive=sum(r() is not None for r in built["initial"]))

    wrap("Rollout", on_rollout)
    wrap("Parts", lambda a, k: built.update(rl=k["rl"], async_rl=k["async_rl"],
                                            initial=[weakref.ref(x) for x in jax.tree.leaves(k["params"])]))
    return built


@pytest.mark.slow
def test_full_recipe_path_on_an_hf_directory(run_dir, capsys, monkeypatch):
    from rstar2_jax.run import recipe_main

    from rstar2_jax.run.spec import load_spec
    from rstar2_jax.utils.config_io import to_plain

    built = _record_built(monkeypatch, recipe_main)

    tok = HFTokenizer(run_dir / "model")
    for special in ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<|endoftext|>"):
        assert len(tok.encode(special)) == 1, special  # single ids, as in Qwen's tokenizer
    assert jax.device_count() == 8
    out = run_dir / "out"
    summary = recipe_main.main(["--config", str(run_dir / "config.json"), "--out", str(out), "--no-progress",
                                  "--set", "rl.loss.eps_low=0.25", "--set", "engine.prefill_chunk=32"])
    # the file's components and the dotted --set overrides reached the objects the run built, the rest of
    # each section kept its defaults; the run directory holds the whole resolved spec, which reads back
    assert [(e.page_size, e.prefill_chunk, e.num_slots) for e in built["engine"]] == [(8, 32, 8)] * 4
    assert (built["limits"].wall_s, built["limits"].memory_mb) == (6.0, 2048)
    assert built["rollout"].admission.prior_weight == 2.0 and built["rollout"].max_errored == 0
    assert (built["rl"].loss.eps_high, built["rl"].loss.eps_low, built["rl"].roc.keep_per_group) == (0.28, 0.25, 2)
    assert built["async_rl"].max_staleness == 0
    assert built["initial"] and built["initial_alive"] == 0  # the driver dropped Parts.params once SFT began
    saved = json.loads((out / "run_spec.json").read_text())
    assert (saved["engine"]["page_size"], saved["engine"]["prefill_chunk"], saved["rl"]["loss"]["eps_low"]) == (
        8, 32, 0.25)
    again = load_spec(out / "run_spec.json")
    assert to_plain(again) == saved and (again.rl.loss, again.sandbox.limits) == (built["rl"].loss, built["limits"])
    printed = capsys.readouterr().out
    assert "placement: processes = 1, engines = 4, devices_per_engine = 2, devices_used = 8/8" in printed
    assert summary["stages"][:3] == ["sft", "rl_stage1", "rl_stage2"]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    sft = [r for r in rows if r.get("stage") == "sft"]
    assert sft and sft[-1]["loss"] < sft[0]["loss"]
    rl = [r for r in rows if r.get("stage", "").startswith("rl_") and "reward" in r]
    assert len(rl) >= 2
    updated = [r for r in rl if r["n_kept"] > 0 and math.isfinite(r["train/loss"]) and r["train/update_norm"] > 0]
    assert len(updated) >= 2, [(r["stage"], r["reward"], r["n_kept"]) for r in rl]
    assert all(0 < r["reward"] < 1 for r in updated)  # mixed groups: right and wrong answers
    assert all(r["sync_bytes"] > 0 and r["time_sync_s"] > 0 for r in rl)
