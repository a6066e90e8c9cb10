"""The main job (``make demo``): SFT a tiny byte-level policy from scratch, then GRPO-RoC, on CPU.

Phases (each with a progress bar): toy problems -> SFT traces run through the real sandbox ->
SFT -> held-out eval -> RL steps (paged engines + capacity dispatcher + sandbox + verifier +
RoC + train step), held-out eval every ``eval.every`` steps -> orbax checkpoint, metrics JSONL,
PNG plots and a summary table in ``--out``. The run is one ``RunSpec`` (the ``demo`` preset and the
command line's overrides: ``run.demo_cli``), saved whole as ``<out>/run_spec.json``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import jax
from flax import nnx

from rstar2_jax.data.chat import chat_segments, render_records
from rstar2_jax.data.regimes import get_regime
from rstar2_jax.data.sft_traces import build_traces, copy_drills
from rstar2_jax.data.toy import make_splits
from rstar2_jax.deploy.placement import place_engines, plan_placement
from rstar2_jax.distributed import global_params
from rstar2_jax.eval.load_policy import toy_model_config
from rstar2_jax.model import Qwen3, make_mesh, split_policy
from rstar2_jax.model.config import MeshConfig, ModelConfig
from rstar2_jax.rl.checkpoint import Checkpointer, abstract_train_state
from rstar2_jax.rollout.service import Rollout
from rstar2_jax.run.demo_cli import DemoArgs, finished, parse_args
from rstar2_jax.run.driver import OneStage, Parts, SFTPart, run, write_plots
from rstar2_jax.run.resume import ResumeError
from rstar2_jax.run.scripted import mixed_script
from rstar2_jax.run.spec import RunSpec
from rstar2_jax.sampling import PagedEngine
from rstar2_jax.sandbox.backend import open_pool
from rstar2_jax.testing.scripted import ScriptedPolicy
from rstar2_jax.text.tokenizer import ByteTokenizer, HFTokenizer, train_byte_bpe
from rstar2_jax.train.sft import SFTConfig


def build_model(spec: RunSpec, vocab: int) -> ModelConfig:
    """The toy policy's shape (one definition, shared with the eval loader: ``eval.load_policy``)."""
    return toy_model_config({"hidden": spec.model.hidden, "layers": spec.model.layers}, vocab)


def make_engines(graphdef, params, mcfg: ModelConfig, spec: RunSpec, max_seq_len: int, tok) -> list[PagedEngine]:
    """``placement.engines_per_process`` engines of ``placement.devices_per_engine`` local devices each,
    after the learner's devices when those are disjoint (``learner.devices``)."""
    placement = plan_placement(spec.placement, mcfg, jax.local_devices()[spec.learner.devices or 0:])
    print(placement.table(), placement.line(), sep="\n")
    return place_engines(placement, graphdef, params, mcfg, spec.engine_config(max_seq_len), tok.decode)


def make_tokenizer(spec: RunSpec, resume: bool, records: list[dict], tpl: Any, out: Path):
    """The run's tokenizer: raw bytes, or a byte-level BPE learned from the rendered SFT texts and
    saved as ``<out>/tokenizer.json`` (reloaded from there on ``--resume``, so ids never change)."""
    if spec.model.tokenizer == "byte":
        return ByteTokenizer()
    if resume and (out / "tokenizer.json").exists():
        return HFTokenizer(out)
    texts = ["".join(text for text, _ in chat_segments(rec["messages"], tpl, record=r))
             for r, rec in enumerate(records)]
    tok = train_byte_bpe(texts, spec.model.bpe_vocab)
    tok.save(out)
    return tok


def _sft_key(spec: RunSpec) -> str:
    """The SFT cache's directory name: every setting the SFT policy depends on."""
    m, d, s = spec.model, spec.data, spec.sft
    keys = (("regime", d.regime), ("seed", spec.seed), ("sft_traces", d.sft_traces), ("copy_drills", d.copy_drills),
            ("sft_epochs", s.epochs), ("sft_lr", s.optim.lr), ("sft_batch", s.batch_size), ("sft_seq_len", s.seq_len),
            ("hidden", m.hidden), ("layers", m.layers), ("exec_time", int(spec.rollout.report_exec_time)),
            ("tokenizer", m.tokenizer), ("bpe_vocab", m.bpe_vocab))
    return "sft_" + "_".join(f"{k}={v}" for k, v in keys)


