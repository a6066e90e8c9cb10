"""A Qwen3-0.6B-shaped run on CPU: the real tokenizer, template, engines and sandbox at real shapes.

Policy: Qwen3-0.6B's config (``model.presets.PRESETS``: 28 layers, hidden 1024, 16/8 heads of 128, MLP 3072,
vocabulary 151,936, tied), random weights, params and compute in bf16 (fp32 would need ~20 GB here:
params, AdamW moments, the fp32 gradient accumulator, the layer-stack copies and the engine's copy;
``python -m rstar2_jax.run.plan`` shows the split). Tokenizer: Qwen3's, built offline
(``rstar2_jax.text.qwen``). Template: ``TemplateConfig.release()`` on real AIME24 problems
(``--data``; the shortest prompts, ~455 tokens). Through the recipe's driver (``run.driver.run``):
one SFT step on one chat record (the problem, a real tool call, the sandbox's answer, the boxed
answer), then two RL steps of ``--problems`` problems x 2 samples, rolled out by a scripted policy
over a real ``PagedEngine`` (the recipe dry-run's arrangement: the engine decodes exactly the script's
token counts; turn 0 is a real tool call that the sandbox runs, turn 1 boxes the gold answer for even
samples and a wrong one for odd ones), so RoC keeps mixed groups and every step updates. The update,
the log-prob recompute, RoC, the verifier and the weight sync are the real ones.

Reports the process's peak RSS (VmHWM; per phase too, reset between phases through
``/proc/self/clear_refs`` where the kernel allows), the time of each stage (SFT; per RL step rollout,
reward, train, sync), XLA compile time (``jax.monitoring``), tokens/s (trained tokens per second of
the update, and the engine's), and the memory plan's prediction (``rstar2_jax.run.plan`` with this run's
shapes, the measured baseline RSS as its runtime allowance) against the measured peak. Asserts a
finite loss, n_kept > 0 and 0 compilations on the second RL step.

    python experiments/bench_real_shapes.py --data ../shared/data/aime24.jsonl   # 28 layers: 18.9 GB RSS, 8 min
    python experiments/bench_real_shapes.py --data ... --layers 2                # the slow test's slice: 6.3 GB, 8 min

Measured (docs/design.md §6.2, 2 cores, alone): 28 layers peak RSS 18.85 GB, RL steps ~150 s, 459 s
in all; ``--trace`` puts the peak in the update and shows the step-0 checkpoint's host staging. Since
``rstar2_jax.run.plan_xla`` split the update's transients (the vocabulary tables' extra gradient buffers
with bf16 params, the unrolled stack's activations) the plan is 0.82x the 28-layer peak and 0.87x the
2-layer slice's (6.31 GB).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0: ``echo 5 > /proc/self/clear_refs``)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def rss_trace(on: bool):
    """An :class:`RssTrace` over the driver's stages (``--trace``), or one that wraps nothing."""
    from rstar2_jax.train.learner import Learner
    from rstar2_jax.rl.checkpoint import Checkpointer
    from rstar2_jax.rollout.service import Rollout
    from rstar2_jax.run import driver
    from rstar2_jax.utils.rss import RssTrace

    trace = RssTrace()
    if on:
        for owner, name in [(driver, "train_sft_shards"), (driver, "init_train_state"), (driver._Run, "start_rl"),
                            (Learner, "__init__"), (Learner, "batch"), (Learner, "update"), (Checkpointer, "save"),
                            (Checkpointer, "wait"), (Rollout, "generate"), (Rollout, "sync")]:
            trace.wrap(owner, name)
    return trace


