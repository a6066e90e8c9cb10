"""The demo's command line: a ``RunSpec`` over the ``demo`` preset, and the run-control flags (no JAX devices).

Everything that defines the run is a field of the spec: ``--config FILE`` (JSON or YAML, over the
preset) and ``--set FIELD=VALUE`` (dotted, repeatable) change it; the demo's older flags
(``--budget 96``, ``--loss-kind gspo``, ...) are aliases, each translated to its dotted field by the
one table :data:`ALIASES` (applied before ``--set``, so a ``--set`` wins). The run-control flags
(``--out``, ``--resume``, ``--allow-changed``, ``--log``, ``--sft-cache``, ``--no-progress``) are not
part of the spec. ``--resume`` reads the run directory's saved ``run_spec.json`` back as the base (the
flags given again then change nothing, or are refused by the resume check unless allowed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any, Callable

from rstar2_jax.rl.config import ASYNC_CORRECTION, CorrectionConfig
from rstar2_jax.run.spec import SPEC_FILE, RunSpec, load_spec, parse_sets
from rstar2_jax.utils.config_io import to_plain
from rstar2_jax.utils.xla_flags import force_host_device_count

# --correction: rollout correction presets (rl/correction.py; docs/design.md §5.1); "auto": left to resolve
CORRECTIONS = {
    "none": CorrectionConfig(),
    "tis": CorrectionConfig(is_level="token", is_cap=2.0),  # truncated token IS (decoupled PPO with w = min(r, 2))
    "seq-tis": CorrectionConfig(is_level="sequence", is_cap=2.0),  # truncated sequence IS
    "token-mask": CorrectionConfig(mask_level="token", mask_lo=0.5, mask_hi=2.0),  # masked IS, per token
    "geo-mask": CorrectionConfig(mask_level="geometric", mask_lo=0.5, mask_hi=2.0),  # masked IS, geometric mean
}
ASYNC_PRESET = next(k for k, v in CORRECTIONS.items() if v == ASYNC_CORRECTION)  # what "auto" picks when K > 0


def _engine_dtype(v: str) -> dict[str, Any]:
    bf16 = v == "bfloat16"  # the engines' weights and their K/V pages (the trainer stays float32)
    return {"placement.weight_dtype": "bfloat16" if bf16 else None, "engine.kv_dtype": "bfloat16" if bf16 else None}


def _correction(v: str) -> dict[str, Any]:
    if v not in ("auto", *CORRECTIONS):
        raise ValueError(f"--correction must be one of {['auto', *CORRECTIONS]}, got {v!r}")
    return {} if v == "auto" else {"rl.correction": to_plain(CORRECTIONS[v])}


# old flag -> (argparse type, the dotted field it sets, or a function of its value -> {dotted field: value})
Alias = tuple[Callable[[str], Any] | None, str | Callable[[Any], dict[str, Any]]]
ALIASES: dict[str, Alias] = {
    "--roc-mode": (str, "rl.roc.mode"),
    "--regime": (str, "data.regime"),
    "--sft-traces": (int, "data.sft_traces"),
    "--copy-drills": (int, "data.copy_drills"),
    "--n-eval": (int, "data.n_eval"),
    "--sft-epochs": (float, "sft.epochs"),
    "--sft-lr": (float, "sft.optim.lr"),
    "--sft-batch": (int, "sft.batch_size"),
    "--sft-seq-len": (int, "sft.seq_len"),
    "--tokenizer": (str, "model.tokenizer"),
    "--bpe-vocab": (int, "model.bpe_vocab"),
    "--hidden": (int, "model.hidden"),
    "--layers": (int, "model.layers"),
    "--rl-steps": (int, "schedule.rl_steps"),
    "--problems-per-step": (int, "schedule.problems_per_step"),
    "--group": (int, "rl.roc.keep_per_group"),
    "--rl-lr": (float, "rl.optim.lr"),
    "--budget": (int, "rollout.budget"),
    "--loss-kind": (str, "rl.loss.kind"),
    "--adv-kind": (str, "rl.advantage.kind"),
    "--agg-mode": (str, "rl.loss.agg_mode"),
    "--kl-coef": (float, "rl.loss.kl_coef"),
    "--kl-estimator": (str, "rl.loss.kl_estimator"),
    "--entropy-coef": (float, "rl.loss.entropy_coef"),
    "--temperature": (float, "rl.temperature"),
    "--old-logp": (str, "rl.old_logp_source"),
    "--correction": (str, _correction),
    "--eval-every": (int, "eval.every"),
    "--engines": (int, "placement.engines_per_process"),
    "--devices-per-engine": (int, "placement.devices_per_engine"),
    "--engine-dtype": (str, _engine_dtype),
    "--slots": (int, "engine.slots"),
    "--learner-devices": (int, lambda v: {"learner.devices": v or None}),  # 0: shared with the engines
    "--sandbox-workers": (int, "sandbox.workers"),
    "--sandbox-backend": (str, "sandbox.backend"),
    "--ray-address": (str, "sandbox.ray_address"),
    "--exec-time": (int, lambda v: {"rollout.report_exec_time": bool(v)}),
    "--scripted-policy": (None, "rollout.scripted_policy"),
    "--max-errored": (int, "rollout.max_errored"),
    "--max-staleness": (int, "async_rl.max_staleness"),
    "--lookahead": (int, "async_rl.lookahead"),
    "--inflight-updates": (None, "async_rl.inflight"),
    "--stale": (str, "async_rl.stale"),
    "--ckpt-every": (int, "checkpoint.every"),
    "--ckpt-every-sft": (int, "checkpoint.every_sft"),
}
# --allow-changed also takes the old flag names (ckpt_every): their dotted fields
ALLOW_ALIASES = {flag[2:].replace("-", "_"): field for flag, (_, field) in ALIASES.items() if isinstance(field, str)}


def alias_sets(given: dict[str, Any]) -> dict[str, Any]:
    """``{old flag: value}`` -> ``{dotted field: value}`` through :data:`ALIASES`."""
    out: dict[str, Any] = {}
    for flag, value in given.items():
        field = ALIASES[flag][1]
        out.update(field(value) if callable(field) else {field: value})
    return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class DemoArgs:
    """The parsed command line: the run's spec and the run-control options."""

    spec: RunSpec
    out: Path
    resume: bool = False
    allow_changed: tuple[str, ...] = ()  # dotted spec fields (old flag names translated)
    log: tuple[str, ...] = ()  # extra metrics sinks: tensorboard, wandb
    sft_cache: str | None = None
    show_progress: bool = True