def load_sft_cache(args: DemoArgs, params, sft_cfg: SFTConfig):
    """(state, sft rows) cached for these settings, or None."""
    d = Path(args.sft_cache) / _sft_key(args.spec) if args.sft_cache else None
    if d is None or not (d / "sft_metrics.jsonl").exists():
        return None
    if (args.out / "tokenizer.json").exists() and (d / "tokenizer.json").read_text() != (
            args.out / "tokenizer.json").read_text():
        return None  # trained with other ids
    with Checkpointer(d / "ckpt", max_to_keep=1) as ckpt:
        restored = ckpt.restore(abstract_train_state(params, sft_cfg.rl_view()))
    if restored is None:
        return None
    rows = [json.loads(x) for x in (d / "sft_metrics.jsonl").read_text().splitlines()]
    return restored.state, [{**r, "stage": "sft", "sft_step": r.get("sft_step", r.get("step")), "step": 0}
                            for r in rows]


def save_sft_cache(args: DemoArgs, state, sft_cfg: SFTConfig, log: list[dict]) -> None:
    if not args.sft_cache:
        return
    d = Path(args.sft_cache) / _sft_key(args.spec)
    with Checkpointer(d / "ckpt", max_to_keep=1) as ckpt:
        ckpt.save(state, config=sft_cfg.rl_view())
    if (args.out / "tokenizer.json").exists():
        (d / "tokenizer.json").write_text((args.out / "tokenizer.json").read_text())
    (d / "sft_metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))


def main(argv: list[str] | None = None) -> dict:
    return run_demo(parse_args(argv))


def run_or_reuse(argv: list[str], *, reuse: bool = True) -> tuple[dict, list[dict], bool]:
    """Run ``argv`` (``main``), or with ``reuse`` read back a finished run of the same spec in its ``--out``
    (``demo_cli.finished``). Returns (summary, the rows of its metrics.jsonl, whether it was read back)."""
    args = parse_args(argv)
    reused = reuse and finished(args)
    summary = json.loads((args.out / "summary.json").read_text()) if reused else run_demo(args)
    rows = [json.loads(x) for x in (args.out / "metrics.jsonl").read_text().splitlines()]
    return summary, rows, reused


def run_demo(args: DemoArgs) -> dict:
    """The whole run of ``args.spec`` into ``args.out``; returns the summary (also ``summary.json``)."""
    spec, out = args.spec, args.out
    tpl = spec.template()
    t_start = time.perf_counter()
    timings: dict[str, float] = {}

    regime = get_regime(spec.data.regime)
    pps, steps = spec.schedule.problems_per_step, spec.schedule.rl_steps
    train, heldout = make_splits(spec.seed, spec.data.sft_traces + max(steps * pps, 1), spec.data.n_eval, regime.toy)
    sft_problems, rl_problems = train[: spec.data.sft_traces], train[spec.data.sft_traces:]
    sft_cfg, rl_cfg = spec.sft, spec.rl
    sb = spec.sandbox

    with open_pool(sb.backend, workers=sb.workers, limits=sb.limits, ray_address=sb.ray_address) as pool:
        reward_fn = spec.reward_fn(pool).batch
        t = time.perf_counter()
        traces = build_traces(sft_problems, pool=pool, cfg=regime.traces, template_cfg=tpl, seed=spec.seed)
        records = traces + copy_drills(spec.data.copy_drills, seed=spec.seed)
        tok = make_tokenizer(spec, args.resume, records, tpl, out)
        examples = render_records(records, tok, tpl)
        timings["traces_s"] = time.perf_counter() - t

        mcfg = build_model(spec, tok.vocab_size)
        graphdef, params = split_policy(Qwen3(mcfg, rngs=nnx.Rngs(spec.seed)))
        mesh = None
        if spec.learner.devices:  # disjoint: the learner's mesh on the first devices, the engines after them
            mesh = make_mesh(MeshConfig(), jax.local_devices()[: spec.learner.devices])
            params = global_params(params, mesh)
        max_seq_len = spec.seq_len(max(len(e[0]) for e in examples) + 64)  # + the largest budget

        def make_rollout(params):
            engines = make_engines(graphdef, params, mcfg, spec, max_seq_len, tok)
            rl_engines = engines
            if spec.rollout.scripted_policy:  # held-out evaluation still samples the trained policy
                script = mixed_script(rl_problems, tok, tpl)
                rl_engines = [ScriptedPolicy(e, script) for e in engines]
            return Rollout(rl_engines, pool, tok, spec.rollout_config(tpl)), engines

        parts = Parts(
            graphdef=graphdef, params=params, mesh=mesh, rl=rl_cfg, pad_id=tok.pad_id,
            learner=spec.learner_config(max_seq_len),
            make_rollout=make_rollout, pool=pool, tokenizer=tok, reward_fn=reward_fn,
            schedule=OneStage(problems_list=rl_problems, steps=steps, problems_per_step=pps,
                              sampled_token_budget=spec.schedule.sampled_token_budget),
            sft=SFTPart(cfg=sft_cfg, shards=1, load_shard=lambda s: examples, ckpt_every=spec.checkpoint.every_sft,
                        cache_load=lambda: load_sft_cache(args, params, sft_cfg),
                        cache_save=lambda st, rows: save_sft_cache(args, st, sft_cfg, rows)),
            eval_problems=heldout, eval_cfg=spec.eval_config(tpl), async_rl=spec.async_rl,
            dynamic_sampling=spec.rollout.dynamic_sampling, curriculum=spec.schedule.curriculum)
        rc = spec.run_config(out, resume=args.resume, allow_changed=args.allow_changed, sinks=("jsonl", *args.log),
                             show_progress=args.show_progress,
                             files={"config.json": json.dumps(mcfg.to_hf(), indent=2)})  # the policy's shape, HF-style
        try:
            res = run(parts, rc, abstract_train_state(params, rl_cfg))
        except ResumeError as e:
            raise SystemExit(str(e)) from None
        if res.resumed_from is not None:
            print(f"resume: from {json.dumps(res.resumed_from)}")
    timings.update(res.timings)
    timings["total_s"] = time.perf_counter() - t_start
    write_plots(res.rows, out)
    summary = summarize_run(spec, res.rows, timings)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print_summary(summary, out)
    return summary


def summarize_run(spec: RunSpec, rows: list[dict], timings: dict) -> dict:
    evals = [r for r in rows if r.get("heldout_acc") is not None]
    first, last = evals[0], evals[-1]
    sft_log = [r for r in rows if r.get("stage") == "sft"]
    return {
        "seed": spec.seed, "roc_mode": spec.rl.roc.mode.value, "rl_steps": spec.schedule.rl_steps,
        "sft_heldout_acc": first["heldout_acc"], "rl_heldout_acc": last["heldout_acc"],
        "delta_acc": last["heldout_acc"] - first["heldout_acc"],
        "sft_tool_error_rate": first["heldout_tool_error_rate"], "rl_tool_error_rate": last["heldout_tool_error_rate"],
        "sft_response_len": first["heldout_response_len"], "rl_response_len": last["heldout_response_len"],
        "sft_final_loss": sft_log[-1]["loss"] if sft_log else None,
        "train_tool_error_rate_pos_last": next((r["tool_error_rate_pos"] for r in reversed(rows)
                                                if r.get("tool_error_rate_pos") is not None), None),
        **timings,
    }


def print_summary(s: dict, out: Path) -> None:
    print("\n=== toy_tool_math summary ===")
    print(f"{'':28s}{'after SFT':>12s}{'after RL':>12s}")
    print(f"{'held-out accuracy':28s}{s['sft_heldout_acc']:12.3f}{s['rl_heldout_acc']:12.3f}")
    print(f"{'tool error rate':28s}{s['sft_tool_error_rate']:12.3f}{s['rl_tool_error_rate']:12.3f}")
    print(f"{'mean response tokens':28s}{s['sft_response_len']:12.1f}{s['rl_response_len']:12.1f}")
    print(f"time: traces {s['traces_s']:.0f}s, SFT {s.get('sft_s', 0):.0f}s, RL {s.get('rl_s', 0):.0f}s, "
          f"total {s['total_s']:.0f}s" + (" (this process: resumed after SFT)" if "sft_s" not in s else ""))
    print(f"outputs: {out}/metrics.jsonl, {out}/metrics.png, {out}/summary.json, {out}/checkpoint")