def sft_record(problem, answer_code: str, stdout: str) -> dict:
    """One chat record in the release layout: a tool call, its output, the boxed answer."""
    from rstar2_jax.rollout.template import TOOL_NAME

    return {"messages": [
        {"role": "user", "content": problem.problem},
        {"role": "assistant", "content": "<reason>Let me compute it.",
         "tool_calls": [{"type": "function", "function": {"name": TOOL_NAME,
                                                           "arguments": {"code": answer_code, "input": ""}}}]},
        {"role": "tool", "content": stdout},
        {"role": "assistant", "content": f"<reason>The tool gives it.</reason> <answer>\\boxed{{{problem.answer}}}</answer>"}]}


def release_script(problems, tok, tpl):
    """``script(prompt ids, child, turn) -> ids`` for the release template: turn 0 a real tool call
    (printing the gold answer + child % 2), turn 1 the boxed value; even children right, odd wrong."""
    from rstar2_jax.rollout.template import TOOL_NAME, render_prompt

    by_prompt = {tuple(tok.encode(render_prompt(p.problem, tpl))): p for p in problems}

    def script(prompt, child, turn):
        p = by_prompt[tuple(prompt)]
        value = int(p.answer) + child % 2
        if turn == 0:
            call = json.dumps({"name": TOOL_NAME, "arguments": {"code": f"print({int(p.answer)} + {child % 2})",
                                                                "input": ""}})
            return tok.encode(f"Let me compute it.\n<tool_call>\n{call}\n</tool_call><|im_end|>")
        return tok.encode(f"The tool gives {value}.</reason> <answer>\\boxed{{{value}}}</answer><|im_end|>")

    return script


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data" / "aime24.jsonl"))
    ap.add_argument("--model", default="Qwen3-0.6B", help="a model.presets.PRESETS name, or 'tiny' (a smoke test)")
    ap.add_argument("--layers", type=int, default=None, help="keep the first N layers (default: all)")
    ap.add_argument("--dtype", default="bfloat16", help="params and compute")
    ap.add_argument("--scan", action="store_true", help="scan the layer stack (ModelConfig's default; costs two "
                    "transient copies of the layer weights: ~1.8 GB at 0.6B in bf16); default here: unrolled")
    ap.add_argument("--problems", type=int, default=1, help="RL problems per step (2 samples each, G = 2)")
    ap.add_argument("--budget", type=int, default=128, help="response tokens per trajectory")
    ap.add_argument("--rl-steps", type=int, default=2)
    ap.add_argument("--kv-pages", type=int, default=None, help="the engine's K/V pool in pages of 16 (default: "
                    "exactly the slots' longest sequences, + the null page)")
    ap.add_argument("--out", default=None, help="run folder (default: a temporary one)")
    ap.add_argument("--tokenizer-dir", default=None, help="default: the qwen_tokenizer cache")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--attention", default="blockwise", help="ModelConfig.attention_impl (pallas_gpu: the GPU kernel)")
    ap.add_argument("--trace", action="store_true", help="print RSS before / peak during / after each stage "
                    "of the run (rstar2_jax.utils.rss: SFT, the RL state, the engines, the checkpoints, rollouts, updates)")
    ap.add_argument("--platform", default="cpu", help="JAX_PLATFORMS for this run ('' = JAX's choice; gpu_check: gpu)")
    args = ap.parse_args(argv)
    os.environ["JAX_PLATFORMS"] = args.platform  # before JAX is imported
    if not Path(args.data).is_file():
        ap.error(f"--data: AIME24 JSONL not found: {args.data}")

    import jax
    import numpy as np
    from flax import nnx

    from rstar2_jax import distributed
    from rstar2_jax.data.chat import render_records
    from rstar2_jax.data.datasets import load_dataset
    from rstar2_jax.train.learner import LearnerConfig
    from rstar2_jax.model import Qwen3, make_mesh, split_policy
    from rstar2_jax.model.config import MeshConfig, ModelConfig
    from rstar2_jax.model.presets import PRESETS
    from rstar2_jax.text.qwen import qwen3_tokenizer
    from rstar2_jax.rewards import RewardFn
    from rstar2_jax.rl import OptimConfig, RLConfig, RocConfig
    from rstar2_jax.rl.checkpoint import abstract_train_state
    from rstar2_jax.rollout.dispatcher import RolloutConfig
    from rstar2_jax.rollout.service import Rollout
    from rstar2_jax.rollout.template import TemplateConfig, render_prompt
    from rstar2_jax.run.driver import OneStage, Parts, RunConfig, SFTPart, rl_rows, run
    from rstar2_jax.run.plan import GB, PlanInput, make_plan
    from rstar2_jax.sampling import EngineConfig, Temperature, kv_cache
    from rstar2_jax.deploy.placement import PlacementConfig, place_engines, plan_placement
    from rstar2_jax.testing.scripted import ScriptedPolicy
    from rstar2_jax.sandbox import CodeRequest, SandboxLimits
    from rstar2_jax.sandbox.backend import open_pool
    from rstar2_jax.train.sft import SFTConfig
    from rstar2_jax.utils.bench import Metric, report
    from rstar2_jax.utils.rss import rss_gb

    compile_s = [0.0]

    def on_event(event: str, duration_s: float, **_) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            compile_s[0] += duration_s
    jax.monitoring.register_event_duration_secs_listener(on_event)

    t_start = time.perf_counter()
    tok = qwen3_tokenizer(args.tokenizer_dir)
    tpl = TemplateConfig.release()
    problems = load_dataset(args.data)
    problems = sorted(problems, key=lambda p: len(tok.encode(render_prompt(p.problem, tpl))))  # shortest first
    rl_problems = problems[:args.problems * args.rl_steps]
    max_prompt = max(len(tok.encode(render_prompt(p.problem, tpl))) for p in rl_problems)
    seq_len = max_prompt + args.budget
    if args.model == "tiny":
        base = ModelConfig.tiny(vocab_size=151936)
    else:
        base = PRESETS[args.model]
    mcfg = dataclasses.replace(base, num_layers=args.layers or base.num_layers, dtype=args.dtype,
                               param_dtype=args.dtype, max_position_embeddings=max(4096, seq_len),
                               scan_layers=args.scan, attention_impl=args.attention)
    mesh = make_mesh(MeshConfig(data=1, fsdp=-1, tensor=1), jax.devices()[:1])
    out = Path(args.out or tempfile.mkdtemp(prefix="bench_real_shapes_"))
    limits = SandboxLimits(wall_s=5.0, cpu_s=5.0, memory_mb=2048, preload=("numpy", "sympy", "rstar2_jax.rewards.worker"))
    results: dict = {"model": args.model, "layers": mcfg.num_layers, "dtype": args.dtype, "scan_layers": args.scan,
                     "attention": args.attention, "device": str(jax.devices()[0].device_kind)}
    with open_pool("local", workers=1, limits=limits) as pool:
        # the SFT record's tool output comes from the sandbox itself
        code = f"print({int(problems[0].answer)})"
        stdout = pool.run(CodeRequest(code=code)).stdout
        record = sft_record(problems[0], code, stdout)
        examples = render_records([record], tok, tpl)
        sft_len = -(-len(examples[0][0]) // 64) * 64
        reward_fn = RewardFn(pool=pool).batch
        baseline_gb = rss_gb("VmRSS")  # before the model: interpreter, JAX, tokenizer, pool client
        t0 = time.perf_counter()
        graphdef, params = split_policy(Qwen3(mcfg, rngs=nnx.Rngs(0)))
        params = distributed.global_params(params, mesh)
        jax.block_until_ready(params)
        results["init_s"] = time.perf_counter() - t0
        results["init_rss_gb"] = rss_gb("VmRSS")
        rl_cfg = RLConfig(roc=RocConfig(keep_per_group=2), optim=OptimConfig(lr=1e-6, warmup_steps=0))
        max_seq = seq_len + 64
        pages = args.kv_pages or 2 * args.problems * -(-max_seq // 16) + 1
        kv_bytes = pages * kv_cache.page_bytes(mcfg, 16)
        ecfg = EngineConfig(num_slots=2 * args.problems, page_size=16, max_seq_len=max_seq, num_pages=pages,
                            prefill_chunk=128)
        placement_cfg = PlacementConfig(devices_per_engine=1, engines_per_process=1)
        phase_peaks: dict[str, float] = {}
        resets = [_reset_peak()]

        def make_rollout(params):
            phase_peaks["sft"] = rss_gb("VmHWM")  # SFT's peak (the driver builds the rollout right after)
            print(f"SFT phase: peak RSS {phase_peaks['sft']:.2f} GB", flush=True)
            resets.append(_reset_peak())
            placement = plan_placement(placement_cfg, mcfg, jax.devices()[:1])
            engines = place_engines(placement, graphdef, params, mcfg, ecfg, tok.decode)
            for e in engines:
                e.warmup()
            script = release_script(rl_problems, tok, tpl)
            engines = [ScriptedPolicy(e, script) for e in engines]
            return Rollout(engines, pool, tok, RolloutConfig(n_samples=2, budget=args.budget, template=tpl,
                                                             sampler=Temperature(temperature=1.0))), engines

        parts = Parts(
            graphdef=graphdef, params=params, mesh=mesh, rl=rl_cfg, pad_id=tok.pad_id,
            learner=LearnerConfig(rl=rl_cfg, seq_len=seq_len, seq_bucket=64, rows=2 * args.problems),
            make_rollout=make_rollout, pool=pool, tokenizer=tok, reward_fn=reward_fn,
            schedule=OneStage(problems_list=rl_problems, steps=args.rl_steps, problems_per_step=args.problems),
            sft=SFTPart(cfg=SFTConfig(seq_len=sft_len, batch_size=1, epochs=1.0, logprob_chunk_size=256,
                                      optim=OptimConfig(lr=1e-5, warmup_steps=0)),
                        shards=1, load_shard=lambda s: examples, ckpt_every=10**9))
        rc = RunConfig(out=out, seed=0, ckpt_every=10**9, eval_every=None, show_progress=False)
        trace = rss_trace(args.trace)
        t0 = time.perf_counter()
        with trace:
            res = run(parts, rc, abstract_train_state(params, rl_cfg, mesh))
        if args.trace:
            print(trace.table(), flush=True)
            results["rss_trace"] = [dataclasses.asdict(c) for c in trace.calls]
        results["run_s"] = time.perf_counter() - t0
        phase_peaks["rl"] = rss_gb("VmHWM")
        dev_stats = jax.devices()[0].memory_stats() or {}
    rows = rl_rows(res.rows)
    sft_rows = [r for r in res.rows if r.get("stage") == "sft"]
    prompt_lens = [len(tok.encode(render_prompt(p.problem, tpl))) for p in rl_problems]
    rl = []
    for i, row in enumerate(rows):
        r = {k: row[k] for k in ("train/loss", "n_kept", "n_sampled", "compiles", "time_rollout_s", "time_reward_s",
                                 "time_train_s", "time_sync_s", "step_s", "tokens_per_s", "reward", "response_len",
                                 "train/pad_frac") if k in row}
        # positions the update trains on: the kept trajectories (prompt + response), ~ n_kept x the mean
        mean_prompt = float(np.mean(prompt_lens[i * args.problems:(i + 1) * args.problems]))
        r["train_positions"] = row["n_kept"] * (mean_prompt + row["response_len"])
        r["train_positions_per_s"] = r["train_positions"] / row["time_train_s"] if row.get("time_train_s") else float("nan")
        rl.append(r)
    results.update(
        total_s=time.perf_counter() - t_start, compile_s=compile_s[0], baseline_rss_gb=baseline_gb,
        peak_rss_gb=max(phase_peaks.values()), phase_peak_rss_gb=phase_peaks, peak_reset_ok=all(resets),
        sft_s=res.timings.get("sft_s"), sft_loss=sft_rows[-1]["loss"] if sft_rows else float("nan"),
        sft_tokens=len(examples[0][0]), max_prompt=max_prompt, rl=rl)
    # the plan for this run: one CPU device, the trainer and the engine in one process
    t_rl = -(-seq_len // 64) * 64
    inp = PlanInput(model=mcfg, devices=1, devices_per_process=1, mesh=(1, 1, 1), rl_rows=2 * args.problems,
                    rl_micro_rows=None, rl_seq_len=t_rl, rl_chunk=rl_cfg.logprob_chunk_size, sft_rows=1,
                    sft_seq_len=sft_len, sft_chunk=256, engines_per_process=1, devices_per_engine=1,
                    engine_weight_dtype=args.dtype, kv_bytes_per_engine=kv_bytes,
                    runtime_bytes=0 if "peak_bytes_in_use" in dev_stats else int(baseline_gb * GB))
    plan = make_plan(inp)
    print(plan.table())
    results["plan_gb"] = {p: plan.total(p) / GB for p in plan.phases}
    results["plan_peak_gb"] = plan.peak / GB
    # an accelerator reports its own peak; on CPU the device is the process (its peak RSS)
    results["device_peak_gb"] = dev_stats.get("peak_bytes_in_use", float("nan")) / GB
    measured = results["device_peak_gb"] if "peak_bytes_in_use" in dev_stats else results["peak_rss_gb"]
    ratio = results["plan_peak_gb"] / measured
    print(json.dumps(results, indent=1, default=float))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=float))
    rl = results["rl"]
    last = rl[-1] if rl else {}
    finite = bool(rl) and all(math.isfinite(r.get("train/loss", float("nan"))) for r in rl) and math.isfinite(
        results["sft_loss"])
    print(f"real shapes ({args.model}, {mcfg.num_layers} layers, {args.dtype}, {args.attention}, "
          f"{results['device']}): device peak {results['device_peak_gb']:.2f} GB (nan: CPU), peak RSS {results['peak_rss_gb']:.2f} GB "
          f"(SFT {phase_peaks.get('sft', float('nan')):.2f}, RL {phase_peaks['rl']:.2f}; baseline {baseline_gb:.2f}), "
          f"plan {results['plan_peak_gb']:.2f} GB; SFT {results['sft_s']:.0f} s; RL steps "
          + ", ".join(f"{r.get('step_s', float('nan')):.0f} s (rollout {r.get('time_rollout_s', 0):.0f}, "
                      f"train {r.get('time_train_s', 0):.0f}, sync {r.get('time_sync_s', 0):.1f})" for r in rl)
          + f"; compile {results['compile_s']:.0f} s; total {results['total_s']:.0f} s")
    return report("real_shapes", [
        Metric("loss_finite", int(finite), "== 1", fmt="d"),
        Metric("n_kept_min", min((r.get("n_kept", 0) for r in rl), default=0), "> 0", fmt="d"),
        Metric("compiles_rl2", last.get("compiles", -1) if len(rl) >= 2 else -1, "== 0", fmt="d"),
        Metric("plan_over_measured", ratio, ">= 0.75"),
        Metric("plan_over_measured_max", ratio, "<= 1.25"),
        Metric("peak_rss_gb", results["peak_rss_gb"]),
        Metric("rl_step_s", last.get("step_s", float("nan")), fmt=".0f"),
        Metric("train_positions_per_s", last.get("train_positions_per_s", float("nan")), fmt=".1f"),
        Metric("engine_tokens_per_s", last.get("tokens_per_s", float("nan")), fmt=".1f"),
        Metric("compile_s", results["compile_s"], fmt=".0f"),
    ])


if __name__ == "__main__":
    sys.exit(main())
