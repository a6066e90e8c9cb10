"""Write rStar2-format SFT traces of toy TRAIN problems (tool responses from the real sandbox) as JSONL.

    python experiments/make_sft_traces.py --n 2000 --seed 0 --out runs/sft_traces.jsonl

Problems come from the train side of the toy split (never a held-out text, whatever the seed). Prints
the variant counts and the byte-token lengths under ``ByteTokenizer`` + ``TemplateConfig.toy()``.
"""

from __future__ import annotations

import argparse
import collections

from rstar2_jax.data.chat import render_chat
from rstar2_jax.data.datasets import write_jsonl
from rstar2_jax.data.sft_traces import TraceConfig, build_traces
from rstar2_jax.data.toy import generate
from rstar2_jax.rollout.template import TemplateConfig
from rstar2_jax.sandbox import SandboxLimits, SandboxPool
from rstar2_jax.text.tokenizer import ByteTokenizer


def main() -> None:
    defaults = TraceConfig()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1000, help="number of traces (one per problem)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the problem draw and of the trace variants")
    ap.add_argument("--p-error-retry", type=float, default=defaults.p_error_retry)
    ap.add_argument("--p-no-tool", type=float, default=defaults.p_no_tool)
    ap.add_argument("--p-extra-answer", type=float, default=defaults.p_extra_answer)
    ap.add_argument("--workers", type=int, default=2, help="sandbox worker processes")
    ap.add_argument("--out", required=True, help="output JSONL path")
    args = ap.parse_args()

    cfg = TraceConfig(p_error_retry=args.p_error_retry, p_no_tool=args.p_no_tool,
                      p_extra_answer=args.p_extra_answer)
    template_cfg = TemplateConfig.toy()
    problems = generate(args.n, seed=args.seed, split="train")
    with SandboxPool(workers=args.workers, limits=SandboxLimits(preload=())) as pool:
        records = build_traces(problems, pool=pool, cfg=cfg, template_cfg=template_cfg, seed=args.seed)
    n = write_jsonl(args.out, records)

    tok = ByteTokenizer()
    lengths = collections.defaultdict(list)
    for rec in records:
        lengths[rec["meta"]["variant"]].append(len(render_chat(rec["messages"], tok, template_cfg)[0]))
    extra = sum(rec["meta"]["extra_answer"] for rec in records)
    print(f"wrote {n} traces to {args.out} ({extra} with an extra <answer>)")
    for variant, ls in sorted(lengths.items()):
        print(f"  {variant:12s} {len(ls):6d} traces, byte tokens min/mean/max "
              f"{min(ls)}/{sum(ls) / len(ls):.0f}/{max(ls)}")


if __name__ == "__main__":
    main()
