"""The memory plan: what one device holds during a run, from the config alone, before anything loads.

    python -m rstar2_jax.run.plan --config experiments/configs/rstar2_14b.json --device-memory 192
    python -m rstar2_jax.run.plan --config experiments/configs/rstar2_14b_16x80gb.json --device-memory 79.6
    python -m rstar2_jax.run.plan --config experiments/configs/rstar2_8b_8x80gb.json --device-memory 79.6 \\
        --set 'mesh={"data": 1, "fsdp": 4, "tensor": 2}' --set rl.micro_batch_size=32

The model's shape comes from ``<model_path>/config.json`` when that folder exists, else from a named
preset of the public Qwen3 configs (``--model Qwen3-14B``, or guessed from the model path's name), so
a run can be planned before anything is downloaded. The config is a ``run.spec.RunSpec`` file (``--config
FILE``, dotted ``--set`` overrides); the recipe checks its spec with :func:`check_spec` on this run's
devices and refuses, with the table, a spec that does not fit; reading a spec alone asks JAX nothing.

Per device, in four phases: SFT (the trainer alone); RL's update, its π_old pass and its weight sync
(the trainer and the engines). Rows:

* **parameters**: P x bytes(param_dtype) / (fsdp x tensor) (``model/sharding.py``: every weight has
  an ``embed`` axis on fsdp and a heads / mlp / vocab axis on tensor; the data axis replicates): the
  train state's, and in SFT also the initial params it starts from (``Parts.params``; the train state
  starts from a copy because the update donates it). ``run.driver`` drops the initial params when SFT
  starts and the scripts hold no other reference, so the RL phases count one copy.
* **reference policy**: π_ref of the KL term, one more P x bytes(param_dtype) / (fsdp x tensor) in
  every RL phase when ``loss.kl_coef`` > 0 (``run.driver.reference_policy``: laid out like the policy).
* **gradients** (updates): the update's fp32 accumulator (``rl/train_step._accumulate``) plus one
  micro-batch's gradient in param_dtype, sharded like the parameters; plus the vocabulary-sized tables'
  extra buffers per tensor shard (:func:`vocab_grad_bytes` per V x D element: the lookup's fp32 scatter,
  docs/design.md §6.1, and with 16-bit params the head's fp32 gradient and casts; XLA's plan).
* **optimizer state**: AdamW's two moments in param_dtype (optax keeps them in the params' dtype).
* **layer-stack copies** (updates): with ``scan_layers`` the stacked ``[L, ...]`` layer params and their
  gradients (two transient copies of the layer weights, laid out like the params).
* **FSDP gathers** (updates, fsdp > 1): the vocabulary tables gathered whole over fsdp (per tensor
  shard) and the head's gradient before its reduce-scatter: V x D x (tables + 1) x bytes(param_dtype) /
  tensor. Basis: XLA's plan of the update of Qwen3-14B's widths (2 and 4 layers, V 151,936, fp32
  params) on a data 1 x fsdp 8 x tensor 1 mesh of 8 CPU devices held ~11.2 B per V x D element more
  than the other rows (~8.1 GB per device); untied fp32: 12 B counted.
* **activations per micro-batch** (updates): with b rows per device (micro-batch rows / (data x fsdp)) and T
  tokens per row, ``b T (L s + w) + b c V 4 x 3 + 2 b T D 4`` bytes, where s is what remat keeps
  per token per layer (``full``: the layer input, D elements; ``dots``: also every matmul output,
  N H + 2 K H + 2 D + 2 F; ``none``: 3.14 x dots), w = 3.14 x (N H + 2 K H + 2 D + 2 F) / tensor
  is one layer's rematerialised working set in the backward, c the log-prob chunk (three fp32
  ``[b, c, V]`` buffers: logits, softmax, their gradient) and the last term the final hidden state
  and its gradient in fp32; s and w in the compute dtype. Basis (docs/design.md §6.1, XLA's plan at
  0.6B dims in fp32): full 3.0 KiB (formula 4.0), dots 47.0 KiB (formula 48.0), none 150.5 KiB
  (3.14 x 48.0, hence the factor). Blockwise attention adds O(b N block^2) per layer (counted in w
  through the 3.14 factor at T >> block); dense attention adds b N T^2 x 4 per layer in w. An
  unrolled stack (``scan_layers=False``, L > 1) counts s = 10 B x dots whatever the remat policy: XLA's plan of
  it is the same for full, dots and none (only the scanned stack is rematerialised; §6.2), ~117-122 KiB
  per token per layer at 0.6B widths in bf16 and fp32: 10 bytes per dots element.
* **π_old pass per micro-batch** (its own phase, when ``rl.old_logp_source`` is "recompute" (the recipe's)
  or π_ref is kept; "sampler" with no KL has no pass): ``rl/train_step.make_logprob_fn``, a no-grad
  forward micro-batched like the update, run before it (its temporaries are gone when the update starts;
  the π_ref pass is the same program on the reference params, after it). Per device: the scanned
  stack's layer params at 4 B per param / (fsdp x tensor), the V x D table in the compute dtype /
  tensor (with fsdp > 1 also one table gathered in param_dtype: XLA's plan at 14B widths, fsdp 8), ``b T (2 x dots x bytes(compute) / tensor + 4 D)`` and the three fp32 ``[b, c, V]``
  buffers. Basis: XLA's plan of that program (``plan_xla``, 0.6B widths, 2-4 layers, V 32K-64K,
  bf16 and fp32): +60 MiB per layer (4 B per layer param, both dtypes), +2 B per V x D element in
  bf16, ~42-53 KiB per token in bf16 (2 x 24 KiB of dots + 4 KiB); the formula is within 5% at
  2 rows and over by 20-30% at 4 rows (conservative: the pass is never the peak phase).
* **RL batch** (update and π_old pass): the whole batch on device, its rows over data x fsdp, T
  tokens each: tokens, targets, loss mask, positions, segment ids (4 B each) and the log-probs the
  step adds (the sampler's; π_old when recomputed; π_ref with the KL term), 4 B each.
* **engines' weights** (RL): P x bytes(engine weight dtype) / TP per engine device.
* **engines' K/V pool** (RL): ``engine.kv_memory_gb`` per engine, split over its TP devices.
* **async snapshots** (RL, ``max_staleness`` k >= 1; the recipe's ``AsyncConfig`` has lookahead L =
  k): copies of the engines' weights that ``train.async_loop.AsyncRL.published`` holds beside the engines'
  own (:func:`async_snapshots`): up to L during an update and its π_old pass (versions w(b) .. the
  learner's, w(b) = b - L the one the engines hold), L + 1 while the next one is published (added
  before the rollout's next batch drops the oldest). 0 in the synchronous loop.
* **weight-sync transient** (the sync phase; gradients and activations are freed by then): the
  synchronous loop's ``WeightSync.__call__`` stages the new weights (one full TP copy per block of
  TP devices, every device) while the engines still hold the old ones (freed by ``set_params``):
  one more engine copy; async's ``_snapshot`` instead copies the trainer's params (P x
  bytes(param_dtype) / (fsdp x tensor)) and stages the new snapshot (counted in its row). Both add
  an allowance for the stage program's gather of one leaf, the largest (V x D in param_dtype / TP;
  assumed, not measured).
* **runtime**: a fixed allowance (0 on accelerators: their limit is what XLA may allocate; the
  measured process baseline on CPU).

Memory: the **usable** memory is device memory x ``memory_fraction`` (:func:`usable_memory_gb`; the
spec's ``RunSpec.memory_fraction``, which must equal ``$XLA_PYTHON_CLIENT_MEM_FRACTION``: the
launch scripts export it from the config and ``check_spec`` refuses a mismatch on an accelerator).
The run **fits** when the largest phase's total is at most usable x (1 - 5%): a 5% margin of usable
memory (:data:`MARGIN`). ``--device-memory`` and ``$RSTAR2_DEVICE_MEMORY_GB`` are the *physical*
GB per device; on an accelerator without that variable ``check_spec`` reads XLA's own limit
(``bytes_limit``, already the usable share) and turns it back into physical by the fraction, so both
paths meet in :func:`usable_memory_gb`. The plan also gives the largest micro-batch (rows per
micro-batch, global) of each update that fits. Approximate by construction: XLA shares and schedules
buffers; ``experiments/bench_real_shapes.py`` compares it with a measured peak (docs/design.md §6.2),
and ``plan_xla`` with XLA's own plan of the update and the π_old pass. :data:`SHIPPED` names the
hardware each shipped config (``experiments/configs/``) is planned for.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from pathlib import Path
from typing import Mapping

from rstar2_jax.model.config import ModelConfig
from rstar2_jax.model.presets import PRESETS, preset
from rstar2_jax.run.spec import RunSpec, load_spec

GB = 2**30
NONE_FACTOR = 150.5 / 48.0  # remat "none" over the "dots" formula, measured (docs/design.md §6.1)
# an unrolled stack's activations per token per layer, bytes per "dots" element, any dtype and remat:
# XLA's plan at 0.6B widths keeps 117 KiB (bf16) / 122 KiB (fp32) per token per layer = ~10 x 12,288
UNROLLED_BYTES_PER_DOT = 10.0
DEVICE_MEMORY_ENV = "RSTAR2_DEVICE_MEMORY_GB"  # physical GB per device (as --device-memory); usable = x memory_fraction
MEM_FRACTION_ENV = "XLA_PYTHON_CLIENT_MEM_FRACTION"  # the share XLA may allocate (RunSpec.memory_fraction)
_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}
# experiments/configs/<name>: (the hardware, physical GB per device as the plan counts GB = 2**30, devices).
# tests/run/test_plan.py plans each on its hardware (fits with the margin); experiments/configs/README.md has the tables.
SHIPPED: dict[str, tuple[str, float, int]] = {
    "rstar2_14b.json": ("AMD MI300X 192 GB, 8 nodes x 8", 192.0, 64),
    "rstar2_14b_16x80gb.json": ("NVIDIA H100 80GB (or A100 80GB), 2 nodes x 8", 79.6, 16),
    "rstar2_14b_8x80gb.json": ("NVIDIA H100 80GB (or A100 80GB), 1 node x 8", 79.6, 8),
    "rstar2_8b_8x80gb.json": ("NVIDIA H100 80GB (or A100 80GB), 1 node x 8", 79.6, 8),
}


def param_counts(cfg: ModelConfig) -> tuple[int, int]:
    """``(total, per layer)`` parameter counts of the ``model/qwen3.py`` decoder."""
    d, n, k, h, f = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size
    layer = d * n * h + 2 * d * k * h + n * h * d + 3 * d * f + 2 * d  # q, k, v, o; gate, up, down; 2 norms
    if cfg.qk_norm:
        layer += 2 * h
    if cfg.qkv_bias:
        layer += n * h + 2 * k * h
    embed = cfg.vocab_size * d * (1 if cfg.tie_embeddings else 2)
    return embed + cfg.num_layers * layer + d, layer


def act_elems_per_token_per_layer(cfg: ModelConfig) -> tuple[float, float]:
    """``(kept, working)``: elements per token per layer that remat keeps for the backward, and one
    layer's rematerialised working set (before sharding over tensor); see the module docstring."""
    d, n, k, h, f = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size
    dots = n * h + 2 * k * h + 2 * d + 2 * f
    kept = {"full": d, "dots": dots, "none": NONE_FACTOR * dots}[cfg.remat]
    return kept, NONE_FACTOR * dots