def parser(description: str | None = None) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 usage="%(prog)s [--config FILE] [--set FIELD=VALUE ...] [--seed N] [--out DIR] "
                                       "[--resume] [--allow-changed FIELDS] [an alias flag ...]")
    ap.add_argument("--config", default=None, help="a RunSpec file (JSON or YAML) over the demo preset")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                    help="override one spec field (dotted, repeatable): --set rl.loss.kind=gspo")
    ap.add_argument("--seed", type=int, default=None, help="the run's seed (spec field seed; default 0)")
    ap.add_argument("--out", default="runs/toy_tool_math")
    ap.add_argument("--resume", action="store_true",
                    help="continue from the latest checkpoint in --out, its run_spec.json as the base (refuses, "
                         "writing nothing, when none restores or a setting differs)")
    ap.add_argument("--allow-changed", default="",
                    help="--resume: spec fields allowed to differ from the saved run, comma-separated "
                         "(dotted, e.g. checkpoint.every, or an old flag name: ckpt_every)")
    ap.add_argument("--log", default="", help="extra metrics sinks besides metrics.jsonl: tensorboard, wandb "
                                              "(offline), comma-separated")
    ap.add_argument("--sft-cache", default=None,
                    help="directory: reuse an SFT policy saved there with the same settings, else train and save it")
    ap.add_argument("--no-progress", action="store_true")
    aliases = ap.add_argument_group("aliases", "the demo's older flags, each a --set of one spec field (ALIASES)")
    for flag, (kind, field) in ALIASES.items():
        where = field if isinstance(field, str) else "see ALIASES"
        if kind is None:
            aliases.add_argument(flag, action="store_const", const=True, default=None, help=where)
        else:
            aliases.add_argument(flag, type=kind, default=None, help=where)
    return ap


def parse_args(argv: list[str] | None = None) -> DemoArgs:
    """The command line as a resolved spec and options; an invalid spec is an ``argparse`` error (exit 2)
    naming the dotted field (and the file)."""
    ap = parser(__doc__)
    ns = ap.parse_args(argv)
    out = Path(ns.out)
    given = {flag: getattr(ns, flag[2:].replace("-", "_")) for flag in ALIASES}
    try:
        sets = alias_sets({k: v for k, v in given.items() if v is not None})
        if ns.seed is not None:
            sets["seed"] = ns.seed
        sets.update(parse_sets(ns.set))
        saved = out / SPEC_FILE
        if ns.resume and ns.config is None and saved.exists():
            spec = load_spec(saved, sets=sets)  # the whole saved spec: no preset under it
        else:
            spec = load_spec(ns.config, sets=sets, default_preset="demo")
    except ValueError as e:
        ap.error(str(e))
    allow = tuple(ALLOW_ALIASES.get(x.strip().replace("-", "_"), x.strip())
                  for x in ns.allow_changed.split(",") if x.strip())
    return DemoArgs(spec=spec, out=out, resume=ns.resume, allow_changed=allow,
                    log=tuple(x.strip() for x in ns.log.split(",") if x.strip()), sft_cache=ns.sft_cache,
                    show_progress=not ns.no_progress)


def use_host_devices(spec: RunSpec, who: str = "demo") -> int:
    """Fake CPU devices for ``spec``, before JAX starts its backend: the learner's (``learner.devices``,
    when disjoint) plus ``devices_per_engine`` per engine, so the engines run concurrently. Added to the
    user's XLA_FLAGS (a count they set is kept, and said when it differs); returns the count in effect."""
    p = spec.placement
    return force_host_device_count((spec.learner.devices or 0) + (p.engines_per_process or 1) * p.devices_per_engine,
                                   who=who)


def finished(args: DemoArgs) -> bool:
    """Whether ``args.out`` holds a finished run of exactly ``args.spec``: a ``summary.json`` beside a saved spec
    equal to it (what the ablation notebooks read back instead of training again)."""
    saved = args.out / SPEC_FILE
    return (args.out / "summary.json").exists() and saved.exists() and \
        json.loads(saved.read_text()) == to_plain(args.spec)
