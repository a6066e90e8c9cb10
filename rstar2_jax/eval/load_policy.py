"""Policies for evaluation: where the weights, the model shape and the tokenizer come from.

Three sources, one result (:class:`Policy`):

* an HF safetensors directory (``config.json`` + ``model.safetensors[.index.json]`` +
  ``tokenizer.json``): :func:`load_hf_policy`;
* an orbax checkpoint of a ``TrainState`` (``rl.checkpoint.Checkpointer``): :func:`load_checkpoint_policy`.
  Either a toy run directory (``<run>/run_spec.json`` + ``<run>/checkpoint``, written by the demo,
  ``rstar2_jax/run/demo.py``; its ``tokenizer.json`` if it has one, else the byte tokenizer; toy template) or a checkpoint directory plus an
  HF ``config.json`` giving the model shape (tokenizer from that directory's ``tokenizer.json``, or
  the byte tokenizer when the vocabulary is the byte tokenizer's);
* a tiny random policy with the byte tokenizer, for smoke tests: :func:`random_tiny_policy`.

Only the parameters are used. The checkpoint is restored whole (the optimizer state's structure does
not depend on ``RLConfig``'s numbers, so ``RLConfig()`` describes any checkpoint's ``TrainState``)
because ``Checkpointer.restore`` checks its integrity fingerprint over the whole state.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from flax import nnx
from jax.sharding import Mesh

from rstar2_jax.model import Qwen3, split_policy
from rstar2_jax.model.config import ModelConfig
from rstar2_jax.rollout.template import TemplateConfig
from rstar2_jax.sampling import EngineConfig, PagedEngine
from rstar2_jax.text.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer

TEMPLATES = ("full", "toy")


class PolicyLoadError(ValueError):
    """A policy source that cannot be loaded: names the path and what is wrong with it."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Policy:
    graphdef: nnx.GraphDef
    params: nnx.State
    model_cfg: ModelConfig
    tokenizer: Tokenizer
    template: str  # "full" | "toy": the template this policy was trained with (the CLI default)
    source: str  # what was loaded, for reports


def template_config(name: str) -> TemplateConfig:
    """``"full"``: the rStar2 system prompt with the tools block; ``"toy"``: the toy demo's short one."""
    if name not in TEMPLATES:
        raise ValueError(f"template must be one of {TEMPLATES}, got {name!r}")
    return TemplateConfig() if name == "full" else TemplateConfig.toy()

RUN_SPEC = "run_spec.json"  # the file a run directory saves its whole RunSpec in (run.spec.SPEC_FILE)


def toy_model_config(model: Mapping[str, Any], vocab_size: int) -> ModelConfig:
    """The toy demo's model shape from its spec's ``model`` section (``hidden``, ``layers``; the run
    directory's ``run_spec.json``); ``run.demo.build_model`` builds the demo's policy with it."""
    hidden, layers = int(model["hidden"]), int(model["layers"])
    return ModelConfig(vocab_size=vocab_size, hidden_size=hidden, num_layers=layers, num_heads=4,
                       num_kv_heads=2, head_dim=hidden // 4, intermediate_size=4 * hidden,
                       rope_theta=10_000.0, max_position_embeddings=4096,
                       initializer_range=None)  # the fan-in init the demo's golden and figures were measured with


def _check_vocab(tok: Tokenizer, cfg: ModelConfig, where: str) -> None:
    if tok.vocab_size > cfg.vocab_size:
        raise PolicyLoadError(f"{where}: tokenizer has {tok.vocab_size} ids but the model only "
                              f"{cfg.vocab_size} embeddings")


def load_hf_policy(path: str | Path, *, mesh: Mesh | None = None, dtype: str | None = None) -> Policy:
    """An HF directory: weights via ``model.hf_io.load_hf``, tokenizer from ``<path>/tokenizer.json``."""
    from rstar2_jax.model.hf_io import load_hf

    path = Path(path).expanduser()
    if not path.is_dir():
        raise PolicyLoadError(f"HF model directory not found: {path}")
    if not (path / "tokenizer.json").exists():
        raise PolicyLoadError(f"{path}: no tokenizer.json (the HF tokenizer is read from the model directory)")
    graphdef, params, cfg = load_hf(path, mesh=mesh, dtype=dtype, param_dtype=dtype)
    tok = HFTokenizer(path)
    _check_vocab(tok, cfg, str(path))
    return Policy(graphdef=graphdef, params=params, model_cfg=cfg, tokenizer=tok, template="full",
                  source=f"hf:{path}")


