"""The run driver shared by the demo and the recipe: stages, data order, evaluation and checkpoint
cadence, metrics, resume. The scripts build the parts (policy, SFT data, rollout service, reward,
problems, a ``Schedule``) and call :func:`run`.

    sft (optional) -> RL stages as the schedule says (-> filter -> RL) -> done

* **Stages**: ``sft`` (``sft.train_sft_shards``: each process packs and feeds its own shards), the RL
  stages (one ``train.step.rl_step`` per step on the next ``problems_per_step`` problems of the stage's
  list, wrapping around; a stage changes only the budget), ``filter`` (the policy samples k answers
  per problem, sharded over processes and gathered; problems solved k/k are dropped, the optimizer
  moments reset) and ``done``. The schedule decides the transitions.
* **Seeds**: RL step ``g`` (1-based over every stage) uses ``resume.step_seed(seed, g)``; evaluation
  and the filter use ``seed``.
* **Evaluation** (held-out, sharded and gathered): after SFT (step 0), every ``eval_every`` RL steps
  and after the last one; its numbers join that step's metrics row (``heldout_*``).
* **Checkpoints** (orbax; every process saves its shards): every ``ckpt_every`` SFT or RL steps, at
  every transition and at the end, with the versioned ``resume.Cursor`` and the run configuration.
* **Asynchronous RL** (``Parts.async_rl``, ``async_loop.AsyncConfig``; docs/design.md §5.2): with
  ``max_staleness`` k >= 1 a background thread generates up to L (``lookahead``, default k) batches
  ahead while the learner trains (``train.async_loop.AsyncRL``); k = 0 is ``train.step.rl_step``, unchanged.
  Batches are requested only up to the next drain point (a checkpoint step, an evaluation step, the
  stage's last step); a stage change no one could foresee discards what is in flight. At a drain point
  the engines get the learner's weights, so a checkpoint never has a batch in flight and a resumed
  run continues on the schedule of an uninterrupted one. Problems go to batches and refill rounds
  (dynamic sampling) in request order, from the cursor at the last drain point.
* **Several processes**: every process runs this same code; rows are global metrics, written by
  process 0 only (``utils.metrics.Loggers``), as are the evaluation files.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

import jax
from tqdm.auto import tqdm

from rstar2_jax.train.async_loop import AsyncConfig, AsyncRL
from rstar2_jax.distributed import allgather_json, is_main_process
from rstar2_jax.eval.evaluate import EvalConfig, evaluate
from rstar2_jax.train.learner import Learner, LearnerConfig
from rstar2_jax.train.step import Refill, rl_step
from rstar2_jax.rl.config import RLConfig
from rstar2_jax.rl.reference import load_reference, save_reference
from rstar2_jax.rl.train_step import TrainState, init_train_state, reset_optimizer
from rstar2_jax.rollout.service import Rollout
from rstar2_jax.run.resume import Cursor, open_checkpoints, step_seed
from rstar2_jax.run.spec_parts import DynamicSamplingSpec
from rstar2_jax.data.curriculum import Curriculum, CurriculumSpec, pass_rates
from rstar2_jax.train.refill import round_seed
from rstar2_jax.sampling import Engine
from rstar2_jax.sandbox import SandboxBackend
from rstar2_jax.train.sft import SFTConfig, shard_owner, train_sft_shards
from rstar2_jax.utils.compiles import CompileCounter
from rstar2_jax.utils.metrics import Loggers

Examples = Sequence[tuple[list[int], list[int]]]


class Schedule(Protocol):
    """The stage logic of a run (``recipe.RecipeSchedule``; the demo's ``OneStage``)."""

    rl_stages: tuple[str, ...]  # in order; the first follows SFT
    problems_per_step: int

    def budget(self, stage: str) -> int | None: ...

    def problems(self, stage: str, cursor: Cursor) -> Sequence[Any]: ...

    def next_stage(self, stage: str, cursor: Cursor) -> str: ...  # after cursor.stage_step steps of stage

    def filter_problems(self) -> Sequence[Any]: ...  # the filter stage's pool

    def filter_eval(self) -> tuple[EvalConfig, int]: ...  # (sampling, k)


@dataclasses.dataclass(frozen=True, kw_only=True)
class OneStage:
    """One RL stage ``rl`` of ``steps`` steps over ``problems`` (the demo)."""

    problems_list: Sequence[Any]
    steps: int
    problems_per_step: int
    rl_stages: tuple[str, ...] = ("rl",)
    sampled_token_budget: int | None = None  # the stage also ends once its rollouts sampled this many tokens

    def budget(self, stage: str) -> int | None:
        return None

    def problems(self, stage: str, cursor: Cursor) -> Sequence[Any]:
        return self.problems_list

    def next_stage(self, stage: str, cursor: Cursor) -> str:
        spent = self.sampled_token_budget is not None and cursor.sampled_tokens >= self.sampled_token_budget
        return "done" if cursor.stage_step >= self.steps or spent else stage

    def steps_left(self, stage: str, cursor: Cursor) -> int | None:
        """RL steps left in ``stage`` (None: unknown ahead); async RL requests no batch past them."""
        return self.steps - cursor.stage_step if self.sampled_token_budget is None else None

    def filter_problems(self) -> Sequence[Any]:
        raise ValueError("OneStage has no filter stage")

    def filter_eval(self) -> tuple[EvalConfig, int]:
        raise ValueError("OneStage has no filter stage")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SFTPart:
    cfg: SFTConfig
    shards: int  # the data's shard count (``sft.train_sft_shards``)
    load_shard: Callable[[int], Examples]  # shard index -> rendered (tokens, loss_mask) examples
    ckpt_every: int
    # demo: a cache of SFT policies shared across runs: load() -> (state, rows) | None; save(state, rows)
    cache_load: Callable[[], tuple[TrainState, list[dict]] | None] | None = None
    cache_save: Callable[[TrainState, list[dict]], None] | None = None


@dataclasses.dataclass(kw_only=True)
class Parts:
    graphdef: Any
    # the initial policy, placed (the trainer mesh's layout, or one device); handed over: the run sets it to
    # None once SFT has started from it, so the initial copy does not stay on the devices beside the train
    # state for the whole run (the caller should hold no other reference; rstar2_jax/run/plan.py counts it in SFT)
    params: Any
    mesh: Any  # the training mesh (None: one device)
    rl: RLConfig
    learner: LearnerConfig
    pad_id: int
    # params -> (Rollout, the engines evaluation uses), the engines holding ``params`` (the train state's);
    # built after SFT, once for every RL stage
    make_rollout: Callable[[Any], tuple[Rollout, Sequence[Engine]]]
    pool: SandboxBackend
    tokenizer: Any
    reward_fn: Any
    schedule: Schedule
    sft: SFTPart | None = None
    eval_problems: Sequence[Any] | None = None
    eval_cfg: EvalConfig | None = None
    async_rl: AsyncConfig = AsyncConfig()  # max_staleness 0: the synchronous loop (train.step.rl_step)
    dynamic_sampling: DynamicSamplingSpec = DynamicSamplingSpec()  # refill rounds (both loops)
    curriculum: CurriculumSpec = CurriculumSpec()  # draw problems by difficulty (synchronous loop only)

    def __post_init__(self) -> None:
        if self.curriculum.enabled and self.async_rl.enabled:
            raise ValueError("Parts: the curriculum runs in the synchronous loop only (async_rl is on)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig:
    out: Path
    seed: int
    ckpt_every: int  # RL steps between checkpoints
    eval_every: int | None  # RL steps between evaluations (None: after SFT and at the end only)
    resume: bool = False
    allow_changed: tuple[str, ...] = ()
    sinks: tuple[str, ...] = ("jsonl",)
    run_config: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # compared on resume
    files: Mapping[str, str] = dataclasses.field(default_factory=dict)  # written (process 0) once the run is accepted
    max_to_keep: int = 2
    show_progress: bool = True


@dataclasses.dataclass(kw_only=True)
class RunResult:
    rows: list[dict]
    cursor: Cursor
    visited: list[str]
    timings: dict[str, float]
    resumed_from: dict | None


class _Run:
    def __init__(self, parts: Parts, rc: RunConfig, abstract_state: TrainState):
        self.p, self.rc = parts, rc
        self.ckpt, restored = open_checkpoints(rc.out, resume=rc.resume, abstract_state=abstract_state,
                                               run_config=dict(rc.run_config), allow_changed=rc.allow_changed,
                                               max_to_keep=rc.max_to_keep)
        if is_main_process():
            rc.out.mkdir(parents=True, exist_ok=True)
            for name, text in rc.files.items():
                (rc.out / name).write_text(text)
        first = "sft" if parts.sft is not None else parts.schedule.rl_stages[0]
        self.cursor = Cursor.from_json(restored.data_cursor, folder=self.ckpt.directory) if restored else Cursor(
            stage=first)
        self.state = restored.state if restored else None
        self.resumed_from = None if restored is None else {"save_id": restored.step, "stage": self.cursor.stage,
                                                           "stage_step": self.cursor.stage_step,
                                                           "global_step": self.cursor.global_step}
        self.log = Loggers(rc.out, rc.sinks, resume=restored is not None, keep_rows=self.cursor.rows,
                           write=is_main_process(), config=dict(rc.run_config))
        self.rollout = self.learner = self.eval_engines = None
        self.async_: AsyncRL | None = None
        # async RL: the stage-list position of the next problem no batch or refill round has taken yet,
        # and the next batch not yet requested (both reset to the cursor at every drain point)
        self.assigned = self.requested = 0
        self.curriculum = Curriculum(parts.curriculum) if parts.curriculum.enabled else None
        if self.curriculum is not None:
            self.curriculum.load_state(self.cursor.curriculum)
        self.visited: list[str] = []
        self.timings: dict[str, float] = {}

    # ---- checkpoints -------------------------------------------------------------------------------
    def save(self, state: TrainState) -> None:
        c = self.cursor
        c.save_id += 1
        c.rows = len(self.log.rows)
        if self.rollout is not None:
            c.rollout = allgather_json(self.rollout.state())  # every process's admission history
        if self.curriculum is not None:
            c.curriculum = self.curriculum.state()
        self.ckpt.save(state, data_cursor=c.to_json(), config={"run": dict(self.rc.run_config)}, step=c.save_id)

    # ---- stages ------------------------------------------------------------------------------------
    def sft(self) -> None:
        sp, t = self.p.sft, time.perf_counter()
        cached = sp.cache_load() if sp.cache_load is not None and self.state is None else None
        if cached is not None:
            state, rows = cached
            for r in rows:
                self.log.log(r)
        else:
            def on_state(i: int, st: TrainState) -> None:
                if i % sp.ckpt_every == 0:
                    self.cursor.stage_step = i
                    self.save(st)

            n0 = len(self.log.rows)
            mine = shard_owner(sp.shards, jax.process_count(), jax.process_index())
            params, self.p.params = self.p.params, None  # the train state starts from (a copy of) it: then it goes
            state = train_sft_shards(self.p.graphdef, params, {s: sp.load_shard(s) for s in mine}, sp.shards,
                                     sp.cfg, pad_id=self.p.pad_id, mesh=self.p.mesh, seed=self.rc.seed,
                                     state=self.state, show_progress=self.rc.show_progress, on_state=on_state,
                                     on_step=lambda i, m: self.log.log({"stage": "sft", "sft_step": i, "step": 0, **m}))
            if sp.cache_save is not None:
                sp.cache_save(state, self.log.rows[n0:])
        self.timings["sft_s"] = time.perf_counter() - t
        self.state = init_train_state(state.params, self.p.rl, self.rc.seed, mesh=self.p.mesh)  # RL optimizer from 0
        self.cursor.stage, self.cursor.stage_step = self.p.schedule.rl_stages[0], 0

    def start_rl(self) -> None:
        """The run's two long-lived owners for every RL stage: the rollout service and the learner."""
        self.p.params = None  # a resumed run restored its state: the initial policy is not needed
        self.rollout, self.eval_engines = self.p.make_rollout(self.state.params)
        self.learner = Learner(self.p.graphdef, self.state, self.p.learner, pad_id=self.p.pad_id, mesh=self.p.mesh,
                               ref_params=self.reference_policy())
        self.rollout.sync(self.learner.params, version=self.learner.version)
        states = self.cursor.rollout
        if states is not None and len(states) == jax.process_count():
            self.rollout.load_state(states[jax.process_index()])  # the dispatcher's history, as it was
        if self.p.async_rl.enabled:
            self.async_ = AsyncRL(self.rollout, self.learner, self.p.reward_fn, self.p.async_rl,
                                  refill=self.p.dynamic_sampling.enabled)
            self.async_.start(self.cursor.global_step)  # a drain point: nothing in flight
            self.assigned, self.requested = self.cursor.problem_cursor, self.cursor.global_step

    def reference_policy(self):
        """π_ref of the KL term (``rl.loss.kl_coef`` > 0; else None): the policy RL starts from (after SFT),
        saved once in ``<out>/reference`` and read back from there by a resumed run."""
        if not self.p.rl.loss.uses_reference:
            return None
        folder = self.rc.out / "reference"
        if int(self.state.step) == 0 and self.cursor.global_step == 0:
            save_reference(self.state.params, folder)
            return self.state.params
        return load_reference(folder, like=self.state.params)

    def evaluate(self, tag: str) -> dict[str, float]:
        if self.p.eval_problems is None:
            return {}
        t = time.perf_counter()
        _, s = evaluate(self.p.eval_problems, self.eval_engines, self.p.pool, self.p.tokenizer, self.p.reward_fn,
                        self.p.eval_cfg, seed=self.rc.seed, show_progress=self.rc.show_progress,
                        out_jsonl=self.rc.out / f"eval_{tag}.jsonl", sharded=True)
        self.timings[f"eval_{tag}_s"] = time.perf_counter() - t
        return {"heldout_acc": s["pass@1"], "heldout_tool_error_rate": s["tool_error_rate"],
                "heldout_response_len": s["mean_response_tokens"]}

    def filter(self) -> None:
        from rstar2_jax.run.recipe import filter_unsolved

        pool = list(self.p.schedule.filter_problems())
        ecfg, k = self.p.schedule.filter_eval()
        rows, _ = evaluate(pool, self.eval_engines, self.p.pool, self.p.tokenizer, self.p.reward_fn, ecfg,
                           seed=self.rc.seed, show_progress=self.rc.show_progress, sharded=True)
        kept = filter_unsolved([str(p.id) for p in pool], [sum(r["correct"]) for r in rows], k)
        c = self.cursor
        self.log.log({"stage": "filter", "step": c.global_step, "filter_pool": len(pool), "filter_kept": len(kept)})
        # the next stage: fresh AdamW moments, laid out as before (so the update does not compile again)
        shardings = jax.tree.map(lambda x: x.sharding, self.learner.state)
        self.learner.state = jax.jit(lambda st: reset_optimizer(st, self.p.rl), out_shardings=shardings)(
            self.learner.state)
        c.kept_ids = kept
        c.stage = self.p.schedule.next_stage("filter", c) if kept else "done"
        c.stage_step, c.problem_cursor, c.trunc_history = 0, 0, []
        self.save(self.learner.state)

    def _batch(self, stage: str, ahead: int = 0, first: int | None = None, draw: int = 0) -> list[Any]:
        """The problems of the RL step ``ahead`` steps after the next one (same stage); ``first``: those
        from that position of the stage's list instead (a refill round). With the curriculum: the next
        step's ``draw``-th draw by difficulty (``data.curriculum``; seeded by the step's seed and ``draw``)."""
        c, sch = self.cursor, self.p.schedule
        pool = sch.problems(stage, c)
        if self.curriculum is not None:
            return self.curriculum.draw(pool, sch.problems_per_step,
                                        seed=round_seed(step_seed(self.rc.seed, c.global_step + 1), draw))
        first = c.problem_cursor + ahead * sch.problems_per_step if first is None else first
        return [pool[(first + j) % len(pool)] for j in range(sch.problems_per_step)]

    def _learn_difficulty(self, stage: str, res: Any) -> dict[str, int]:
        """The curriculum's update from this step's rollouts (every process's), and its pool counts."""
        ts = res.trajectories
        counts: dict[str, list[int]] = {}
        for part in allgather_json(pass_rates([t.problem_id for t in ts], [t.reward for t in ts],
                                              [t.done_reason != "error" for t in ts])):
            for pid, (pos, n) in part.items():
                c = counts.setdefault(pid, [0, 0])
                c[0], c[1] = c[0] + pos, c[1] + n
        self.curriculum.update({pid: pos / n for pid, (pos, n) in counts.items() if n})
        return self.curriculum.counts(self.p.schedule.problems(stage, self.cursor))

    def _refill(self, stage: str, consumed: list[int]) -> Refill | None:
        """Dynamic sampling's source of more problems (``rollout.dynamic_sampling``; None when off): the
        next ones of the stage's list (async RL: after those of the batches already requested);
        ``consumed[0]`` counts every problem the step took."""
        ds = self.p.dynamic_sampling
        if not ds.enabled:
            return None

        def more() -> list[Any]:
            if self.async_ is not None:
                out = self._batch(stage, first=self.assigned)
                self.assigned += len(out)
            else:
                out = self._batch(stage, first=self.cursor.problem_cursor + consumed[0],
                                  draw=consumed[0] // self.p.schedule.problems_per_step)
            consumed[0] += len(out)
            return out
        return Refill(more=more, target=self.p.schedule.problems_per_step, max_rounds=ds.max_rounds)

    def _drain_after(self, step: int) -> bool:
        """Whether global RL step ``step`` is a drain point of the async schedule (checkpoint or evaluation)."""
        return step % self.rc.ckpt_every == 0 or bool(self.rc.eval_every and step % self.rc.eval_every == 0)

    def _horizon(self, stage: str) -> int:
        """How many batches (the next one included) async RL may have requested now: up to the lookahead,
        the next drain point and the stage's known end."""
        c = self.cursor
        steps_left = getattr(self.p.schedule, "steps_left", None)
        left = steps_left(stage, c) if steps_left is not None else None
        n = 1
        while n <= self.p.async_rl.ahead and not self._drain_after(c.global_step + n) and (left is None or n < left):
            n += 1
        return n

    def rl_step(self, stage: str, compiles: CompileCounter) -> dict[str, Any]:
        c, sch = self.cursor, self.p.schedule
        batch = self._batch(stage)
        t = time.perf_counter()
        compiles.take()  # this step's compilations only (not the evaluation or checkpoint before it)
        consumed = [len(batch)]
        if self.async_ is None:
            m, res = rl_step(self.rollout, self.learner, self.p.reward_fn, batch, seed=step_seed(self.rc.seed,
                             c.global_step + 1), budget=sch.budget(stage), compiles=compiles,
                             refill=self._refill(stage, consumed))
            if self.curriculum is not None:
                m.update(self._learn_difficulty(stage, res))
        else:
            # problems in request order (``assigned``): without refills batch b + j gets the cursor's + j * step's
            for b in range(max(self.requested, c.global_step), c.global_step + self._horizon(stage)):
                self.async_.request(b, self._batch(stage, first=self.assigned), seed=step_seed(self.rc.seed, b + 1),
                                    budget=sch.budget(stage))
                self.assigned += sch.problems_per_step
                self.requested = b + 1
            m = self.async_.step(c.global_step, seed=step_seed(self.rc.seed, c.global_step + 1), compiles=compiles,
                                 refill=self._refill(stage, consumed))
        c.problem_cursor += consumed[0]
        c.stage_step += 1
        c.global_step += 1
        c.trunc_history = c.trunc_history + [m["truncation_rate"]]
        c.sampled_tokens += int(m["sampled_tokens"])
        m["sampled_tokens_total"] = c.sampled_tokens
        row = {"stage": stage, "step": c.global_step, "stage_step": c.stage_step, **m,
               "step_s": time.perf_counter() - t}
        new = sch.next_stage(stage, c)
        if self.async_ is not None and (new != stage or self._drain_after(c.global_step)):
            if new != stage:  # batches of this stage requested past its end: thrown away
                row["async/discarded_batches"] = self.async_.discard()
            self.async_.drain()  # the engines get the learner's weights (evaluation, checkpoint)
            self.requested = c.global_step
        if (self.rc.eval_every and c.global_step % self.rc.eval_every == 0) or new == "done":
            row.update(self.evaluate(f"step{c.global_step}"))
        self.log.log(row)
        if new != stage:
            c.stage, c.stage_step, c.trunc_history = new, 0, []
            if new == "filter":
                c.problem_cursor = 0
        if new != stage or c.global_step % self.rc.ckpt_every == 0:
            self.save(self.learner.state)
        if self.requested <= c.global_step:  # nothing in flight (a drain point): every problem assigned was taken
            self.assigned = c.problem_cursor
        return m

    def run(self) -> RunResult:
        c = self.cursor
        if c.stage == "sft":
            self.visited.append("sft")
            self.sft()
            fresh_rl = True
        else:
            fresh_rl = False
        if c.stage == "done":
            return self.result()
        self.start_rl()
        if fresh_rl:  # step 0: the SFT policy's evaluation, then the checkpoint that starts RL
            ev = self.evaluate("sft")
            if ev:
                self.log.log({"stage": c.stage, "step": 0, **ev})
            self.save(self.learner.state)
        t_rl, compiles = time.perf_counter(), CompileCounter()
        bar = tqdm(desc="rl", disable=not self.rc.show_progress)
        try:
            while c.stage != "done":
                if not self.visited or self.visited[-1] != c.stage:
                    self.visited.append(c.stage)
                if c.stage == "filter":
                    self.filter()
                    continue
                m = self.rl_step(c.stage, compiles)
                bar.update(1)
                bar.set_postfix(stage=self.visited[-1], reward=f"{m['reward']:.2f}", kept=m["n_kept"])
        finally:
            if self.async_ is not None:
                self.async_.close()
        bar.close()
        self.timings["rl_s"] = time.perf_counter() - t_rl
        return self.result()

    def result(self) -> RunResult:
        self.ckpt.close()
        self.log.close()
        return RunResult(rows=self.log.rows, cursor=self.cursor, visited=self.visited, timings=self.timings,
                         resumed_from=self.resumed_from)


def run(parts: Parts, rc: RunConfig, abstract_state: TrainState) -> RunResult:
    """Run (or ``rc.resume``) the schedule; see the module docstring. ``abstract_state``: the train
    state's shapes and shardings (``rl.checkpoint.abstract_train_state``) to restore into.

    Raises ``resume.ResumeError`` (before anything is written) when ``--resume`` cannot continue.
    """
    return _Run(parts, rc, abstract_state).run()


def rl_rows(rows: Sequence[dict]) -> list[dict]:
    """The RL step rows (not SFT, filter or evaluation-only rows)."""
    return [r for r in rows if r.get("stage") not in ("sft", "filter") and "reward" in r]


DEFAULT_PLOT = (("reward", "train reward (2G rollouts)"),)  # drawn (empty) when nothing was recorded


def write_plots(rows: Sequence[dict], out: Path) -> None:
    """``<out>/metrics.png`` (process 0): a panel per default metric that was recorded in ``rows``
    (``utils.metrics.DEFAULT_PANELS``; e.g. no held-out panel in a run without evaluation)."""
    if is_main_process():
        from rstar2_jax.utils.metrics import plot_metrics, recorded_panels

        rl = [r for r in rows if r.get("stage") not in ("sft", "filter")]
        plot_metrics(rl, out / "metrics.png", panels=recorded_panels(rl) or DEFAULT_PLOT)
