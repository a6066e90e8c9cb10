"""Trajectories -> the train step's batch arrays (host side, NumPy).

Layout of row i (one trajectory, ``full = prompt + response``, padded to ``seq_len``)::

    tokens[t]    = full[t]
    targets[t]   = full[t + 1]                     (pad_id past the end)
    loss_mask[t] = mask(full[t + 1])               1 on sampled tokens, 0 on prompt/tool/pad
    old_logp[t]  = sampler log-prob of full[t + 1] (0 where the mask is 0)
    advantages   = [B] per-trajectory advantage

:func:`pack_trajectories` puts several trajectories in one row instead (segments, positions and
per-token advantages), so a heavy-tailed batch is not padded to its longest trajectory row by row.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from rstar2_jax.rollout.trajectory import Trajectory


def trajectories_to_batch(trajs: Sequence[Trajectory], advantages: np.ndarray, seq_len: int,
                          pad_id: int) -> dict[str, np.ndarray]:
    """Stack ``trajs`` into ``[B, seq_len]`` arrays (see module docstring); too-long rows raise."""
    b = len(trajs)
    tokens = np.full((b, seq_len), pad_id, np.int32)
    targets = np.full((b, seq_len), pad_id, np.int32)
    mask = np.zeros((b, seq_len), np.float32)
    old = np.zeros((b, seq_len), np.float32)
    for i, t in enumerate(trajs):
        full = list(t.prompt_tokens) + list(t.response_tokens)
        if len(full) > seq_len:
            raise ValueError(f"trajectory {t.uid} has {len(full)} tokens > seq_len {seq_len}")
        n, p = len(full), len(t.prompt_tokens)
        tokens[i, :n] = full
        targets[i, : n - 1] = full[1:]
        mask[i, p - 1: n - 1] = t.loss_mask
        old[i, p - 1: n - 1] = t.sampler_logprobs
    return {"tokens": tokens, "targets": targets, "loss_mask": mask, "old_logp": old,
            "advantages": np.asarray(advantages, np.float32).reshape(b)}


def pack_plan(lengths: Sequence[int], row_len: int) -> list[list[int]]:
    """First-fit decreasing: which trajectories (indices into ``lengths``) share each row of
    ``row_len`` tokens. Deterministic (ties by index); a trajectory longer than a row raises."""
    rows: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        n = int(lengths[i])
        if n > row_len:
            raise ValueError(f"trajectory {i} has {n} tokens > row length {row_len}")
        for r, f in enumerate(free):
            if n <= f:
                rows[r].append(i)
                free[r] -= n
                break
        else:
            rows.append([i])
            free.append(row_len - n)
    return rows


def pack_trajectories(trajs: Sequence[Trajectory], advantages: np.ndarray, row_len: int, pad_id: int,
                      plan: Sequence[Sequence[int]] | None = None) -> dict[str, np.ndarray]:
    """Several trajectories per row (``plan``, default :func:`pack_plan`): ``[R, row_len]`` arrays.

    Each trajectory is laid out as in :func:`trajectories_to_batch` inside its own segment, plus
    ``segment_ids`` (1, 2, ... within a row; 0 = padding), ``positions`` (restarting at 0 in each
    segment) and per-token ``advantages`` ``[R, row_len]`` (the trajectory's Â on its segment). The
    attention mask and the loss aggregation read the segments, so the loss and its gradient equal
    those of one trajectory per row (tests/rollout/test_batch.py)."""
    full = [list(t.prompt_tokens) + list(t.response_tokens) for t in trajs]
    plan = pack_plan([len(f) for f in full], row_len) if plan is None else plan
    r = len(plan)
    out = {"tokens": np.full((r, row_len), pad_id, np.int32), "targets": np.full((r, row_len), pad_id, np.int32),
           "loss_mask": np.zeros((r, row_len), np.float32), "old_logp": np.zeros((r, row_len), np.float32),
           "advantages": np.zeros((r, row_len), np.float32), "positions": np.zeros((r, row_len), np.int32),
           "segment_ids": np.zeros((r, row_len), np.int32)}
    adv = np.asarray(advantages, np.float32).reshape(len(trajs))
    for row, members in enumerate(plan):
        at = 0
        for seg, i in enumerate(members, start=1):
            t, f = trajs[i], full[i]
            n, p = len(f), len(t.prompt_tokens)
            if at + n > row_len:
                raise ValueError(f"row {row} of the plan holds {at + n} tokens > row length {row_len}")
            sl = slice(at, at + n)
            out["tokens"][row, sl] = f
            out["targets"][row, at: at + n - 1] = f[1:]
            out["loss_mask"][row, at + p - 1: at + n - 1] = t.loss_mask
            out["old_logp"][row, at + p - 1: at + n - 1] = t.sampler_logprobs
            out["advantages"][row, sl] = adv[i]
            out["positions"][row, sl] = np.arange(n)
            out["segment_ids"][row, sl] = seg
            at += n
    return out
