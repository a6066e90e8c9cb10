"""Trajectories -> the train step's batch arrays (host side, NumPy).

Layout of row i (one trajectory, ``full = prompt + response``, padded to ``seq_len``)::

    tokens[t]    = full[t]
    targets[t]   = full[t + 1]                     (pad_id past the end)
    loss_mask[t] = mask(full[t + 1])               1 on sampled tokens, 0 on prompt/tool/pad
    old_logp[t]  = sampler log-prob of full[t + 1] (0 where the mask is 0)
    advantages   = [B] per-trajectory advantage
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
