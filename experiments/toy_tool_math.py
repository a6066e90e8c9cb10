"""The main job (``make demo``): SFT a tiny byte-level policy from scratch, then GRPO-RoC, on CPU.

Phases (each with a progress bar): toy problems -> SFT traces run through the real sandbox ->
SFT -> held-out eval -> RL steps (paged engines + capacity dispatcher + sandbox + verifier +
RoC + train step), held-out eval every ``--eval-every`` steps -> orbax checkpoint, metrics JSONL,
PNG plots and a summary table in ``--out``.
"""

from __future__ import annotations

import sys


def _flag(name: str, default: int, minimum: int = 1) -> int:
    v = next((a.split("=")[1] for a in sys.argv if a.startswith(f"--{name}=")), None)
    if v is None and f"--{name}" in sys.argv:
        v = sys.argv[sys.argv.index(f"--{name}") + 1]
    return max(minimum, int(v or default))


if "jax" not in sys.modules:  # fake CPU devices: devices_per_engine per engine (+ the learner's), so engines run concurrently
    from rstar2_jax.utils.xla_flags import force_host_device_count  # no JAX

    # added to the user's XLA_FLAGS (a count they set is kept, and said when it differs)
    force_host_device_count(_flag("learner-devices", 0, 0) + _flag("engines", 2) * _flag("devices-per-engine", 1),
                            who="toy_tool_math")

import argparse  # noqa: E402

import jax  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from flax import nnx  # noqa: E402

from rstar2_jax.train.async_loop import AsyncConfig  # noqa: E402
from rstar2_jax.data.chat import chat_segments, render_records  # noqa: E402
from rstar2_jax.data.regimes import REGIMES, get_regime  # noqa: E402
from rstar2_jax.data.sft_traces import build_traces, copy_drills  # noqa: E402
from rstar2_jax.data.toy import make_splits  # noqa: E402
from rstar2_jax.distributed import global_params  # noqa: E402
from rstar2_jax.eval import EvalConfig  # noqa: E402
from rstar2_jax.eval.load_policy import toy_model_config  # noqa: E402
from rstar2_jax.train.learner import LearnerConfig  # noqa: E402
from rstar2_jax.model import make_mesh  # noqa: E402
from rstar2_jax.model import Qwen3, split_policy  # noqa: E402
from rstar2_jax.model.config import MeshConfig, ModelConfig  # noqa: E402
from rstar2_jax.rewards import RewardFn  # noqa: E402
from rstar2_jax.rl import LossConfig, OptimConfig, RLConfig, RocConfig  # noqa: E402
from rstar2_jax.rl.checkpoint import Checkpointer, abstract_train_state  # noqa: E402
from rstar2_jax.rl.config import (AGG_MODES, ASYNC_CORRECTION, AdvantageConfig, AdvantageKind,  # noqa: E402
                                  CorrectionConfig, KLEstimator, LossKind)
from rstar2_jax.rollout.dispatcher import RolloutConfig  # noqa: E402
from rstar2_jax.rollout.service import Rollout  # noqa: E402
from rstar2_jax.rollout.template import TemplateConfig  # noqa: E402
from rstar2_jax.run.driver import OneStage, Parts, RunConfig, SFTPart, run, write_plots  # noqa: E402
from rstar2_jax.run.resume import ResumeError  # noqa: E402
from rstar2_jax.run.scripted import mixed_script  # noqa: E402
from rstar2_jax.sampling import EngineConfig, PagedEngine, Temperature  # noqa: E402
from rstar2_jax.deploy.placement import PlacementConfig, plan_placement  # noqa: E402
from rstar2_jax.testing.scripted import ScriptedPolicy  # noqa: E402
from rstar2_jax.deploy.weight_sync import WeightSync  # noqa: E402
from rstar2_jax.sandbox import SandboxLimits  # noqa: E402
from rstar2_jax.sandbox.backend import BACKENDS, open_pool  # noqa: E402
from rstar2_jax.train.sft import SFTConfig  # noqa: E402
from rstar2_jax.text.tokenizer import ByteTokenizer, HFTokenizer, train_byte_bpe  # noqa: E402

