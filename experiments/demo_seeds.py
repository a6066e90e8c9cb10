"""`make demo` for several seeds (default 0, 1, 2), each in a fresh process as `make demo` runs it, then
one table: held-out accuracy after SFT and after RL and minutes per seed, their mean and spread, and the
commit measured (what the README quotes). ``make demo-seeds`` (about 4 min a seed on 2 CPU cores).

    python experiments/demo_seeds.py [--seeds 0,1,2] [--out runs/demo_seeds] [-- toy_tool_math.py args]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

DEMO = Path(__file__).resolve().parent / "toy_tool_math.py"


def commit() -> str:
    """The checkout's short commit, with ``+dirty`` when tracked files differ from it."""
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], capture_output=True, text=True, cwd=DEMO.parent).stdout.strip()
    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def spread(xs: list[float], fmt: str) -> str:
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    f = (lambda x: format(x, fmt))
    return f"{f(statistics.mean(xs))} ± {f(sd)} (range {f(min(xs))}-{f(max(xs))})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--out", default="runs/demo_seeds", help="one run directory per seed under it, and table.md")
    ap.add_argument("demo_args", nargs=argparse.REMAINDER, help="after --: passed to toy_tool_math.py")
    args = ap.parse_args()
    extra = [a for a in args.demo_args if a != "--"]
    measured_at = commit()
    rows = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        out = Path(args.out) / f"seed{seed}"
        t0 = time.perf_counter()
        rc = subprocess.run([sys.executable, str(DEMO), "--seed", str(seed), "--out", str(out), *extra]).returncode
        if rc != 0:
            print(f"demo_seeds: seed {seed} failed (exit {rc})", file=sys.stderr)
            return rc
        s = json.loads((out / "summary.json").read_text())
        rows.append((seed, s["sft_heldout_acc"], s["rl_heldout_acc"], (time.perf_counter() - t0) / 60))
    lines = [f"demo seeds at commit {measured_at} ({' '.join(['toy_tool_math.py', *extra])}):", "",
             "| seed | held-out after SFT | held-out after RL | minutes |", "| --- | --- | --- | --- |"]
    lines += [f"| {seed} | {sft:.3f} | {rl:.3f} | {m:.1f} |" for seed, sft, rl, m in rows]
    lines += ["", f"after SFT {spread([r[1] for r in rows], '.3f')}; after RL {spread([r[2] for r in rows], '.3f')}; "
              f"minutes {spread([r[3] for r in rows], '.1f')} (mean ± sample std over {len(rows)} seeds)"]
    text = "\n".join(lines)
    print("\n" + text)
    (Path(args.out) / "table.md").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
