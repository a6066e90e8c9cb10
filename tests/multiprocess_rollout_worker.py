"""Subprocess for tests/test_multiprocess.py (not a test module): 2 full RL steps with rollouts.

  python multiprocess_rollout_worker.py OUT_DIR

Every process: a tiny policy trained on a mesh over all processes' devices (fsdp), engines of 2
devices each (tensor-parallel) over its own local devices, its own sandbox pool; each step rolls
out this process's shard of the step's problems (``Rollout.generate``), scores it, and the learner
updates on the global batch (RoC on the gathered records, each process filling its own rows), then
syncs the engines on device. The rollouts come from the recipe's scripted dry-run policy over the
real engines (a random policy earns no reward, so RoC would keep nothing). Writes
``OUT_DIR/proc{i}.npz``: final params, per-step metrics, the problems this process rolled out.
"""

import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import dataclasses  # noqa: E402
from pathlib import Path  # noqa: E402

from rstar2_jax import distributed  # noqa: E402

SETUP = distributed.initialize(initialization_timeout=120)  # before any other JAX call

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from rstar2_jax.config import MeshConfig, ModelConfig  # noqa: E402
from rstar2_jax.data.datasets import parse_problem  # noqa: E402
from rstar2_jax.data.toy import make_splits  # noqa: E402
from rstar2_jax.learner import Learner, LearnerConfig  # noqa: E402
from rstar2_jax.loop import rl_step  # noqa: E402
from rstar2_jax.model import Qwen3, make_mesh, split_policy  # noqa: E402
from rstar2_jax.rewards import RewardFn  # noqa: E402
from rstar2_jax.rl.config import OptimConfig, RLConfig, RocConfig  # noqa: E402
from rstar2_jax.rl.train_step import init_train_state  # noqa: E402
from rstar2_jax.rollout.dispatcher import RolloutConfig  # noqa: E402
from rstar2_jax.rollout.scripted import ScriptedPolicy  # noqa: E402
from rstar2_jax.rollout.service import Rollout  # noqa: E402
from rstar2_jax.rollout.template import TemplateConfig  # noqa: E402
from rstar2_jax.rollout.weight_sync import WeightSync  # noqa: E402
from rstar2_jax.sampling import EngineConfig, PagedEngine, Temperature  # noqa: E402
from rstar2_jax.sampling.placement import PlacementConfig, leaf_devices, plan_placement  # noqa: E402
from rstar2_jax.sandbox import SandboxLimits, SandboxPool  # noqa: E402
from rstar2_jax.tokenizer import ByteTokenizer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
from rstar2_recipe import dry_run_script  # noqa: E402

PROBLEMS_PER_STEP, SAMPLES, GROUP, BUDGET = 4, 4, 2, 320
# paper-mode RoC (random): exact equality needs the selection made on the gathered records
CFG = dataclasses.replace(RLConfig.tiny(), micro_batch_size=4, old_logp_source="recompute",
                          roc=RocConfig(keep_per_group=GROUP, mode="paper"),
                          optim=OptimConfig(lr=1e-3, warmup_steps=0, eps=1e-4))
METRICS = ("reward", "n_kept", "n_sampled", "tool_calls_executed", "response_len", "tool_calls_per_traj",
           "train/loss", "train/grad_norm", "train/update_norm", "train/n_tokens", "sync_bytes")


def main(out_dir: str) -> None:
    tok = ByteTokenizer()
    tpl = TemplateConfig.toy(report_exec_time=False)
    problems = [parse_problem(p.to_record()) for p in make_splits(0, 2 * PROBLEMS_PER_STEP, 1)[0]]
    mcfg = ModelConfig.tiny(vocab_size=tok.vocab_size)
    mesh = make_mesh(MeshConfig(data=1, fsdp=-1, tensor=1))  # over every process's devices
    graphdef, params = split_policy(Qwen3(mcfg, rngs=nnx.Rngs(0)))
    params = distributed.global_params(params, mesh)
    placement = plan_placement(PlacementConfig(devices_per_engine=2), mcfg)
    print(placement.table(), placement.line(), sep="\n", flush=True)
    ecfg = EngineConfig(num_slots=8, page_size=16, max_seq_len=512, num_pages=128, prefill_chunk=64)
    placed = WeightSync(placement.layouts).place(params)
    script = dry_run_script(problems, tok, tpl)
    engines = [ScriptedPolicy(PagedEngine(graphdef, p, mcfg, ecfg, decode_fn=tok.decode, layout=lay), script)
               for p, lay in zip(placed, placement.layouts)]
    limits = SandboxLimits(wall_s=5.0, cpu_s=5.0, memory_mb=2048, preload=("numpy", "sympy", "rstar2_jax.rewards.worker"))
    rows, ids = [], []
    with SandboxPool(workers=1, limits=limits) as pool:
        rollout = Rollout(engines, pool, tok, RolloutConfig(n_samples=SAMPLES, budget=BUDGET, template=tpl,
                                                            sampler=Temperature(temperature=1.0)))
        learner = Learner(graphdef, init_train_state(params, CFG, 0, mesh=mesh),
                          LearnerConfig(rl=CFG, seq_len=512, rows=PROBLEMS_PER_STEP * GROUP), pad_id=tok.pad_id,
                          mesh=mesh)
        rollout.sync(learner.params)
        for step in range(2):
            batch = problems[step * PROBLEMS_PER_STEP:(step + 1) * PROBLEMS_PER_STEP]
            m, res = rl_step(rollout, learner, RewardFn(pool=pool).batch, batch, seed=step)
            print({k: m.get(k) for k in ("reward", "n_kept", "n_sampled", "error_rate", "truncation_rate", "response_len")}, flush=True)
            rows.append([float(m[k]) for k in METRICS])
            ids.append(sorted({t.problem_id for t in res.trajectories}))
    local_devices = {d.id for d in jax.local_devices()}
    on_own = all(leaf_devices(e.engine.params) <= local_devices and leaf_devices(e.engine.cache) <= local_devices
                 for e in engines)
    leaves = distributed.to_host(jax.tree.leaves(learner.params))
    np.savez(os.path.join(out_dir, f"proc{jax.process_index()}.npz"),
             **{f"p{i}": x for i, x in enumerate(leaves)}, metrics=np.asarray(rows), metric_names=np.asarray(METRICS),
             problem_ids=np.asarray(ids), process_count=jax.process_count(), num_devices=jax.device_count(),
             local_engines=len(engines), engines_on_own_devices=on_own, placement_line=placement.line(),
             placement_table=placement.table(), learner_rows=np.asarray([learner._rows.start, learner._rows.stop]))
    distributed.sync("multiprocess_rollout_worker_done")


if __name__ == "__main__":
    main(*sys.argv[1:])