ROC_MODES = ("paper", "deterministic", "none")
# --correction: rollout correction presets (rl/correction.py; docs/design.md §5.1); "auto" resolves in parse_args
CORRECTIONS = {
    "none": CorrectionConfig(),
    "tis": CorrectionConfig(is_level="token", is_cap=2.0),  # truncated token IS (decoupled PPO with w = min(r, 2))
    "seq-tis": CorrectionConfig(is_level="sequence", is_cap=2.0),  # truncated sequence IS
    "token-mask": CorrectionConfig(mask_level="token", mask_lo=0.5, mask_hi=2.0),  # masked IS, per token
    "geo-mask": CorrectionConfig(mask_level="geometric", mask_lo=0.5, mask_hi=2.0),  # masked IS, geometric mean
}
ASYNC_PRESET = next(k for k, v in CORRECTIONS.items() if v == ASYNC_CORRECTION)  # what "auto" picks when K > 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/toy_tool_math")
    ap.add_argument("--roc-mode", default="paper", help=f"one of {ROC_MODES}")
    ap.add_argument("--regime", default="default", choices=sorted(REGIMES),
                    help="problems and SFT-trace imperfections (rstar2_jax/data/regimes.py); noisy-tools: "
                         "first tool calls often fail and are retried (the RoC ablation's regime)")
    ap.add_argument("--sft-traces", type=int, default=1500, help="SFT traces (from train problems)")
    ap.add_argument("--sft-epochs", type=float, default=4.0)
    ap.add_argument("--sft-lr", type=float, default=5e-3)
    ap.add_argument("--copy-drills", type=int, default=6000,
                    help="short echo records mixed into SFT so the tiny policy forms a copy circuit quickly")
    ap.add_argument("--sft-batch", type=int, default=12, help="packed rows per SFT step")
    ap.add_argument("--sft-seq-len", type=int, default=320, help="packed row length (attention cost grows with it)")
    ap.add_argument("--tokenizer", default="bpe", choices=("bpe", "byte"),
                    help="bpe: a byte-level BPE learned from the SFT texts (digits one per token); byte: raw bytes")
    ap.add_argument("--bpe-vocab", type=int, default=512, help="ids of the learned BPE (bytes + specials + merges)")
    ap.add_argument("--rl-steps", type=int, default=20)
    ap.add_argument("--problems-per-step", type=int, default=8)
    ap.add_argument("--group", type=int, default=4, help="G kept per problem (2G sampled)")
    ap.add_argument("--rl-lr", type=float, default=3e-4)
    ap.add_argument("--budget", type=int, default=192, help="response tokens per trajectory, tools included")
    ap.add_argument("--loss-kind", default="ppo_clip", choices=[k.value for k in LossKind],
                    help="policy surrogate (docs/design.md §5): ppo_clip is the paper's; each kind has its own "
                         "clip epsilons and aggregation unless --agg-mode is given")
    ap.add_argument("--adv-kind", default="grpo", choices=[k.value for k in AdvantageKind],
                    help="advantage estimator on the kept G (grpo: the paper's; dr_grpo: no std; rloo; reinforce_pp)")
    ap.add_argument("--agg-mode", default=None, choices=AGG_MODES,
                    help="loss aggregation; default: the loss kind's. seq-mean-token-sum-norm divides each "
                         "sequence's token sum by L_max = --budget (Dr.GRPO)")
    ap.add_argument("--kl-coef", type=float, default=0.0,
                    help="beta of a KL penalty to the frozen SFT policy (0 = off, the paper); the reference is saved "
                         "once in <out>/reference")
    ap.add_argument("--kl-estimator", default="k3", choices=[k.value for k in KLEstimator])
    ap.add_argument("--entropy-coef", type=float, default=0.0, help="entropy bonus coefficient (0 = off, the paper)")
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--n-eval", type=int, default=200, help="held-out problems")
    ap.add_argument("--engines", type=int, default=2, help="engines (per process)")
    ap.add_argument("--devices-per-engine", type=int, default=1,
                    help="tensor-parallel degree of each engine (engines x this <= local devices)")
    ap.add_argument("--slots", type=int, default=32, help="decode slots per engine")
    ap.add_argument("--learner-devices", type=int, default=0,
                    help="0: the learner and the engines share the devices (learner on device 0); N: the learner "
                         "trains on devices 0..N-1 (a mesh) and the engines take the next ones (disjoint placement)")
    ap.add_argument("--engine-dtype", default="float32", choices=("float32", "bfloat16"),
                    help="the engines' copy of the weights and their K/V pages (the trainer stays float32); "
                         "the sampler/trainer mismatch is train/mismatch/* (from the update's forward with --old-logp "
                         "sampler, from the recompute pass with recompute)")
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--sandbox-workers", type=int, default=2, help="local: pool workers; ray: workers per node")
    ap.add_argument("--sandbox-backend", default="local", choices=BACKENDS,
                    help="local: the embedded pool; ray: one sandbox actor per Ray node (pip install -e '.[ray]')")
    ap.add_argument("--ray-address", default=None, help="ray backend: cluster address (default: a local Ray)")
    ap.add_argument("--sft-cache", default=None,
                    help="directory: reuse an SFT policy saved there with the same settings, else train and save it")
    ap.add_argument("--temperature", type=float, default=1.0,
                    help="rollout sampling temperature; the trained policy is softmax(logits/T), the same distribution")
    ap.add_argument("--old-logp", default=None, choices=("sampler", "recompute"),
                    help="pi_old: the sampler's log-probs (temperature 1 only; saves a forward) or a trainer "
                         "recompute; default: sampler at temperature 1 without --correction, else recompute")
    ap.add_argument("--exec-time", type=int, default=0, choices=(0, 1),
                    help="1: tool responses report execution time (as rStar2's full template); "
                         "0 (toy default): reproducible tool text, so --resume reproduces a run exactly")
    ap.add_argument("--scripted-policy", action="store_true",
                    help="RL rollouts from a scripted policy over the real engines (a real tool call, then the right "
                         "answer for even samples, a wrong one for odd): every step updates; for tests (the golden)")
    ap.add_argument("--max-errored", type=int, default=0,
                    help="trajectories per rollout batch a failing engine command may error (counted, warned with "
                         "the traceback) before the step fails; 0: any failing command fails the step")
    ap.add_argument("--max-staleness", type=int, default=0,
                    help="asynchronous RL (docs/design.md §5.2): the rollout generates the next batches while the "
                         "learner trains; no trained token is more than K policy versions old. 0: synchronous")
    ap.add_argument("--lookahead", type=int, default=None,
                    help="async RL: batches the rollout may run ahead of the learner (default: --max-staleness); "
                         "more than K makes groups stale: dropped (or --stale keep)")
    ap.add_argument("--inflight-updates", action="store_true",
                    help="async RL: each update's weights reach the engines between two decode steps of the running "
                         "batch (sequences keep their K/V; each token carries the version that sampled it); the "
                         "schedule then depends on timing")
    ap.add_argument("--stale", default="drop", choices=("drop", "keep"),
                    help="async RL: a group with a sample more than K versions old is dropped whole, or kept")
    ap.add_argument("--correction", default="auto", choices=("auto", *CORRECTIONS),
                    help="rollout correction against the sampler's log-probs (needs --old-logp recompute): tis = "
                         "truncated token IS (C = 2), seq-tis = per sequence, token-mask / geo-mask = masked IS "
                         f"(ratio outside [0.5, 2]); auto: {ASYNC_PRESET} with --max-staleness >= 1 (unless "
                         "--old-logp sampler or --scripted-policy), else none")
    ap.add_argument("--ckpt-every", type=int, default=5, help="RL steps between checkpoints")
    ap.add_argument("--ckpt-every-sft", type=int, default=20, help="SFT steps between checkpoints")
    ap.add_argument("--resume", action="store_true",
                    help="continue from the latest checkpoint in --out (refuses, writing nothing, when none restores "
                         "or a setting differs)")
    ap.add_argument("--allow-changed", default=[], type=lambda s: [x.strip().replace("-", "_") for x in s.split(",")
                                                                    if x.strip()],
                    help="--resume: settings allowed to differ from the saved run, comma-separated (e.g. ckpt_every)")
    ap.add_argument("--log", default=[], type=lambda s: [x.strip() for x in s.split(",") if x.strip()],
                    help="extra metrics sinks besides metrics.jsonl: tensorboard, wandb (offline), comma-separated")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    errors = []
    if args.roc_mode not in ROC_MODES:
        errors.append(f"--roc-mode must be one of {ROC_MODES}, got {args.roc_mode!r}")
    for name in ("sft_traces", "problems_per_step", "group", "budget", "eval_every", "n_eval", "engines", "slots",
                 "hidden", "layers", "sandbox_workers", "devices_per_engine", "ckpt_every", "ckpt_every_sft", "sft_batch", "sft_seq_len"):
        if getattr(args, name) < 1:
            errors.append(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for name in ("rl_steps", "copy_drills", "max_staleness", "learner_devices", "max_errored"):
        if getattr(args, name) < 0:
            errors.append(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    if args.correction == "auto":  # asynchronous runs are corrected, unless pi_old is explicitly the sampler's
        async_ok = args.max_staleness > 0 and args.old_logp != "sampler" and not args.scripted_policy
        args.correction = ASYNC_PRESET if async_ok else "none"
    if args.old_logp is None:
        args.old_logp = ("sampler" if args.temperature == 1.0 and not args.scripted_policy
                         and args.correction == "none" else "recompute")
    if args.correction != "none" and args.old_logp == "sampler":
        errors.append(f"--correction {args.correction} needs --old-logp recompute (pi_prox; with the sampler's "
                      "pi_old every correction is the identity)")
    if args.correction != "none" and args.scripted_policy:
        errors.append(f"--correction {args.correction} needs sampler log-probs: a --scripted-policy has none")
    if args.scripted_policy and args.old_logp == "sampler":
        errors.append("--scripted-policy needs --old-logp recompute (the sampler's log-probs are not the script's)")
    if args.old_logp == "sampler" and args.temperature != 1.0:
        errors.append(f"--old-logp sampler needs --temperature 1 (sampler log-probs are temperature-1), "
                      f"got {args.temperature}")
    for name in ("kl_coef", "entropy_coef"):
        if getattr(args, name) < 0:
            errors.append(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    for name in ("sft_epochs", "sft_lr", "rl_lr", "temperature"):
        if not getattr(args, name) > 0:
            errors.append(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    if args.bpe_vocab < ByteTokenizer().vocab_size:
        errors.append(f"--bpe-vocab must be >= {ByteTokenizer().vocab_size} (bytes + specials), got {args.bpe_vocab}")
    if args.hidden % 4:
        errors.append(f"--hidden must be a multiple of 4 (heads), got {args.hidden}")
    if args.inflight_updates and args.max_staleness < 1:
        errors.append("--inflight-updates needs --max-staleness >= 1 (asynchronous RL)")
    if args.lookahead is not None and args.lookahead < 0:
        errors.append(f"--lookahead must be >= 0, got {args.lookahead}")
    if errors:
        ap.error("; ".join(errors))
    return args


def build_model(args: argparse.Namespace, vocab: int) -> ModelConfig:
    return toy_model_config(vars(args), vocab)  # one definition, shared with the eval loader


def make_engines(graphdef, params, mcfg: ModelConfig, args, max_seq_len: int, tok) -> list[PagedEngine]:
    """``--engines`` engines of ``--devices-per-engine`` local devices each (``deploy.placement``)."""
    bf16 = args.engine_dtype == "bfloat16"
    placement = plan_placement(PlacementConfig(devices_per_engine=args.devices_per_engine,
                                               engines_per_process=args.engines,
                                               weight_dtype="bfloat16" if bf16 else None), mcfg,
                               jax.local_devices()[args.learner_devices:])  # after the learner's, if disjoint
    print(placement.table(), placement.line(), sep="\n")
    page_size = 16
    pages = args.slots * math.ceil(max_seq_len / page_size) // 2 + 8  # ~half the worst case: paging pays
    ecfg = EngineConfig(num_slots=args.slots, page_size=page_size, max_seq_len=max_seq_len, num_pages=pages,
                        prefill_chunk=128, kv_dtype="bfloat16" if bf16 else None)
    placed = WeightSync(placement.layouts).place(params)
    return [PagedEngine(graphdef, p, mcfg, ecfg, decode_fn=tok.decode, layout=lay)
            for p, lay in zip(placed, placement.layouts)]


def make_tokenizer(args: argparse.Namespace, records: list[dict], tpl: TemplateConfig, out: Path):
    """The run's tokenizer: raw bytes, or a byte-level BPE learned from the rendered SFT texts and
    saved as ``<out>/tokenizer.json`` (reloaded from there on ``--resume``, so ids never change)."""
    if args.tokenizer == "byte":
        return ByteTokenizer()
    if args.resume and (out / "tokenizer.json").exists():
        return HFTokenizer(out)
    texts = ["".join(text for text, _ in chat_segments(rec["messages"], tpl, record=r))
             for r, rec in enumerate(records)]
    tok = train_byte_bpe(texts, args.bpe_vocab)
    tok.save(out)
    return tok


def loss_config(args: argparse.Namespace) -> LossConfig:
    """The RL loss the flags ask for; ``seq-mean-token-sum-norm``'s L_max is the response budget."""
    return LossConfig(kind=args.loss_kind, agg_mode=args.agg_mode,
                      norm_len=args.budget if args.agg_mode == "seq-mean-token-sum-norm" else None,
                      kl_coef=args.kl_coef, kl_estimator=args.kl_estimator, entropy_coef=args.entropy_coef)


def _sft_key(args: argparse.Namespace) -> str:
    keys = ("regime", "seed", "sft_traces", "copy_drills", "sft_epochs", "sft_lr", "sft_batch", "sft_seq_len", "hidden",
            "layers", "exec_time", "tokenizer", "bpe_vocab")
    return "sft_" + "_".join(f"{k}={getattr(args, k)}" for k in keys)


def load_sft_cache(args, params, sft_cfg: SFTConfig):
    """(state, sft rows) cached for these settings, or None."""
    d = Path(args.sft_cache) / _sft_key(args) if args.sft_cache else None
    if d is None or not (d / "sft_metrics.jsonl").exists():
        return None
    if (Path(args.out) / "tokenizer.json").exists() and (d / "tokenizer.json").read_text() != (
            Path(args.out) / "tokenizer.json").read_text():
        return None  # trained with other ids
    with Checkpointer(d / "ckpt", max_to_keep=1) as ckpt:
        restored = ckpt.restore(abstract_train_state(params, sft_cfg.rl_view()))
    if restored is None:
        return None
    rows = [json.loads(x) for x in (d / "sft_metrics.jsonl").read_text().splitlines()]
    return restored.state, [{**r, "stage": "sft", "sft_step": r.get("sft_step", r.get("step")), "step": 0}
                            for r in rows]


def save_sft_cache(args, state, sft_cfg: SFTConfig, log: list[dict]) -> None:
    if not args.sft_cache:
        return
    d = Path(args.sft_cache) / _sft_key(args)
    with Checkpointer(d / "ckpt", max_to_keep=1) as ckpt:
        ckpt.save(state, config=sft_cfg.rl_view())
    if (Path(args.out) / "tokenizer.json").exists():
        (d / "tokenizer.json").write_text((Path(args.out) / "tokenizer.json").read_text())
    (d / "sft_metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))


def run_config(args: argparse.Namespace) -> dict:
    """The settings that define the run (compared on --resume): every flag but the run-control ones
    (``correction`` and ``max_errored`` only when set, so a run saved before those flags existed resumes)."""
    return {k: v for k, v in vars(args).items() if k not in ("resume", "no_progress", "allow_changed", "log")
            and (k, v) not in (("correction", "none"), ("max_errored", 0))}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    out = Path(args.out)
    show = not args.no_progress
    tpl = TemplateConfig.toy(report_exec_time=args.exec_time)
    t_start = time.perf_counter()
    timings: dict[str, float] = {}

    regime = get_regime(args.regime)
    train, heldout = make_splits(args.seed, args.sft_traces + max(args.rl_steps * args.problems_per_step, 1),
                                 args.n_eval, regime.toy)
    sft_problems, rl_problems = train[: args.sft_traces], train[args.sft_traces:]
    limits = SandboxLimits(wall_s=3.0, cpu_s=3.0, memory_mb=2048,
                           preload=("numpy", "sympy", "rstar2_jax.rewards.worker"))
    sft_cfg = SFTConfig(seq_len=args.sft_seq_len, batch_size=args.sft_batch, epochs=args.sft_epochs, logprob_chunk_size=256,
                        optim=OptimConfig(lr=args.sft_lr, warmup_steps=20, weight_decay=0.01))
    rl_cfg = RLConfig(roc=RocConfig(keep_per_group=args.group, mode=args.roc_mode),
                      optim=OptimConfig(lr=args.rl_lr, warmup_steps=3, weight_decay=0.01, max_grad_norm=1.0),
                      advantage=AdvantageConfig(kind=args.adv_kind), loss=loss_config(args), logprob_chunk_size=128, old_logp_source=args.old_logp,
                      temperature=args.temperature, correction=CORRECTIONS[args.correction])

    with open_pool(args.sandbox_backend, workers=args.sandbox_workers, limits=limits,
                   ray_address=args.ray_address) as pool:
        reward_fn = RewardFn(pool=pool).batch
        t = time.perf_counter()
        traces = build_traces(sft_problems, pool=pool, cfg=regime.traces, template_cfg=tpl, seed=args.seed)
        records = traces + copy_drills(args.copy_drills, seed=args.seed)
        tok = make_tokenizer(args, records, tpl, out)
        examples = render_records(records, tok, tpl)
        timings["traces_s"] = time.perf_counter() - t

        mcfg = build_model(args, tok.vocab_size)
        graphdef, params = split_policy(Qwen3(mcfg, rngs=nnx.Rngs(args.seed)))
        mesh = None
        if args.learner_devices:  # disjoint: the learner's mesh on the first devices, the engines after them
            mesh = make_mesh(MeshConfig(), jax.local_devices()[: args.learner_devices])
            params = global_params(params, mesh)
        max_seq_len = max(len(e[0]) for e in examples) + args.budget + 64

        def make_rollout(params):
            engines = make_engines(graphdef, params, mcfg, args, max_seq_len, tok)
            rollout_cfg = RolloutConfig(n_samples=2 * args.group, budget=args.budget, template=tpl,
                                        sampler=Temperature(temperature=args.temperature),
                                        max_errored=args.max_errored)
            rl_engines = engines
            if args.scripted_policy:  # held-out evaluation still samples the trained policy
                script = mixed_script(rl_problems, tok, tpl)
                rl_engines = [ScriptedPolicy(e, script) for e in engines]
            return Rollout(rl_engines, pool, tok, rollout_cfg), engines

        parts = Parts(
            graphdef=graphdef, params=params, mesh=mesh, rl=rl_cfg, pad_id=tok.pad_id,
            learner=LearnerConfig(rl=rl_cfg, seq_len=max_seq_len, rows=args.problems_per_step * args.group),
            make_rollout=make_rollout, pool=pool, tokenizer=tok, reward_fn=reward_fn,
            schedule=OneStage(problems_list=rl_problems, steps=args.rl_steps, problems_per_step=args.problems_per_step),
            sft=SFTPart(cfg=sft_cfg, shards=1, load_shard=lambda s: examples, ckpt_every=args.ckpt_every_sft,
                        cache_load=lambda: load_sft_cache(args, params, sft_cfg),
                        cache_save=lambda st, rows: save_sft_cache(args, st, sft_cfg, rows)),
            eval_problems=heldout, eval_cfg=EvalConfig(k=1, budget=args.budget, template=tpl),
            async_rl=AsyncConfig(max_staleness=args.max_staleness, lookahead=args.lookahead, stale=args.stale,
                                 inflight=args.inflight_updates))
        rc = RunConfig(out=out, seed=args.seed, ckpt_every=args.ckpt_every, eval_every=args.eval_every,
                       resume=args.resume, allow_changed=tuple(args.allow_changed), sinks=("jsonl", *args.log),
                       run_config=run_config(args), show_progress=show,
                       files={"args.json": json.dumps(vars(args), indent=2),
                              "config.json": json.dumps(mcfg.to_hf(), indent=2)})  # the policy's shape, HF-style
        try:
            res = run(parts, rc, abstract_train_state(params, rl_cfg))
        except ResumeError as e:
            raise SystemExit(str(e)) from None
        if res.resumed_from is not None:
            print(f"resume: from {json.dumps(res.resumed_from)}")
    timings.update(res.timings)
    timings["total_s"] = time.perf_counter() - t_start
    write_plots(res.rows, out)
    summary = summarize_run(args, res.rows, timings)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print_summary(summary, out)
    return summary


def summarize_run(args, rows: list[dict], timings: dict) -> dict:
    evals = [r for r in rows if r.get("heldout_acc") is not None]
    first, last = evals[0], evals[-1]
    sft_log = [r for r in rows if r.get("stage") == "sft"]
    return {
        "seed": args.seed, "roc_mode": args.roc_mode, "rl_steps": args.rl_steps,
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


if __name__ == "__main__":
    main()