def _abstract_params(cfg: ModelConfig) -> tuple[nnx.GraphDef, nnx.State]:
    return nnx.split(nnx.eval_shape(lambda: Qwen3(cfg, rngs=nnx.Rngs(0))))


def _resolve_checkpoint(path: Path, config: str | Path | None,
                        tokenizer: str | Path | None) -> tuple[Path, ModelConfig, Tokenizer, str, str]:
    """(orbax directory, model shape, tokenizer, template, where the shape came from) for a run
    directory or a bare checkpoint directory."""
    spec_file = path / RUN_SPEC  # a toy run directory's whole spec (run.spec.SPEC_FILE)
    run_dir = spec_file.exists() and (path / "checkpoint").is_dir()
    ckpt_dir = path / "checkpoint" if run_dir else path
    if run_dir and config is None:  # a toy run: shape from its spec's model section, its tokenizer, toy template
        model = json.loads(spec_file.read_text()).get("model", {})
        if tokenizer is None and (path / "tokenizer.json").exists():
            tokenizer = path  # the run's learned BPE
        tok = HFTokenizer(tokenizer) if tokenizer else ByteTokenizer()
        try:
            cfg = toy_model_config(model, tok.vocab_size)
        except KeyError as e:
            raise PolicyLoadError(f"{spec_file}: missing field model.{e.args[0]} (not a toy run?)") from None
        return ckpt_dir, cfg, tok, "toy", str(spec_file)
    if config is None:
        if not (path / "config.json").exists():
            raise PolicyLoadError(f"{path}: an orbax checkpoint needs the model shape: pass an HF config.json "
                                  "(--config), or give a toy run directory (run_spec.json + checkpoint/)")
        config = path
    config = Path(config).expanduser()
    try:
        cfg = ModelConfig.from_hf(config)
    except (FileNotFoundError, ValueError) as e:
        raise PolicyLoadError(str(e)) from None
    conf_dir = config if config.is_dir() else config.parent
    if tokenizer is not None:
        tok = HFTokenizer(tokenizer)
    elif (conf_dir / "tokenizer.json").exists():
        tok = HFTokenizer(conf_dir)
    elif cfg.vocab_size == ByteTokenizer().vocab_size:
        tok = ByteTokenizer()
    else:
        raise PolicyLoadError(f"{conf_dir}: no tokenizer.json next to the config and the vocabulary "
                              f"({cfg.vocab_size}) is not the byte tokenizer's; pass --tokenizer")
    template = "toy" if isinstance(tok, ByteTokenizer) else "full"
    return ckpt_dir, cfg, tok, template, str(config)


def _key_str(path) -> str:
    parts = []
    for e in path:
        for attr in ("key", "name", "idx"):
            if hasattr(e, attr):
                parts.append(str(getattr(e, attr)))
                break
    return "/".join(parts)


def _check_saved_shapes(step_dir: Path, abstract: nnx.State, shape_from: str) -> None:
    """Compare the saved ``params`` shapes (orbax metadata, no array read) with the model's, so a wrong
    config names the parameter instead of failing inside the restore."""
    import jax
    import orbax.checkpoint as ocp

    try:
        md = ocp.PyTreeCheckpointHandler().metadata(step_dir / "state")
        saved_tree = getattr(md, "tree", md)["params"]
        saved = {_key_str(p): tuple(m.shape) for p, m in jax.tree_util.tree_leaves_with_path(saved_tree)}
    except Exception:  # noqa: BLE001 - unreadable metadata: the restore reports it
        return
    want = {_key_str(p): tuple(x.shape) for p, x in jax.tree_util.tree_leaves_with_path(abstract)}
    for name in sorted(want.keys() | saved.keys()):
        if want.get(name) != saved.get(name):
            raise PolicyLoadError(f"{step_dir}: parameter {name!r} has shape {saved.get(name, 'missing')} in the "
                                  f"checkpoint but {want.get(name, 'none')} in the model from {shape_from}")


