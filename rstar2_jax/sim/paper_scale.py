"""Synchronous vs asynchronous RL at the paper's scale, in the discrete-event model
(``sim.simulate_async``): ``paper_scale_speedup``.

Setting (``PaperScale``; every number is an assumption stated here, none measured on accelerators):

* Machine: 64 accelerators of an H200-class chip (4.8 TB/s HBM, 989 TFLOP/s dense bf16), Qwen3-14B
  (14.77 B parameters, 40 layers, 8 K/V heads of 128). One TP-1 engine per rollout device, bf16
  weights: a decode step costs ``weights / HBM`` (6.2 ms) + 1 ms host + per row ``2 N`` FLOPs at 50% of
  peak (0.06 ms) + per 1000 context tokens their K/V read (160 KiB a token: 0.034 ms); a 512-token
  prefill chunk ``512 x 2 N`` FLOPs at 50% (30.6 ms); 40 GB of K/V per engine (15,258 pages of 16),
  128 slots, preemption recomputes.
* Training: ``10 N`` FLOPs per trained token (forward + backward 6 N, full remat 2 N, the recomputed
  pi_old forward 2 N; attention FLOPs not counted) at 40% of peak, over the learner's devices; RoC
  trains G = 16 of each group's 2G = 32 samples, taken as half of the group's tokens. Training scales
  linearly with the learner's devices (same efficiency on 16 as on 64; memory ignored).
* Weight push: 3 s per update in both placements (resharding to colocated engines, or a broadcast
  to disjoint ones); the engines pause meanwhile.
* Workload: ``sim.workload`` (the heavy-tailed multi-turn shape (b) of ``bench_rollout``: turn
  lengths lognormal(log(median_turn d), 1.2), 1 + Poisson(d) tool calls, <= 6 turns) at an 8K
  budget, ``median_turn`` 400 (about 8% of samples truncated, the paper's stage-1 regime of ~10%),
  tool calls 0.5 s, prompts 256 tokens; 128 problems x 32 samples per step.
* Placement: synchronous = colocated (all devices roll out, then all train); asynchronous = disjoint
  (``engine_devices`` engines, the rest train).

The simulation runs a 1/``slice`` slice of the machine (8 of 64 devices, 16 of 128 problems per
step): per-device load, per-step times and their ratio are the full machine's as long as every
device's share is alike (data-parallel engines and learner); the longest trajectory of 512 rather
than 4096 samples is the slice's only difference (at 8K the tail is cut by the budget in both).
``paper_scale_speedup()`` runs 7 simulations of 8-10 batches (3-5 min each on a loaded 2-core
machine); its numbers and what they mean: docs/design.md §7 ("The RL loop in simulation").
"""

from __future__ import annotations

import dataclasses

import numpy as np

from rstar2_jax.admission import AdmissionConfig
from rstar2_jax.sim import SimEngine
from rstar2_jax.sim.simulate_async import SimLoopConfig, AsyncResult, simulate_async
from rstar2_jax.sim.workload import Workload, history, sim_groups


@dataclasses.dataclass(frozen=True, kw_only=True)
class PaperScale:
    devices: int = 64
    problems: int = 128  # groups per step
    samples: int = 32  # 2G per group
    trained_frac: float = 0.5  # G / 2G: RoC's share of each group's tokens the learner trains
    budget: int = 8192
    prompt_len: int = 256
    median_turn: float = 400.0
    tool_s: float = 0.5
    params: float = 14.77e9
    hbm_bps: float = 4.8e12
    peak_flops: float = 989e12
    decode_mfu: float = 0.5
    train_mfu: float = 0.4
    train_flops_per_token: float = 10.0  # x params
    kv_bytes_per_token: int = 40 * 8 * 128 * 2 * 2
    kv_pool_bytes: float = 40e9
    num_slots: int = 128
    prefill_chunk: int = 512
    host_step_s: float = 1e-3
    sync_s: float = 3.0
    slice: int = 8  # simulate devices / slice devices and problems / slice problems per step
    warmup_steps: int = 2
    window_steps: int = 6

    def engine(self) -> SimEngine:
        row = 2 * self.params / (self.peak_flops * self.decode_mfu)
        return SimEngine(num_slots=self.num_slots, usable_pages=int(self.kv_pool_bytes / self.kv_bytes_per_token) // 16,
                         page_size=16, prefill_chunk=self.prefill_chunk,
                         step_s_fixed=2 * self.params / self.hbm_bps + self.host_step_s, step_s_per_row=row,
                         step_s_chunk=(self.prefill_chunk - 1) * row,
                         step_s_per_kctx=1e3 * self.kv_bytes_per_token / self.hbm_bps)

    def train_s_per_token(self, learner_devices: int) -> float:
        """Seconds per token of a finished group (``trained_frac`` of them trained) on ``learner_devices``."""
        return (self.trained_frac * self.train_flops_per_token * self.params
                / (learner_devices * self.peak_flops * self.train_mfu))

    def workload(self) -> Workload:
        return Workload(n_problems=self.problems // self.slice, n_samples=self.samples, budget=self.budget,
                        sigma_t=1.2, min_calls=1, max_turns=6, calls_per_d=1.0, tools="mix",
                        median_turn=self.median_turn)

    def steps(self, n: int, seed: int = 0) -> list:
        w = self.workload()
        return [sim_groups(w, seed * 1000 + b, self.prompt_len, np.array([self.tool_s - 0.1]), epoch=1)
                for b in range(n)]


def run(p: PaperScale, k: int, engine_devices: int, seed: int = 0, stale: str = "drop") -> AsyncResult:
    """One run on the slice: ``k = 0`` colocated (``engine_devices`` must be the slice's devices), else disjoint."""
    dev = p.devices // p.slice
    learner = dev if k == 0 else dev - engine_devices
    if not (1 <= engine_devices <= dev and learner >= 1):
        raise ValueError(f"paper_scale: {engine_devices} engine devices of {dev} leave no learner")
    cfg = SimLoopConfig(max_staleness=k, train_s_per_token=p.train_s_per_token(learner), sync_s=p.sync_s, stale=stale,
                      warmup_steps=p.warmup_steps, window_steps=p.window_steps)
    by_key, lengths = history(p.workload(), seed * 1000, epoch=0)
    return simulate_async(p.steps(p.warmup_steps + p.window_steps + k, seed), n_engines=engine_devices,
                          engine=p.engine(), budget=p.budget, cfg=cfg, policy=AdmissionConfig(), lengths=lengths,
                          history=by_key)


def paper_scale_speedup(p: PaperScale = PaperScale(), ks: tuple[int, ...] = (1, 2),
                        engine_devices: tuple[int, ...] = (4, 5, 6), seed: int = 0) -> dict:
    """Trained samples/s of asynchronous (disjoint, each ``k`` and engine split of the slice's devices)
    over synchronous (colocated). Returns ``{"sync": result, (k, n): (speedup, result), "best": {k: (n, speedup)}}``."""
    sync = run(p, 0, p.devices // p.slice, seed)
    out: dict = {"sync": sync, "best": {}}
    for k in ks:
        for n in engine_devices:
            r = run(p, k, n, seed)
            out[(k, n)] = (r.samples_per_s / sync.samples_per_s, r)
        n = max(engine_devices, key=lambda n: out[(k, n)][0])
        out["best"][k] = (n, out[(k, n)][0])
    return out