def vocab_grad_bytes(cfg: ModelConfig) -> float:
    """Bytes per element of a V x D table that the update holds beyond P (4 + bytes(param_dtype)):
    the lookup's fp32 scatter-add and, with 16-bit params, the head's fp32 gradient from the chunked
    log-prob scan and their casts. XLA's plan at 0.6B dims (``python -m rstar2_jax.run.plan_xla``): bf16
    10.5 tied / 8.5 untied; fp32 0.5 / 0 (counted as 4, the earlier estimate: conservative)."""
    if _ITEMSIZE[cfg.param_dtype] >= 4:
        return 4.0
    return 10.5 if cfg.tie_embeddings else 8.5


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class PlanInput:
    """What the plan needs of a run (``from_spec`` fills it from a ``RunSpec``)."""

    model: ModelConfig  # shapes, param_dtype (storage), dtype (compute), remat, attention
    devices: int  # all devices of the run
    devices_per_process: int  # local devices (a node's accelerators)
    mesh: tuple[int, int, int]  # trainer mesh (data, fsdp, tensor), resolved
    rl_rows: int  # train rows per RL update (global)
    rl_micro_rows: int | None  # rows per micro-batch (global); None = the whole batch
    rl_seq_len: int  # T of a train row (prompt + response budget)
    rl_chunk: int = 128  # RLConfig.logprob_chunk_size
    sft_rows: int | None = None  # None: no SFT phase
    sft_micro_rows: int | None = None
    sft_seq_len: int = 0
    sft_chunk: int = 256  # SFTConfig.logprob_chunk_size
    engines_per_process: int  # E
    devices_per_engine: int  # TP degree of an engine
    engine_weight_dtype: str  # the engines' copy of the weights
    kv_bytes_per_engine: int  # the K/V pool of one engine (all its devices)
    reference_copy: bool = False  # a frozen π_ref (KL term, loss.kl_coef > 0) beside the policy
    old_logp_recompute: bool = True  # RLConfig.old_logp_source "recompute" (a no-grad pass) vs "sampler"
    snapshot_lookahead: int = 0  # async RL's L (AsyncConfig.ahead: max_staleness unless lookahead); 0: sync loop
    initial_copy: bool = True  # SFT holds the initial params (Parts.params) beside the train state's
    runtime_bytes: int = 0  # fixed allowance (the process baseline on CPU)
    # the learner/engine device split: the trainer on the first this-many local devices of each process,
    # the engines on the rest (a device then holds one side's rows); None: every device holds both
    learner_devices_per_process: int | None = None

    @property
    def trainer_devices(self) -> int:
        """Devices of the trainer mesh: all of them, or the learner's share of each process's."""
        if self.learner_devices_per_process is None:
            return self.devices
        return self.learner_devices_per_process * (self.devices // max(self.devices_per_process, 1))

    @property
    def engine_devices_per_process(self) -> int:
        return self.devices_per_process - (self.learner_devices_per_process or 0)

    def __post_init__(self) -> None:
        data, fsdp, tp = self.mesh
        split = self.learner_devices_per_process
        if split is not None and not 0 < split < self.devices_per_process:
            raise ValueError(f"learner_devices = {split} per process must leave the engines some of the "
                             f"{self.devices_per_process} local devices")
        if data * fsdp * tp != self.trainer_devices:
            raise ValueError(f"the trainer mesh data {data} x fsdp {fsdp} x tensor {tp} = {data * fsdp * tp} devices, "
                             f"but the run has {self.trainer_devices} trainer devices "
                             f"({self.devices // max(self.devices_per_process, 1)} processes x "
                             f"{split or self.devices_per_process})")
        if self.engines_per_process * self.devices_per_engine > self.engine_devices_per_process:
            raise ValueError(f"{self.engines_per_process} engines per process x {self.devices_per_engine} devices per "
                             f"engine = {self.engines_per_process * self.devices_per_engine} devices, but a process "
                             f"has {self.engine_devices_per_process} for engines")
        if self.snapshot_lookahead < 0:
            raise ValueError(f"PlanInput.snapshot_lookahead must be >= 0, got {self.snapshot_lookahead}")


ROWS = ("parameters", "reference policy", "gradients", "optimizer state", "layer-stack copies",
        "FSDP gathers", "activations / micro-batch", "pi_old pass / micro-batch", "RL batch", "engines' weights",
        "engines' K/V pool", "async snapshots", "weight-sync transient", "runtime")
# the phases, in the table's order: SFT's update; RL's update, its pi_old (and pi_ref) pass, its weight sync
PHASES = {"sft": "SFT update", "rl": "RL update", "old_logp": "RL pi_old pass", "sync": "RL weight sync"}
MARGIN = 0.05  # "fits": peak <= usable x (1 - MARGIN)
PASS_FACTOR = 2.0  # the no-grad pass's per-token working set, in "dots" elements (XLA's plan; module docstring)
BATCH_BYTES_PER_TOKEN = 4 * 5  # tokens, targets (int32), loss_mask (f32), positions, segment_ids (int32)


ENGINE_ROWS = ("engines' weights", "engines' K/V pool", "async snapshots")  # on the engines' devices


def device_total(inp: PlanInput, rows: Mapping[str, float]) -> float:
    """The bytes one device holds in a phase: every row when trainer and engines share the devices; with
    the learner/engine split the larger of a trainer device's rows and an engine device's (the engine rows,
    the weight-sync transient, which both sides hold while weights move, and the runtime)."""
    if inp.learner_devices_per_process is None:
        return sum(rows.values())
    trainer = sum(v for k, v in rows.items() if k not in ENGINE_ROWS)
    engine = sum(rows[k] for k in ENGINE_ROWS) + rows["weight-sync transient"] + rows["runtime"]
    return max(trainer, engine)


def async_snapshots(lookahead: int, phase: str) -> int:
    """Engine-weight copies async RL holds beside the engines' own (``AsyncRL.published``): during an
    update (and its pi_old pass) up to L (entries w(b) .. consumed, w(b) = b - L the engines' own);
    while it publishes the next version L + 1 (that one added before the rollout's next batch drops
    the oldest). 0 in the synchronous loop."""
    if lookahead <= 0:
        return 0
    return lookahead + 1 if phase == "sync" else lookahead


def _phase(inp: PlanInput, phase: str, micro_rows: int | None = None) -> dict[str, float]:
    """Bytes per device by component for ``phase`` (a key of :data:`PHASES`), with ``micro_rows``
    global rows per micro-batch (default: the input's)."""
    m = inp.model
    data, fsdp, tp = inp.mesh
    total, per_layer = param_counts(m)
    pb, cb = _ITEMSIZE[m.param_dtype], _ITEMSIZE[m.dtype]
    shards = fsdp * tp
    vd = m.vocab_size * m.hidden_size
    out = dict.fromkeys(ROWS, 0.0)
    rl = phase != "sft"
    out["parameters"] = (1 + (inp.initial_copy and not rl)) * total * pb / shards
    if rl and inp.reference_copy:
        out["reference policy"] = total * pb / shards
    out["optimizer state"] = 2 * total * pb / shards
    rows, micro, t, chunk = ((inp.sft_rows, inp.sft_micro_rows, inp.sft_seq_len, inp.sft_chunk) if phase == "sft"
                             else (inp.rl_rows, inp.rl_micro_rows, inp.rl_seq_len, inp.rl_chunk))
    micro = micro_rows or micro or rows
    b = math.ceil(micro / (data * fsdp))  # rows per device
    kept, work = act_elems_per_token_per_layer(m)
    dots = work / NONE_FACTOR
    scanned = m.scan_layers and m.num_layers > 1
    if phase in ("sft", "rl"):  # an update
        out["gradients"] = total * (4 + pb) / shards + vd * vocab_grad_bytes(m) / tp
        if scanned:
            out["layer-stack copies"] = 2 * m.num_layers * per_layer * pb / shards
        if fsdp > 1:  # the V x D tables gathered whole over fsdp (per tensor shard) and the head's gradient
            out["FSDP gathers"] = vd * (2 - m.tie_embeddings + 1) * pb / tp
        if not scanned and m.num_layers > 1:  # XLA keeps every layer's activations, whatever remat
            kept_bytes = UNROLLED_BYTES_PER_DOT * dots / tp
        else:
            kept_bytes = kept * cb / (1 if m.remat == "full" else tp)  # the residual stream: replicated
        work_bytes = work * cb / tp
        attn = (m.num_heads / tp) * (t if m.attention_impl == "dense" else 0) * 4  # dense: fp32 scores, T^2 per row
        out["activations / micro-batch"] = (b * t * (m.num_layers * kept_bytes + work_bytes + attn)
                                            + 3 * b * min(chunk, t) * m.vocab_size * 4 / tp
                                            + 2 * b * t * m.hidden_size * 4)
    elif phase == "old_logp":  # the no-grad pass (make_logprob_fn), micro-batched like the update
        attn = (m.num_heads / tp) * (t if m.attention_impl == "dense" else 0) * 4
        out["pi_old pass / micro-batch"] = ((m.num_layers * per_layer * 4 / shards if scanned else 0.0)
                                            + vd * cb / tp + (vd * pb / tp if fsdp > 1 else 0.0)
                                            + b * t * (PASS_FACTOR * dots * cb / tp + attn + m.hidden_size * 4)
                                            + 3 * b * min(chunk, t) * m.vocab_size * 4 / tp)
    if phase in ("rl", "old_logp"):  # the whole RL batch on device, rows over data x fsdp, and its log-probs
        logps = 1 + inp.old_logp_recompute + inp.reference_copy  # old_logp (sampler_logp), pi_old, pi_ref
        out["RL batch"] = math.ceil(rows / (data * fsdp)) * t * (BATCH_BYTES_PER_TOKEN + 4 * logps)
    if rl:
        engine_copy = total * _ITEMSIZE[inp.engine_weight_dtype] / inp.devices_per_engine
        out["engines' weights"] = engine_copy
        out["engines' K/V pool"] = inp.kv_bytes_per_engine / inp.devices_per_engine
        out["async snapshots"] = async_snapshots(inp.snapshot_lookahead, phase) * engine_copy
        if phase == "sync":
            # the stage program's gather of one leaf (the largest, V x D) in param dtype: an allowance
            gather = vd * pb / inp.devices_per_engine
            # sync loop: the staged new copy beside the engines' old one (WeightSync.__call__);
            # async: the new snapshot is counted above, plus the trainer-layout copy _snapshot places
            out["weight-sync transient"] = gather + (total * pb / shards if inp.snapshot_lookahead > 0
                                                     else engine_copy)
    out["runtime"] = float(inp.runtime_bytes)
    return out


def usable_memory_gb(device_memory_gb: float, memory_fraction: float) -> float:
    """What XLA may allocate of a device of ``device_memory_gb`` (physical) GB: the share
    ``memory_fraction`` (``XLA_PYTHON_CLIENT_MEM_FRACTION``; the CLI's and the runtime check's one rule)."""
    if not 0 < memory_fraction <= 1:
        raise ValueError(f"memory_fraction must be in (0, 1], got {memory_fraction}")
    return device_memory_gb * memory_fraction


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
    """Per-device bytes by component and phase; ``usable_bytes`` None: no verdict."""

    inp: PlanInput
    device_bytes: int | None  # physical memory per device
    usable_bytes: int | None  # device_bytes x memory_fraction: what XLA may allocate
    phases: Mapping[str, Mapping[str, float]]

    def total(self, phase: str) -> float:
        return device_total(self.inp, self.phases[phase])

    @property
    def peak(self) -> float:
        return max(self.total(p) for p in self.phases)

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.total)

    @property
    def budget(self) -> float | None:
        """The most a run may plan to hold: usable memory less the margin."""
        return None if self.usable_bytes is None else self.usable_bytes * (1 - MARGIN)

    @property
    def margin(self) -> float | None:
        """(usable - peak) / usable; "fits" needs at least MARGIN."""
        return None if self.usable_bytes is None else (self.usable_bytes - self.peak) / self.usable_bytes

    @property
    def fits(self) -> bool | None:
        return None if self.budget is None else self.peak <= self.budget

    def largest_micro(self, phase: str) -> int | None:
        """The most global rows per micro-batch (a multiple of data x fsdp, at most the batch) whose
        phase total fits the budget; 0 when not even one row per device does; None without a device memory."""
        if self.budget is None:
            return None
        data, fsdp, _ = self.inp.mesh
        rows = self.inp.sft_rows if phase == "sft" else self.inp.rl_rows
        best = 0
        for b in range(1, -(-rows // (data * fsdp)) + 1):  # rows per device
            if device_total(self.inp, _phase(self.inp, phase, b * data * fsdp)) > self.budget:
                break
            best = min(b * data * fsdp, rows)
        return best

    def table(self) -> str:
        inp, m = self.inp, self.inp.model
        total, _ = param_counts(m)
        data, fsdp, tp = inp.mesh
        lines = [f"memory plan: {total / 1e9:.2f} B params (L {m.num_layers}, D {m.hidden_size}, heads "
                 f"{m.num_heads}/{m.num_kv_heads} x {m.head_dim}, F {m.intermediate_size}, V {m.vocab_size}), params "
                 f"{m.param_dtype}, compute {m.dtype}, remat {m.remat}, attention {m.attention_impl}",
                 f"  {inp.devices} devices ({inp.devices // inp.devices_per_process} processes x "
                 f"{inp.devices_per_process}); trainer mesh data {data} x fsdp {fsdp} x tensor {tp}; engines "
                 f"{inp.engines_per_process} per process x TP {inp.devices_per_engine} ({inp.engine_weight_dtype} "
                 f"weights, K/V {inp.kv_bytes_per_engine / GB:.2f} GB each); pi_old "
                 f"{'recomputed' if inp.old_logp_recompute else 'from the sampler'}; reference policy "
                 f"{'kept (KL)' if inp.reference_copy else 'none'}; "
                 + (f"async, lookahead {inp.snapshot_lookahead}" if inp.snapshot_lookahead else "synchronous")
                 + ("" if inp.learner_devices_per_process is None else
                    f"; split: the trainer on the first {inp.learner_devices_per_process} devices of each process, "
                    f"the engines on the other {inp.engine_devices_per_process} (a phase's total is the larger of a "
                    f"trainer device's rows and an engine device's)")]
        phases = list(self.phases)
        shape = {"sft": f"{inp.sft_micro_rows or inp.sft_rows} x {inp.sft_seq_len}",
                 "rl": f"{inp.rl_micro_rows or inp.rl_rows} x {inp.rl_seq_len}"}
        shape["old_logp"] = shape["rl"]
        shape["sync"] = "-"
        w = 17
        lines.append(f"  {'GB per device':<27}" + "".join(f"{PHASES[p]:>{w}}" for p in phases))
        lines.append(f"  {'(micro-batch rows x T)':<27}" + "".join(f"{shape[p]:>{w}}" for p in phases))
        for row in ROWS:
            if any(self.phases[p][row] for p in phases):
                lines.append(f"  {row:<27}" + "".join(f"{self.phases[p][row] / GB:>{w}.2f}" for p in phases))
        lines.append(f"  {'total':<27}" + "".join(f"{self.total(p) / GB:>{w}.2f}" for p in phases))
        peak = f"peak {self.peak / GB:.2f} GB ({PHASES[self.peak_phase]})"
        if self.usable_bytes is None:
            lines.append(f"  {peak} per device (no device memory given: no verdict)")
            return "\n".join(lines)
        verdict = "fits" if self.fits else "DOES NOT FIT"
        dev = f"device memory {self.device_bytes / GB:.1f} GB x memory_fraction " \
              f"{self.usable_bytes / self.device_bytes:.2f} = " if self.device_bytes else ""
        lines.append(f"  {dev}usable {self.usable_bytes / GB:.1f} GB; {peak}; margin {self.margin:.1%} of usable "
                     f"(needs >= {MARGIN:.0%}): {verdict}")
        for p in (p for p in phases if p in ("sft", "rl")):
            best = self.largest_micro(p)
            rows = inp.sft_rows if p == "sft" else inp.rl_rows
            lines.append(f"  largest {p.upper()} micro-batch that fits: " + (
                f"{best} rows (of {rows}; {best // (data * fsdp)} per device)" if best else
                "none (not even one row per device)"))
        return "\n".join(lines)


def make_plan(inp: PlanInput, device_memory_gb: float | None = None, memory_fraction: float = 1.0) -> Plan:
    """The plan of ``inp``; with ``device_memory_gb`` (physical GB per device) a verdict against its
    usable share (:func:`usable_memory_gb`) less the margin."""
    phases = {"rl": _phase(inp, "rl")}
    if inp.old_logp_recompute or inp.reference_copy:
        phases["old_logp"] = _phase(inp, "old_logp")
    phases["sync"] = _phase(inp, "sync")
    if inp.sft_rows:
        phases = {"sft": _phase(inp, "sft"), **phases}
    usable = None if device_memory_gb is None else usable_memory_gb(device_memory_gb, memory_fraction)
    return Plan(inp=inp, device_bytes=None if device_memory_gb is None else int(device_memory_gb * GB),
                usable_bytes=None if usable is None else int(usable * GB), phases=phases)


def model_for_spec(spec: RunSpec, model: str | None = None) -> ModelConfig:
    """The run's model config: ``model.path``/config.json if it exists, else the preset ``model`` (or
    ``model.preset``, or the one the model path names), with the spec's dtype (as ``load_hf``)."""
    path = Path(str(spec.model.path)).expanduser() if spec.model.path else None
    if model is None and path is not None and (path / "config.json").is_file():
        return ModelConfig.from_hf(path, dtype=spec.model.dtype)
    name = model or spec.model.preset or (path.name if path is not None else None)
    if name is None:
        raise KeyError("no model: give model.path (with a config.json) or a preset name")
    return dataclasses.replace(preset(name), dtype=spec.model.dtype)


def from_spec(spec: RunSpec, model_cfg: ModelConfig, *, devices: int, devices_per_process: int,
              prompt_tokens: int | None = None, runtime_gb: float = 0.0) -> PlanInput:
    """The plan's input for a ``RunSpec``: the trainer's rows and lengths as ``run.recipe_main`` builds
    them (RL rows = schedule.problems_per_step x G, ``rl.micro_batch_size`` of them per micro-batch
    (None: all); T = ``spec.seq_len(prompt)`` (prompt + the largest budget) rounded up to
    ``learner.seq_bucket``, the prompt at most ``prompt_tokens`` (default ``data.max_prompt_tokens``,
    which the recipe enforces on the data); SFT rows sft.batch_size x sft.seq_len), the engines per
    ``spec.placement``, π_ref when ``rl.loss.kl_coef`` > 0, async snapshots by the async loop's
    lookahead (``async_rl.ahead``), the trainer mesh on ``learner.devices`` of each process's devices
    when split (the engines on the rest). Raises ``ValueError`` naming the numbers when the mesh or
    the engines do not match the devices, or when the engines' pool is not given in GiB."""
    seq = spec.seq_len(prompt_tokens)
    bucket = spec.learner.seq_bucket
    seq = -(-seq // bucket) * bucket
    pl, m, split = spec.placement, spec.mesh, spec.learner.devices
    tp = pl.devices_per_engine
    processes = devices // max(devices_per_process, 1)
    trainer = devices if split is None else split * processes
    try:
        mesh = m.shape(trainer)
    except ValueError as e:
        raise ValueError(f"the mesh (data {m.data}, fsdp {m.fsdp}, tensor {m.tensor}) does not match the run's "
                         f"{trainer} {'devices' if split is None else 'trainer devices'} ({processes} processes x "
                         f"{devices_per_process if split is None else f'{split} learner devices'}): {e}") from None
    if spec.engine.kv_memory_gb is None:
        raise ValueError("the plan needs engine.kv_memory_gb (the K/V pool per engine, GiB)")
    engine_devices = devices_per_process - (split or 0)
    return PlanInput(model=model_cfg, devices=devices, devices_per_process=devices_per_process,
                     mesh=mesh, rl_rows=spec.rows, rl_micro_rows=spec.rl.micro_batch_size, rl_seq_len=seq,
                     rl_chunk=spec.rl.logprob_chunk_size, sft_rows=spec.sft.batch_size,
                     sft_micro_rows=spec.sft.micro_batch_size, sft_seq_len=spec.sft.seq_len,
                     sft_chunk=spec.sft.logprob_chunk_size,
                     engines_per_process=(pl.engines_per_process if pl.engines_per_process is not None
                                          else engine_devices // tp),
                     devices_per_engine=tp, engine_weight_dtype=pl.weight_dtype or model_cfg.param_dtype,
                     kv_bytes_per_engine=int(spec.engine.kv_memory_gb * GB), runtime_bytes=int(runtime_gb * GB),
                     reference_copy=spec.rl.loss.kl_coef > 0,
                     old_logp_recompute=str(spec.rl.old_logp_source) == "recompute",
                     snapshot_lookahead=spec.async_rl.ahead, learner_devices_per_process=split)


def check_memory_fraction(memory_fraction: float, backend: str, environ: Mapping[str, str] = os.environ) -> None:
    """On an accelerator, ``$XLA_PYTHON_CLIENT_MEM_FRACTION`` (when set) must be the config's
    ``memory_fraction``: the plan fits the run into that share. CPU: no check (XLA ignores it there)."""
    value = environ.get(MEM_FRACTION_ENV)
    if backend == "cpu" or value in (None, ""):
        return
    try:
        got = float(value)
    except ValueError:
        raise ValueError(f"{MEM_FRACTION_ENV}={value!r} is not a number (the config's memory_fraction is "
                         f"{memory_fraction})") from None
    if abs(got - memory_fraction) > 1e-6:
        raise ValueError(f"{MEM_FRACTION_ENV}={value} but the config's memory_fraction is {memory_fraction}: the "
                         f"plan fits the run into {memory_fraction:.0%} of device memory, XLA would allocate "
                         f"{got:.0%}; set one to the other (the launch scripts export it from the config)")


def device_memory_gb(memory_fraction: float = 0.75) -> float | None:
    """Physical GB per device: ``$RSTAR2_DEVICE_MEMORY_GB`` (physical, like the CLI's ``--device-memory``),
    else what the first local device reports as XLA's limit (``bytes_limit``: already the usable share)
    divided by ``memory_fraction``, else None (CPU: no verdict). ``usable_memory_gb`` of it is the limit."""
    if os.environ.get(DEVICE_MEMORY_ENV):
        return float(os.environ[DEVICE_MEMORY_ENV])
    import jax

    stats = jax.local_devices()[0].memory_stats() or {}
    return stats["bytes_limit"] / GB / memory_fraction if stats.get("bytes_limit") else None


def _backend() -> str:
    import jax

    return jax.default_backend()


def check_spec(spec: RunSpec, *, where: str = "RunSpec") -> Plan | None:
    """The recipe's start-up check: plan ``spec`` on this run's devices; raise ``ValueError`` (prefixed
    with ``where``, the file) with the table when it does not fit (peak above usable memory less the
    margin), when the mesh or the engines do not match the devices (naming the numbers), or when
    ``$XLA_PYTHON_CLIENT_MEM_FRACTION`` disagrees with ``spec.memory_fraction`` (accelerators only).
    None (no verdict) when the device memory is unknown (CPU without ``$RSTAR2_DEVICE_MEMORY_GB``) or
    the model's shape is unknown (no config.json, no preset name). Asks JAX for the devices: call it
    after ``jax.distributed.initialize`` (the recipe does)."""
    fraction = float(spec.memory_fraction)
    try:
        check_memory_fraction(fraction, _backend())
        mem = device_memory_gb(fraction)
        if mem is None:
            return None
        try:
            model = model_for_spec(spec)
        except KeyError:
            return None
        import jax

        inp = from_spec(spec, model, devices=jax.device_count(), devices_per_process=jax.local_device_count())
        plan = make_plan(inp, mem, fraction)
        if not plan.fits:
            raise ValueError(f"the run does not fit the devices' memory ({mem:.1f} GB each, usable "
                             f"{plan.usable_bytes / GB:.1f} GB at memory_fraction {fraction}; python -m "
                             f"rstar2_jax.run.plan --config ... plans other settings):\n{plan.table()}")
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    return plan


def main(argv: list[str] | None = None) -> int:

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="a RunSpec file, JSON or YAML (experiments/configs/...)")
    ap.add_argument("--device-memory", type=float, default=None, help="physical GB per device (usable: x the "
                    "config's memory_fraction; default: none, no verdict)")
    ap.add_argument("--model", default=None, help=f"a preset ({', '.join(PRESETS)}); default: model.path's "
                    "config.json, else model.preset or the preset the path's name gives")
    ap.add_argument("--devices", type=int, default=None, help="all devices (default: the mesh's product)")
    ap.add_argument("--devices-per-process", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=None, help="longest rendered prompt assumed (default: the "
                    "spec's data.max_prompt_tokens)")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="override a spec field (dotted, repeatable): --set rl.micro_batch_size=32")
    args = ap.parse_args(argv)
    try:
        spec = load_spec(args.config, sets=args.set)  # paths are the cluster's: not checked here
    except ValueError as e:
        ap.error(str(e))
    mesh = spec.mesh
    devices = args.devices or (mesh.data * mesh.fsdp * mesh.tensor if -1 not in (mesh.data, mesh.fsdp, mesh.tensor)
                               else None)
    if devices is None:
        ap.error("the mesh has a -1 axis: give --devices")
    if not args.devices and spec.learner.devices:  # the mesh covers the learner's share of each process's devices
        devices = devices // spec.learner.devices * args.devices_per_process
    model = model_for_spec(spec, args.model)
    try:
        inp = from_spec(spec, model, devices=devices, devices_per_process=min(args.devices_per_process, devices),
                        prompt_tokens=args.prompt_tokens)
    except ValueError as e:
        ap.error(str(e))
    plan = make_plan(inp, args.device_memory, spec.memory_fraction)
    print(plan.table())
    return 0 if plan.fits is not False else 1


if __name__ == "__main__":
    sys.exit(main())