def load_checkpoint_policy(path: str | Path, *, config: str | Path | None = None,
                           tokenizer: str | Path | None = None, step: int | None = None,
                           mesh: Mesh | None = None) -> Policy:
    """Params of the newest readable checkpoint (or ``step``'s) in ``path``.

    ``path``: a toy run directory (``run_spec.json`` + ``checkpoint/``) or an orbax ``Checkpointer``
    directory; ``config``: an HF ``config.json`` (file or directory) for the shape (default:
    ``<path>/config.json``; for a run directory: its ``run_spec.json``); ``tokenizer``: a
    ``tokenizer.json`` (file or directory) overriding the default described in the module docstring.
    """
    from rstar2_jax.rl.checkpoint import Checkpointer, abstract_train_state
    from rstar2_jax.rl.config import RLConfig

    path = Path(path).expanduser()
    if not path.is_dir():
        raise PolicyLoadError(f"checkpoint directory not found: {path}")
    ckpt_dir, cfg, tok, template, shape_from = _resolve_checkpoint(path, config, tokenizer)
    if not ckpt_dir.is_dir():  # checked first: Checkpointer would create it
        raise PolicyLoadError(f"checkpoint directory not found: {ckpt_dir}")
    _check_vocab(tok, cfg, str(path))
    graphdef, abstract = _abstract_params(cfg)
    with Checkpointer(ckpt_dir, max_to_keep=1) as ckpt:
        steps = [s for s in ckpt.all_steps() if step is None or s <= step]
        where = "" if step is None else f" at or before step {step}"
        if not steps:
            raise PolicyLoadError(f"{ckpt_dir}: no checkpoints{where} (expected <step>/state and <step>/meta)")
        _check_saved_shapes(ckpt_dir / str(steps[-1]), abstract, shape_from)
        restored = ckpt.restore(abstract_train_state(abstract, RLConfig(), mesh), step=step)
    if restored is None:
        raise PolicyLoadError(f"{ckpt_dir}: no readable checkpoint{where} (see the warnings above)")
    return Policy(graphdef=graphdef, params=restored.state.params, model_cfg=cfg, tokenizer=tok,
                  template=template, source=f"orbax:{ckpt_dir}@{restored.step}")


def random_tiny_policy(seed: int = 0) -> Policy:
    """A tiny random Qwen3-style policy over the byte tokenizer (smoke tests; it answers nonsense)."""
    tok = ByteTokenizer()
    cfg = ModelConfig.tiny(vocab_size=tok.vocab_size, max_position_embeddings=8192)
    graphdef, params = split_policy(Qwen3(cfg, rngs=nnx.Rngs(seed)))
    return Policy(graphdef=graphdef, params=params, model_cfg=cfg, tokenizer=tok, template="toy",
                  source=f"random-tiny:seed={seed}")


def load_policy(*, hf: str | Path | None = None, checkpoint: str | Path | None = None,
                config: str | Path | None = None, tokenizer: str | Path | None = None, random_tiny: bool = False,
                step: int | None = None, seed: int = 0, dtype: str | None = None,
                mesh: Mesh | None = None) -> Policy:
    """Exactly one of ``hf`` (:func:`load_hf_policy`), ``checkpoint`` (:func:`load_checkpoint_policy`
    with ``config``/``tokenizer``/``step``) or ``random_tiny`` (:func:`random_tiny_policy` with ``seed``)."""
    if sum((hf is not None, checkpoint is not None, bool(random_tiny))) != 1:
        raise PolicyLoadError("give exactly one policy source: hf, checkpoint or random_tiny")
    if (config is not None or tokenizer is not None or step is not None) and checkpoint is None:
        raise PolicyLoadError("config, tokenizer and step only apply to an orbax checkpoint")
    if hf is not None:
        return load_hf_policy(hf, mesh=mesh, dtype=dtype)
    if checkpoint is not None:
        return load_checkpoint_policy(checkpoint, config=config, tokenizer=tokenizer, step=step, mesh=mesh)
    return random_tiny_policy(seed)


def build_engines(policy: Policy, *, n_engines: int, slots: int, max_seq_len: int, page_size: int = 16,
                  kv_memory_bytes: int | None = None, prefill_chunk: int = 256) -> list[PagedEngine]:
    """``n_engines`` paged engines sharing the policy's params.

    KV pool per engine: ``kv_memory_bytes`` when given, else every slot's worst case (``slots *
    ceil(max_seq_len / page_size)`` pages + the null page), so the normal path never preempts.
    """
    num_pages = None if kv_memory_bytes else slots * math.ceil(max_seq_len / page_size) + 1
    ecfg = EngineConfig(num_slots=slots, page_size=page_size, max_seq_len=max_seq_len, num_pages=num_pages,
                        kv_memory_bytes=kv_memory_bytes or None, prefill_chunk=prefill_chunk)
    return [PagedEngine(policy.graphdef, policy.params, policy.model_cfg, ecfg, decode_fn=policy.tokenizer.decode)
            for _ in range(n_engines)]


def prompt_lengths(problems: Sequence[Any], tokenizer: Tokenizer, template: TemplateConfig) -> list[int]:
    """Token count of each problem's rendered prompt (system + user + generation prompt)."""
    from rstar2_jax.rollout.template import render_prompt

    return [len(tokenizer.encode(render_prompt(str(p.problem), template))) for p in problems]
