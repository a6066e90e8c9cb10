"""The rStar2-Agent recipe: non-reasoning SFT -> RL stage 1 (8K) -> stage 2 (12K) -> filter -> stage 3.

Full scale: ``python experiments/rstar2_recipe.py --config experiments/configs/rstar2_14b.json``
(local Qwen3-14B-Base directory, chat SFT data and RL problems given by path in the config).
``--dry-run`` runs every stage and every transition with a tiny random policy on CPU (thresholds
shrunk: see ``RecipeConfig.dry_run``; the trainer on one device, the engines over every local device,
tensor-parallel 2 on an even device count: 4 x 2 with ``XLA_FLAGS=--xla_force_host_platform_device_count=8``). Engines: ``--engines`` per process x ``--devices-per-engine`` (the TP
degree), laid over the local devices; the run prints the placement table and a ``placement:`` line. A random policy never earns a reward, so RoC would drop every
group and no update would run: in the dry-run the RL rollouts come from a ``ScriptedPolicy`` over the
real paged engines (even samples answer right, odd ones wrong, after a real tool call), so every RL
stage updates for real. The same learner, rollout service, engines, dispatcher, sandbox and verifier
as the toy demo (one long-lived ``Rollout`` and ``Learner`` for the whole run). Checkpoints (orbax,
atomic) every ``ckpt_every`` steps and at every transition; ``--resume`` continues from the latest one.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import jax
from flax import nnx
from tqdm.auto import tqdm

from rstar2_jax import distributed
from rstar2_jax.config import ModelConfig
from rstar2_jax.data.chat import load_chat_jsonl, render_records
from rstar2_jax.data.datasets import load_dataset, write_jsonl
from rstar2_jax.eval import EvalConfig, evaluate
from rstar2_jax.model import Qwen3, make_mesh, split_policy
from rstar2_jax.recipe import STAGES, RecipeConfig, filter_unsolved, next_stage
from rstar2_jax.rewards import RewardFn
from rstar2_jax.rl import OptimConfig, RLConfig, RocConfig
from rstar2_jax.rl.checkpoint import Checkpointer, abstract_train_state
from rstar2_jax.rl.train_step import init_train_state, reset_optimizer
from rstar2_jax.learner import Learner, LearnerConfig
from rstar2_jax.loop import rl_step
from rstar2_jax.rollout.dispatcher import RolloutConfig
from rstar2_jax.rollout.scripted import ScriptedPolicy
from rstar2_jax.rollout.service import Rollout
from rstar2_jax.rollout.weight_sync import WeightSync
from rstar2_jax.rollout.template import TOOL_NAME, TemplateConfig, render_prompt
from rstar2_jax.sampling import EngineConfig, PagedEngine, Temperature
from rstar2_jax.sampling.placement import plan_placement
from rstar2_jax.sandbox import SandboxLimits
from rstar2_jax.sandbox.backend import open_pool
from rstar2_jax.sft import SFTConfig, train_sft
from rstar2_jax.tokenizer import ByteTokenizer, HFTokenizer
from rstar2_jax.utils.compiles import CompileCounter
from rstar2_jax.utils.metrics import MetricsLogger, plot_metrics


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="JSON RecipeConfig (see experiments/configs/)")
    ap.add_argument("--dry-run", action="store_true", help="tiny random policy on CPU, every stage")
    ap.add_argument("--out", default="runs/rstar2_recipe")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--engines", type=int, default=None, help="engines per process (default: the config's; "
                    "null there = local devices // devices-per-engine)")
    ap.add_argument("--devices-per-engine", type=int, default=None, help="tensor-parallel degree of each engine")
    ap.add_argument("--engine-weight-dtype", default=None, help="e.g. bfloat16: the engines' copy of the weights")
    ap.add_argument("--sandbox-backend", default=None, choices=("local", "ray"),
                    help="override the config's sandbox_backend (ray: one sandbox actor per Ray node)")
    ap.add_argument("--ray-address", default=None, help="override the config's ray_address")
    args = ap.parse_args(argv)
    if not args.dry_run and not args.config:
        ap.error("give --config PATH (full scale) or --dry-run")
    return args


def setup_dry_run(cfg: RecipeConfig, out: Path, pool, seed: int):
    """Tiny random policy + byte tokenizer; toy SFT traces written as chat JSONL; toy RL problems."""
    from rstar2_jax.data.sft_traces import build_traces
    from rstar2_jax.data.toy import make_splits

    tok = ByteTokenizer()
    tpl = TemplateConfig.toy(report_exec_time=False)
    train, _ = make_splits(seed, 24, 4)
    write_jsonl(out / "dry_sft.jsonl", build_traces(train[:6], pool=pool, template_cfg=tpl, seed=seed))
    write_jsonl(out / "dry_rl.jsonl", [p.to_record() for p in train[6:]])
    mcfg = ModelConfig.tiny(vocab_size=tok.vocab_size)
    graphdef, params = split_policy(Qwen3(mcfg, rngs=nnx.Rngs(seed)))
    return graphdef, params, mcfg, tok, tpl, str(out / "dry_sft.jsonl"), str(out / "dry_rl.jsonl")


def dry_run_script(problems, tok, tpl: TemplateConfig):
    """The dry-run's scripted policy: turn 0 calls the tool with the problem's code; turn 1 boxes
    the gold (even samples) or gold + 1 (odd samples), so every group is mixed."""
    by_prompt = {tuple(tok.encode(render_prompt(p.problem, tpl))): p for p in problems}

    def script(prompt: tuple[int, ...], child: int, turn: int) -> list[int]:
        p = by_prompt[prompt]
        if turn == 0:
            call = json.dumps({"name": TOOL_NAME, "arguments": {"code": p.meta["code"], "input": ""}})
            return tok.encode(f"Use python.\n<tool_call>{call}</tool_call>")
        value = p.answer if child % 2 == 0 else str(int(p.answer) + 1)
        return tok.encode(f"Done.</reason><answer>\\boxed{{{value}}}</answer><|im_end|>")

    return script


def setup_full(cfg: RecipeConfig, mesh):
    from rstar2_jax.model.hf_io import load_hf

    if not cfg.model_path:
        raise SystemExit("config: model_path (a local HF directory) is required")
    graphdef, params, mcfg = load_hf(cfg.model_path, mesh=mesh, dtype=cfg.dtype)
    tpl = TemplateConfig() if cfg.template == "full" else TemplateConfig.toy()
    return graphdef, params, mcfg, HFTokenizer(cfg.model_path), tpl, cfg.sft_data, cfg.rl_data


def rl_config(cfg: RecipeConfig) -> RLConfig:
    return RLConfig(roc=RocConfig(keep_per_group=cfg.group, mode=cfg.roc_mode),
                    optim=OptimConfig(lr=cfg.rl_lr, warmup_steps=cfg.warmup_steps))


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    setup = distributed.initialize()  # a no-op for one process
    overrides = {k: v for k, v in (("engines", args.engines), ("devices_per_engine", args.devices_per_engine),
                                   ("engine_weight_dtype", args.engine_weight_dtype)) if v is not None}
    if args.dry_run and args.devices_per_engine is None and jax.local_device_count() % 2 == 0:
        overrides["devices_per_engine"] = 2  # the dry-run's engines are tensor-parallel where they can be
    cfg = RecipeConfig.dry_run(**overrides) if args.dry_run else RecipeConfig.from_json(args.config, **overrides)
    if setup.multi:
        raise SystemExit("rstar2_recipe.py runs in one process (its checkpoints and evaluation are single-process); "
                         "multi-process rollouts and updates: see docs/multihost.md")
    backend = {k: v for k, v in (("sandbox_backend", args.sandbox_backend), ("ray_address", args.ray_address))
               if v is not None}
    cfg = dataclasses.replace(cfg, **backend) if backend else cfg
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "recipe_config.json").write_text(json.dumps(cfg.to_json(), indent=2, default=str))
    show = not args.no_progress
    mesh = None if args.dry_run else make_mesh(cfg.mesh)
    limits = SandboxLimits(wall_s=5.0, cpu_s=5.0, memory_mb=2048, preload=("numpy", "sympy", "rstar2_jax.rewards.worker"))
    with open_pool(cfg.sandbox_backend, workers=cfg.sandbox_workers, limits=limits,
                   ray_address=cfg.ray_address) as pool:
        if args.dry_run:
            graphdef, params, mcfg, tok, tpl, sft_path, rl_path = setup_dry_run(cfg, out, pool, args.seed)
        else:
            graphdef, params, mcfg, tok, tpl, sft_path, rl_path = setup_full(cfg, mesh)
        reward_fn = RewardFn(pool=pool).batch
        problems = load_dataset(rl_path)
        by_id = {p.id: p for p in problems}
        rl_cfg = rl_config(cfg)
        ckpt = Checkpointer(out / "checkpoint", max_to_keep=2)
        restored = ckpt.restore(abstract_train_state(params, rl_cfg, mesh)) if args.resume else None
        cur = restored.data_cursor if restored else {"stage": "sft", "stage_step": 0, "global_step": 0,
                                                     "problem_cursor": 0, "trunc_history": [], "stage3_ids": None}
        if args.resume:
            print(f"resume: {'from ' + json.dumps({k: cur[k] for k in ('stage', 'stage_step')}) if restored else 'fresh'}")
        logger = MetricsLogger(out / "metrics.jsonl", resume=restored is not None, keep_until_step=cur["global_step"])
        state = restored.state if restored else None
        visited: list[str] = []

        def save(st) -> None:
            cur["save_id"] = cur.get("save_id", 0) + 1  # increasing across phases (SFT and RL steps restart)
            ckpt.save(st, data_cursor=cur, config=rl_cfg, step=cur["save_id"])

        # ---- non-reasoning SFT ---------------------------------------------------------------------
        if cur["stage"] == "sft":
            visited.append("sft")
            examples = render_records(load_chat_jsonl(sft_path, template_cfg=tpl), tok, tpl)
            scfg = SFTConfig(seq_len=cfg.sft_seq_len, batch_size=cfg.sft_batch, epochs=cfg.sft_epochs,
                             optim=OptimConfig(lr=cfg.sft_lr, warmup_steps=min(cfg.warmup_steps, 20)))

            def on_state(i: int, st) -> None:
                if i % cfg.ckpt_every == 0:
                    cur["save_id"] = cur.get("save_id", 0) + 1
                    ckpt.save(st, data_cursor={**cur, "stage_step": i}, config=rl_cfg, step=cur["save_id"])

            state = train_sft(graphdef, params, examples, scfg, pad_id=tok.pad_id, mesh=mesh, seed=args.seed,
                              state=state, show_progress=show, on_state=on_state,
                              on_step=lambda i, m: logger.log({"stage": "sft", "sft_step": i, "step": 0, **m}))
            state = init_train_state(state.params, rl_cfg, args.seed, mesh=mesh)  # RL optimizer from zero
            cur.update(stage="rl_stage1", stage_step=0)
            save(state)

        # the longest rendered prompt (system prompt and template included) + slack
        max_prompt = max(len(tok.encode(render_prompt(p.problem, tpl))) for p in problems) + 64
        ecfg = EngineConfig(num_slots=cfg.slots, page_size=16, max_seq_len=max_prompt + cfg.stage2_budget,
                            kv_memory_bytes=int(cfg.kv_memory_gb * 2**30), prefill_chunk=128)
        placement = plan_placement(cfg.placement(), mcfg)
        print(placement.table())
        print(placement.line())
        placed = WeightSync(placement.layouts).place(state.params)  # on device, from the trainer's layout
        engines = [PagedEngine(graphdef, p, mcfg, ecfg, decode_fn=tok.decode, layout=lay)
                   for p, lay in zip(placed, placement.layouts)]
        for e in engines:  # each engine's executables are tied to its devices: compile them all once, now
            e.warmup()
        if args.dry_run:  # see the module docstring: a random policy earns no reward
            script = dry_run_script(problems, tok, tpl)
            engines = [ScriptedPolicy(e, script) for e in engines]
        # The run's two long-lived owners (every stage): the rollout service and the learner. The
        # learner's rows fit the longest stage, so its update compiles for one shape.
        rollout = Rollout(engines, pool, tok, RolloutConfig(
            n_samples=cfg.samples_per_problem, budget=cfg.stage1_budget, template=tpl,
            sampler=Temperature(temperature=cfg.temperature)))
        learner = Learner(graphdef, state, LearnerConfig(rl=rl_cfg, seq_len=max_prompt + cfg.stage2_budget,
                                                         rows=cfg.problems_per_step * cfg.group),
                          pad_id=tok.pad_id, mesh=mesh)
        rollout.sync(learner.params)
        rollout.load_state(cur.get("rollout"))  # resume: the dispatcher's length history as it was
        compiles = CompileCounter()

        bar = tqdm(desc="recipe", disable=not show)
        while cur["stage"] != "done":
            stage = cur["stage"]
            if not visited or visited[-1] != stage:
                visited.append(stage)
            if stage == "filter":
                pool_ids = [p.id for p in problems][: cfg.filter_pool]
                rows, _ = evaluate([by_id[i] for i in pool_ids], engines, pool, tok, reward_fn,
                                   EvalConfig.sampled(cfg.filter_k, cfg.temperature, budget=cfg.stage2_budget,
                                                      template=tpl), seed=args.seed, show_progress=show)
                kept = filter_unsolved(pool_ids, [sum(r["correct"]) for r in rows], cfg.filter_k)
                logger.log({"stage": "filter", "step": cur["global_step"], "filter_pool": len(pool_ids),
                            "filter_kept": len(kept)})
                learner.state = reset_optimizer(learner.state, rl_cfg)  # stage 3 starts with fresh AdamW moments
                cur.update(stage="rl_stage3" if kept else "done", stage_step=0, stage3_ids=kept, problem_cursor=0)
                save(learner.state)
                continue
            pool_problems = problems if stage != "rl_stage3" else [by_id[i] for i in cur["stage3_ids"]]
            budget = cfg.stage1_budget if stage == "rl_stage1" else cfg.stage2_budget
            n = cfg.problems_per_step
            batch = [pool_problems[(cur["problem_cursor"] + j) % len(pool_problems)] for j in range(n)]
            compiles.take()  # this step's compilations only
            m, _ = rl_step(rollout, learner, reward_fn, batch, seed=args.seed * 1_000_003 + cur["global_step"],
                           budget=budget, compiles=compiles)
            cur["problem_cursor"] += n
            cur["stage_step"] += 1
            cur["global_step"] += 1
            if stage == "rl_stage1":
                cur["trunc_history"] = cur["trunc_history"] + [m["truncation_rate"]]
            logger.log({"stage": stage, "step": cur["global_step"], "stage_step": cur["stage_step"], **m})
            new = next_stage(stage, stage_step=cur["stage_step"], cfg=cfg, trunc_history=cur["trunc_history"])
            if new != stage:
                cur.update(stage=new, stage_step=0, problem_cursor=0 if new == "filter" else cur["problem_cursor"])
            if new != stage or cur["global_step"] % cfg.ckpt_every == 0:
                cur["rollout"] = rollout.state()
                save(learner.state)
            bar.update(1)
            bar.set_postfix(stage=stage, reward=f"{m['reward']:.2f}", kept=m["n_kept"])
        bar.close()
        ckpt.close()
    plot_metrics([r for r in logger.rows if r.get("stage", "").startswith("rl")], out / "metrics.png")
    rl_rows = [r for r in logger.rows if r.get("stage", "").startswith("rl") and "reward" in r]
    summary = {"stages": visited, "global_steps": cur["global_step"],
               "n_kept_per_stage": {s: [r["n_kept"] for r in rl_rows if r["stage"] == s] for s in STAGES[1:-1]},
               "compiles_per_step": [r.get("compiles") for r in rl_rows],
               "stage3_problems": None if cur["stage3_ids"] is None else len(cur["stage3_ids"]),
               "steps_per_stage": {s: sum(1 for r in logger.rows if r.get("stage") == s and "reward" in r)
                                   for s in STAGES[1:-1]}}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print("recipe:", json.dumps(summary))
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
