"""The rStar2-Agent recipe's run: non-reasoning SFT -> RL stage 1 (8K) -> stage 2 (12K) -> filter -> stage 3.

Its command line is ``experiments/rstar2_recipe.py`` (:func:`main`); the schedule's decisions are
``run.recipe``. The run is configured by one ``run.spec.RunSpec``: ``--config FILE`` (JSON or YAML) and
dotted ``--set FIELD=VALUE`` overrides; the resolved spec is saved whole as ``<out>/run_spec.json``
and ``--resume`` reads it back as the base.

Full scale: ``python experiments/rstar2_recipe.py --config experiments/configs/rstar2_14b.json``
(local Qwen3-14B-Base directory, chat SFT data and RL problems given by path in the spec).
``--dry-run`` runs every stage and every transition with a tiny random policy on CPU (the preset
``recipe_dry_run``, thresholds shrunk; the trainer on one device, the engines over every local device,
tensor-parallel 2 on an even device count: 4 x 2 with ``XLA_FLAGS=--xla_force_host_platform_device_count=8``). Engines: ``--engines`` per process x ``--devices-per-engine`` (the TP
degree), laid over the local devices; the run prints the placement table and a ``placement:`` line. A random policy never earns a reward, so RoC would drop every
group and no update would run: in the dry-run the RL rollouts come from a ``ScriptedPolicy`` over the
real paged engines (even samples answer right, odd ones wrong, after a real tool call), so every RL
stage updates for real. The same learner, rollout service, engines, dispatcher, sandbox and verifier
as the toy demo (one long-lived ``Rollout`` and ``Learner`` for the whole run). Checkpoints (orbax,
atomic) every ``checkpoint.every`` steps and at every transition; ``--resume`` continues from the latest one.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import jax
from flax import nnx

from rstar2_jax import distributed
from rstar2_jax.data.chat import render_records, validate_record
from rstar2_jax.data.datasets import iter_jsonl, load_dataset, write_jsonl
from rstar2_jax.model import Qwen3, make_mesh, split_policy
from rstar2_jax.model.config import ModelConfig
from rstar2_jax.rl.checkpoint import abstract_train_state
from rstar2_jax.rollout.service import Rollout
from rstar2_jax.rollout.template import TemplateConfig, render_prompt
from rstar2_jax.run.driver import Parts, SFTPart, rl_rows, run, write_plots
from rstar2_jax.run.plan import check_spec
from rstar2_jax.run.recipe import STAGES, RecipeSchedule, trainer_devices
from rstar2_jax.run.resume import ResumeError
from rstar2_jax.run.scripted import mixed_script
from rstar2_jax.run.spec import SPEC_FILE, RunSpec, load_spec, parse_sets
from rstar2_jax.deploy.placement import place_engines, plan_placement
from rstar2_jax.testing.scripted import ScriptedPolicy
from rstar2_jax.sandbox.backend import open_pool
from rstar2_jax.sandbox.check import check_pool
from rstar2_jax.train.sft import shard_owner
from rstar2_jax.text.tokenizer import ByteTokenizer, HFTokenizer

# the run-control flags that set one spec field (each is also a --set)
FLAG_FIELDS = {"engines": "placement.engines_per_process", "devices_per_engine": "placement.devices_per_engine",
               "engine_weight_dtype": "placement.weight_dtype", "sandbox_backend": "sandbox.backend",
               "ray_address": "sandbox.ray_address", "seed": "seed"}
_PATHS = {"model.path": "directory", "data.sft_data": "file", "data.rl_data": "file", "data.eval_data": "file"}


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", help="a RunSpec file, JSON or YAML (see experiments/configs/)")
    ap.add_argument("--dry-run", action="store_true", help="tiny random policy on CPU, every stage (the preset "
                    "recipe_dry_run under --config and --set)")
    ap.add_argument("--out", default="runs/rstar2_recipe")
    ap.add_argument("--seed", type=int, default=None, help="the run's seed (spec field seed)")
    ap.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out, its "
                    "run_spec.json as the base; refuses (non-zero exit, nothing written) when none restores or the "
                    "spec differs")
    ap.add_argument("--allow-changed", default="", help="--resume: spec fields allowed to differ, dotted, "
                    "comma-separated (e.g. checkpoint.every,eval.every)")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="override one spec field (dotted, repeatable), e.g. --set schedule.stages.stage1_max_steps=1 "
                    "--set eval.every=null --set rl.loss.kind=gspo --set engine.page_size=32")
    ap.add_argument("--log", default="", help="extra metrics sinks besides metrics.jsonl: tensorboard, wandb")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--engines", type=int, default=None, help="engines per process (placement.engines_per_process; "
                    "null = local devices // devices-per-engine)")
    ap.add_argument("--devices-per-engine", type=int, default=None, help="tensor-parallel degree of each engine "
                    "(placement.devices_per_engine)")
    ap.add_argument("--engine-weight-dtype", default=None, help="e.g. bfloat16: the engines' copy of the weights "
                    "(placement.weight_dtype)")
    ap.add_argument("--sandbox-backend", default=None, choices=("local", "ray"),
                    help="sandbox.backend (ray: one sandbox actor per Ray node)")
    ap.add_argument("--ray-address", default=None, help="sandbox.ray_address")
    ap.add_argument("--allow-weaker-sandbox", action="store_true",
                    help="run even when the sandbox's isolation is weaker than the spec's sandbox.limits ask for "
                    "(namespaces, network, private_root, seccomp, uid_range): a warning instead of a config error")
    args = ap.parse_args(argv)
    if not args.dry_run and not args.config and not (args.resume and (Path(args.out) / SPEC_FILE).exists()):
        ap.error("give --config PATH (full scale) or --dry-run")
    args.allow_changed = tuple(x.strip() for x in args.allow_changed.split(",") if x.strip())
    args.log = tuple(x.strip() for x in args.log.split(",") if x.strip())
    return args


def write_once(path: Path, records) -> None:
    """Process 0 writes a dry-run data file unless present (a resume writes nothing); all wait."""
    if distributed.is_main_process() and not path.exists():
        write_jsonl(path, records)
    distributed.sync(f"write {path.name}")


def dry_run_data(out: Path, pool, seed: int) -> tuple[str, str, str]:
    """Toy SFT traces as chat JSONL, toy RL problems and held-out problems (files in ``out``)."""
    from rstar2_jax.data.sft_traces import build_traces
    from rstar2_jax.data.toy import make_splits

    tpl = TemplateConfig.toy(report_exec_time=False)
    train, heldout = make_splits(seed, 24, 4)
    paths = out / "dry_sft.jsonl", out / "dry_rl.jsonl", out / "dry_eval.jsonl"
    if not all(p.exists() for p in paths):
        out.mkdir(parents=True, exist_ok=True)
    write_once(paths[0], build_traces(train[:6], pool=pool, template_cfg=tpl, seed=seed)
               if not paths[0].exists() else [])
    write_once(paths[1], [p.to_record() for p in train[6:]])
    write_once(paths[2], [p.to_record() for p in heldout])
    return tuple(str(p) for p in paths)


def check_prompts(problems, path: str, tok, tpl, max_prompt_tokens: int | None) -> int:
    """The longest rendered prompt (system prompt and template included) of ``problems``; a config error
    naming the file, the record and its length when one is longer than the plan's ``max_prompt_tokens``
    (the spec's ``data.max_prompt_tokens``; None: no limit)."""
    longest = 0
    for i, p in enumerate(problems):
        n = len(tok.encode(render_prompt(p.problem, tpl)))
        if max_prompt_tokens is not None and n > max_prompt_tokens:
            raise SystemExit(f"config error: {path}: problem {i + 1} (id {p.id!r}) renders to a {n}-token prompt, "
                             f"more than data.max_prompt_tokens = {max_prompt_tokens} (the memory plan's assumption; raise "
                             f"it, re-plan with python -m rstar2_jax.run.plan, or drop the problem)")
        longest = max(longest, n)
    return longest


def check_paths(spec: RunSpec, where: str) -> None:
    """A full run's model and data: the model directory and the SFT and RL files given, every given path
    present; errors name the file and the dotted field."""
    values = {"model.path": spec.model.path, **{f"data.{k}": v for k, v in spec.data.paths().items()}}
    for key, kind in _PATHS.items():
        v = values[key]
        if v in (None, ""):
            if key != "data.eval_data":
                raise ValueError(f"{where}: {key} is required (a local {kind}; see experiments/configs/rstar2_14b.json)")
            continue
        p = Path(str(v)).expanduser()
        if not (p.is_dir() if kind == "directory" else p.is_file()):
            raise ValueError(f"{where}: {key}: {kind} not found: {p}")


def load_config(args) -> RunSpec:
    """The run's spec (``--config`` over the dry-run preset with ``--dry-run``; with ``--resume`` and no
    ``--config``, ``<out>/run_spec.json``), the flags and ``--set`` over it, every field checked before
    anything loads; a full run's paths and its memory plan too (errors name the field and the file)."""
    sets = {FLAG_FIELDS[k]: getattr(args, k) for k in FLAG_FIELDS if getattr(args, k) is not None}
    if args.dry_run and args.devices_per_engine is None and jax.local_device_count() % 2 == 0:
        sets["placement.devices_per_engine"] = 2  # the dry-run's engines are tensor-parallel where they can be
    try:
        sets.update(parse_sets(args.set))
        saved = Path(args.out) / SPEC_FILE
        path = saved if args.resume and args.config is None and saved.exists() else args.config
        spec = load_spec(path, sets=sets, default_preset="recipe_dry_run" if args.dry_run else None)
        where = str(path) if path is not None else "--set"
        if spec.schedule.stages is None:
            raise ValueError(f"{where}: schedule.stages is required (the recipe's RL stages)")
        if not args.dry_run:
            check_paths(spec, where)
            check_spec(spec, where=where)  # a run that cannot fit its devices is refused, with the table
    except ValueError as e:
        raise SystemExit(f"config error: {e}") from None
    return spec


def check_devices(spec: RunSpec) -> tuple[int, int, int]:
    """The mesh against the global device count (every process's), the SFT shards against the process
    count; errors name the numbers."""
    p = jax.process_count()
    split = spec.learner.devices
    try:
        trainer, _ = trainer_devices(split, jax.devices(), jax.local_devices())
    except ValueError as e:
        raise SystemExit(f"config error: {e}") from None
    n = len(trainer)
    try:
        shape = spec.mesh.shape(n)
    except ValueError as e:
        raise SystemExit(f"config error: mesh {dataclasses.asdict(spec.mesh)} does not fit this run's {n} "
                         f"{'devices' if split is None else 'learner devices'} ({p} processes x "
                         f"{jax.local_device_count() if split is None else split} local): {e}") from None
    shards = spec.data.sft_shards or p
    if shards % p:
        raise SystemExit(f"config error: data.sft_shards = {shards} is not a multiple of the {p} processes")
    if spec.schedule.problems_per_step % p:
        raise SystemExit(f"config error: schedule.problems_per_step = {spec.schedule.problems_per_step} does not "
                         f"split over {p} processes")
    return shape


def check_sandbox(pool, limits, *, allow_weaker: bool = False) -> str:
    """Every process's pool against the config's ``sandbox`` limits (all-gathered, so every process decides
    alike): process 0 prints the ``sandbox:`` mode line; isolation weaker than asked for on any process is
    a config error naming what is missing and why, unless ``allow_weaker`` (--allow-weaker-sandbox): a
    warning. Returns this process's mode."""
    mode, missing = check_pool(pool, limits, allow_weaker=True)
    everyone = distributed.allgather_json([mode, missing])
    many = len(everyone) > 1
    if distributed.is_main_process():
        modes = {m for m, _ in everyone}
        print("sandbox: " + (mode if len(modes) == 1 else
                             ", ".join(f"process {i}: {m}" for i, (m, _) in enumerate(everyone))), flush=True)
    weak = [(f"process {i}: " if many else "") + "; ".join(ms) for i, (_, ms) in enumerate(everyone) if ms]
    if weak and not allow_weaker:
        raise SystemExit(f"config error: the sandbox is weaker than the config's sandbox fields ask for: "
                         f"{' | '.join(weak)} (run on a host that allows it, relax those fields in the config, or "
                         f"accept it with --allow-weaker-sandbox)")
    if weak and distributed.is_main_process():
        print(f"warning: --allow-weaker-sandbox: running with a weaker sandbox than configured: {' | '.join(weak)}",
              file=sys.stderr, flush=True)
    return mode


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    distributed.initialize()  # every process runs this script; a no-op for one process
    spec = load_config(args)
    shape = check_devices(spec)
    trainer_devs, engine_devices = trainer_devices(spec.learner.devices, jax.devices(), jax.local_devices())
    try:  # the engines' placement over this process's devices, before anything loads (the HF config only)
        plan_placement(spec.placement, ModelConfig.tiny(vocab_size=ByteTokenizer().vocab_size) if args.dry_run
                       else ModelConfig.from_hf(spec.model.path), engine_devices)
    except ValueError as e:
        raise SystemExit(f"config error: {e} ({jax.process_count()} processes x {jax.local_device_count()} "
                         f"local devices)") from None
    out = Path(args.out)
    show = not args.no_progress and distributed.is_main_process()
    tpl = spec.template()
    sb = spec.sandbox
    with open_pool(sb.backend, workers=sb.workers, limits=sb.limits, ray_address=sb.ray_address) as pool:
        check_sandbox(pool, sb.limits, allow_weaker=args.allow_weaker_sandbox)  # before anything is written
        sft_path, rl_path, eval_path = dry_run_data(out, pool, spec.seed) if args.dry_run else (
            spec.data.sft_data, spec.data.rl_data, spec.data.eval_data)
        # the data, before the model: every problem file whole, this process's SFT shards
        problems = load_dataset(rl_path)
        eval_problems = load_dataset(eval_path) if eval_path else None
        shards = spec.data.sft_shards or jax.process_count()
        mine = shard_owner(shards, jax.process_count(), jax.process_index())
        records = {s: [validate_record(obj, path=sft_path, line=line, template_cfg=tpl)
                       for line, obj in iter_jsonl(sft_path, shard=(s, shards))] for s in mine}
        mesh = make_mesh(spec.mesh, trainer_devs)
        if args.dry_run:
            tok = ByteTokenizer()
            mcfg = ModelConfig.tiny(vocab_size=tok.vocab_size)
            graphdef, params = split_policy(Qwen3(mcfg, rngs=nnx.Rngs(spec.seed)))
            params = distributed.global_params(params, mesh)
        else:
            from rstar2_jax.model.hf_io import load_hf
            graphdef, params, mcfg = load_hf(spec.model.path, mesh=mesh, dtype=spec.model.dtype)
            tok = HFTokenizer(spec.model.path)
        reward_fn = spec.reward_fn(pool).batch
        # the longest rendered prompt (system prompt and template included; at most the plan's
        # data.max_prompt_tokens, else a config error naming the record) + slack
        limit = spec.data.max_prompt_tokens
        longest = max(check_prompts(ps, path, tok, tpl, limit)
                      for ps, path in ((problems, rl_path), (eval_problems or [], eval_path)))
        seq_len = spec.seq_len(longest + 64 if limit is None else min(longest + 64, limit))

        def make_rollout(params):
            ecfg = spec.engine_config(seq_len)
            placement = plan_placement(spec.placement, mcfg, engine_devices)
            if distributed.is_main_process():
                print(placement.table())
            print(placement.line(), flush=True)
            engines = place_engines(placement, graphdef, params, mcfg, ecfg, tok.decode)  # on device, from the trainer's layout
            for e in engines:  # each engine's executables are tied to its devices: compile them all once, now
                e.warmup()
            if spec.rollout.scripted_policy:  # the dry run (see the module docstring): a random policy earns no reward
                # the first problem is solved by every sample: RoC drops its groups, the filter drops it
                script = mixed_script([*problems, *(eval_problems or [])], tok, tpl, solved={problems[0].id})
                engines = [ScriptedPolicy(e, script) for e in engines]
            return Rollout(engines, pool, tok, spec.rollout_config(tpl)), engines

        parts = Parts(
            graphdef=graphdef, params=params, mesh=mesh, rl=spec.rl, pad_id=tok.pad_id,
            learner=spec.learner_config(seq_len),
            make_rollout=make_rollout, pool=pool, tokenizer=tok, reward_fn=reward_fn,
            schedule=RecipeSchedule(spec=spec, problems_list=problems, template=tpl),
            sft=SFTPart(cfg=spec.sft, shards=shards, ckpt_every=spec.checkpoint.every_sft,
                        load_shard=lambda s: render_records(records[s], tok, tpl)),
            eval_problems=eval_problems, eval_cfg=spec.eval_config(tpl), async_rl=spec.async_rl,
            dynamic_sampling=spec.rollout.dynamic_sampling, curriculum=spec.schedule.curriculum)
        rc = spec.run_config(out, resume=args.resume, allow_changed=args.allow_changed, sinks=("jsonl", *args.log),
                             show_progress=show)
        abstract = abstract_train_state(params, spec.rl, mesh)
        del params  # handed over to the run (Parts.params), which drops it once SFT has started from it
        try:
            res = run(parts, rc, abstract)
        except ResumeError as e:
            raise SystemExit(str(e)) from None
    if res.resumed_from is not None:
        print(f"resume: from {json.dumps(res.resumed_from)}")
    write_plots(res.rows, out)
    rl = rl_rows(res.rows)
    summary = {"stages": res.visited, "global_steps": res.cursor.global_step, "processes": jax.process_count(),
               "mesh": list(shape),
               "n_kept_per_stage": {s: [r["n_kept"] for r in rl if r["stage"] == s] for s in STAGES[1:-1]},
               "compiles_per_step": [r.get("compiles") for r in rl],
               "stage3_problems": None if res.cursor.kept_ids is None else len(res.cursor.kept_ids),
               "steps_per_stage": {s: sum(1 for r in rl if r["stage"] == s) for s in STAGES[1:-1]},
               "heldout_acc": [r["heldout_acc"] for r in res.rows if r.get("heldout_acc") is not None]}
    if distributed.is_main_process():
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        print("recipe:", json.dumps(summary))
    return summary

