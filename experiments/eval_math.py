"""Evaluate a policy on math benchmarks: pass@1 = mean correctness over k samples per problem.

Same template, tool loop (sandboxed Python), engines and verifier as training. Datasets are JSONL
files given by path: ``--data NAME=PATH`` (repeatable, any name) or positional paths whose file stem
is the name; the known benchmarks (AIME24, AIME25, HMMT25, MATH-500, AMC23, in any spelling) only
supply display names. Writes ``<out>/<name>.jsonl`` (one row per problem) and ``<out>/summary.json``,
and prints the summary table.

  python experiments/eval_math.py --hf models/rstar2-14b --data aime24=data/aime24.jsonl \\
      --data math500=data/math500.jsonl --k 16 --temperature 0.6 --top-p 0.95 --budget 16384
  python experiments/eval_math.py --checkpoint runs/toy_tool_math data/amc23.jsonl --k 1 --temperature 0
  python experiments/eval_math.py --random-tiny data/aime24.jsonl --k 1 --temperature 0 --budget 64 --limit 2
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from rstar2_jax.eval import (EvalConfig, build_engines, evaluate_suite, format_table, load_policy, load_suite,
                            make_sampler, parse_data_specs, template_config)
from rstar2_jax.eval.load_policy import TEMPLATES, prompt_lengths
from rstar2_jax.rewards import RewardFn
from rstar2_jax.sandbox import SandboxLimits, SandboxPool


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="*", help="dataset JSONL files whose stem names the dataset")
    ap.add_argument("--data", action="append", default=[], metavar="NAME=PATH",
                    help="a dataset of any name (repeatable)")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--hf", metavar="DIR", help="HF safetensors directory (config.json, tokenizer.json)")
    src.add_argument("--checkpoint", metavar="DIR", help="orbax checkpoint dir, or a toy run dir with run_spec.json")
    src.add_argument("--random-tiny", action="store_true", help="tiny random byte-level policy (smoke tests)")
    ap.add_argument("--config", help="HF config.json (file or dir) giving the model shape of --checkpoint")
    ap.add_argument("--tokenizer", help="tokenizer.json (file or dir) for --checkpoint")
    ap.add_argument("--step", type=int, help="--checkpoint: the newest step at or before this (default: newest)")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), help="--hf: compute/param dtype")
    ap.add_argument("--k", type=int, required=True, help="samples per problem (pass@1 = their mean)")
    ap.add_argument("--temperature", type=float, required=True, help="0 = greedy (needs --k 1)")
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--budget", type=int, default=8192, help="response tokens per trajectory, tool tokens included")
    ap.add_argument("--template", choices=TEMPLATES, help="default: the policy's (toy for byte-level policies)")
    ap.add_argument("--limit", type=int, help="first N problems of each dataset")
    ap.add_argument("--engines", type=int, default=1)
    ap.add_argument("--slots", type=int, default=32, help="decode slots per engine")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--kv-gb", type=float, help="KV cache per engine (default: every slot's worst case)")
    ap.add_argument("--prefill-chunk", type=int, default=256)
    ap.add_argument("--sandbox-workers", type=int, default=4)
    ap.add_argument("--tool-timeout", type=float, default=5.0, help="seconds per tool call (wall and CPU)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/eval", help="output directory")
    ap.add_argument("--save-responses", action="store_true", help="keep each sample's text in the JSONL")
    ap.add_argument("--no-progress", action="store_true")
    return ap


def _check(args: argparse.Namespace, ap: argparse.ArgumentParser) -> None:
    errors = [f"--{n.replace('_', '-')} must be >= 1, got {getattr(args, n)}" for n in
              ("k", "budget", "engines", "slots", "page_size", "prefill_chunk", "sandbox_workers")
              if getattr(args, n) < 1]
    if args.limit is not None and args.limit < 1:
        errors.append(f"--limit must be >= 1, got {args.limit}")
    if args.temperature < 0 or not 0 < args.top_p <= 1:
        errors.append(f"need --temperature >= 0 and 0 < --top-p <= 1, got {args.temperature}, {args.top_p}")
    if args.temperature == 0 and args.k > 1:
        errors.append("--temperature 0 (greedy) repeats one sample: use --k 1 or a temperature > 0")
    if not args.paths and not args.data:
        errors.append("no datasets: give --data NAME=PATH or dataset paths")
    if errors:
        ap.error("; ".join(errors))


def main(argv: list[str] | None = None) -> dict:
    ap = build_parser()
    args = ap.parse_args(argv)
    _check(args, ap)
    try:
        datasets = load_suite(parse_data_specs([*args.data, *args.paths]), limit=args.limit)
        policy = load_policy(hf=args.hf, checkpoint=args.checkpoint, config=args.config, tokenizer=args.tokenizer,
                             step=args.step, random_tiny=args.random_tiny, seed=args.seed, dtype=args.dtype)
    except (ValueError, OSError) as e:  # bad names, files, records or checkpoints: a message, not a traceback
        ap.error(str(e))
    template = args.template or policy.template
    cfg = EvalConfig(k=args.k, sampler=make_sampler(args.temperature, args.top_p), budget=args.budget,
                     template=template_config(template))
    longest = max(max(prompt_lengths(ps, policy.tokenizer, cfg.template)) for ps in datasets.values())
    max_seq_len = math.ceil((longest + args.budget) / args.page_size) * args.page_size
    engines = build_engines(policy, n_engines=args.engines, slots=args.slots, max_seq_len=max_seq_len,
                            page_size=args.page_size, prefill_chunk=args.prefill_chunk,
                            kv_memory_bytes=int(args.kv_gb * 2**30) if args.kv_gb else None)
    settings = {**vars(args), "policy": policy.source, "template": template, "sampler": repr(cfg.sampler),
                "max_seq_len": max_seq_len, "model": repr(policy.model_cfg)}
    limits = SandboxLimits(wall_s=args.tool_timeout, cpu_s=args.tool_timeout, memory_mb=2048,
                           preload=("numpy", "sympy", "rstar2_jax.rewards.worker"))
    with SandboxPool(workers=args.sandbox_workers, limits=limits) as pool:
        summary = evaluate_suite(datasets, engines, pool, policy.tokenizer, RewardFn(pool=pool).batch, cfg,
                                 out_dir=args.out, seed=args.seed, show_progress=not args.no_progress,
                                 keep_text=args.save_responses, settings=settings)
    print(f"\n{policy.source}  k={args.k}  {cfg.sampler!r}  budget={args.budget}  template={template}")
    print(format_table(summary))
    print(f"outputs in {args.out}: summary.json, " + ", ".join(Path(r["jsonl"]).name for r in summary["datasets"]))
    return json.loads(json.dumps(summary, default=str))


if __name__ == "__main__":
    main()
