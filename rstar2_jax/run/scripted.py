"""The mixed script: a scripted policy (``testing.scripted.ScriptedPolicy``) under which every RL
group holds right and wrong answers, so every step keeps rows and updates.

Turn 0 calls the Python tool with the problem's own program (a toy problem's ``code``: it runs in the
sandbox for real); turn 1 boxes the gold answer (even samples) or gold + 1 (odd samples); problems
named ``solved`` get the gold answer from every sample. Used by
the recipe's ``--dry-run`` (a random policy never earns a reward) and the demo's ``--scripted-policy``
(its golden test: the updates, RoC and resume of steps that train).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Collection, Sequence

from rstar2_jax.data.datasets import Problem as DatasetProblem
from rstar2_jax.data.toy import ToyProblem
from rstar2_jax.rollout.problem import Problem
from rstar2_jax.rollout.template import TOOL_NAME, TemplateConfig, render_prompt


def _code(p: Problem) -> str:
    """The problem's program: a toy problem's ``code``, or a dataset record's ``code`` field."""
    code = p.code if isinstance(p, ToyProblem) else p.meta.get("code") if isinstance(p, DatasetProblem) else None
    if not code:
        raise ValueError(f"mixed_script: problem {p.id!r} has no 'code' (toy problems carry one)")
    return code


def mixed_script(problems: Sequence[Problem], tok: Any, tpl: TemplateConfig, *, solved: Collection[str] = ()
                 ) -> Callable[[tuple[int, ...], int, int], list[int]]:
    """``script(prompt ids, child, turn) -> ids`` for ``problems`` (integer answers); the problems whose
    id is in ``solved`` are answered right by every sample (uniform groups: RoC drops them, the
    stage-3 filter removes them)."""
    solved = {str(i) for i in solved}
    by_prompt = {tuple(tok.encode(render_prompt(p.problem, tpl))): p for p in problems}

    def script(prompt: tuple[int, ...], child: int, turn: int) -> list[int]:
        p = by_prompt[prompt]
        if turn == 0:
            call = json.dumps({"name": TOOL_NAME, "arguments": {"code": _code(p), "input": ""}})
            return tok.encode(f"Use python.\n<tool_call>{call}</tool_call>")
        value = p.answer if child % 2 == 0 or str(p.id) in solved else str(int(p.answer) + 1)
        return tok.encode(f"Done.</reason><answer>\\boxed{{{value}}}</answer><|im_end|>")

    return script
