"""The policy: Qwen3/Qwen2-style decoder (Flax NNX), sharding rules, HF checkpoints, log-probs."""

from rstar2_jax.model.attention import blockwise_attention, causal_segment_mask, dense_attention
from rstar2_jax.model.logprobs import hidden_logprobs, naive_token_logprobs, token_logprobs
from rstar2_jax.model.qwen3 import (AttendFn, Qwen3, apply, default_positions, head_weight, logits, rope,
                                    split_policy, training_attention)
from rstar2_jax.model.sharding import (ENGINE_RULES, TRAINER_RULES, ShardingRules, batch_sharding, constrain,
                                       logical_to_spec, make_mesh, param_shardings, replicated, rules_for, shard_params)

__all__ = [
    "AttendFn", "ENGINE_RULES", "Qwen3", "ShardingRules", "TRAINER_RULES", "apply", "batch_sharding",
    "blockwise_attention", "causal_segment_mask", "constrain", "default_positions", "dense_attention",
    "head_weight", "hidden_logprobs", "logical_to_spec", "logits", "make_mesh", "naive_token_logprobs",
    "param_shardings", "replicated", "rope", "rules_for", "shard_params", "split_policy", "token_logprobs",
    "training_attention",
]
