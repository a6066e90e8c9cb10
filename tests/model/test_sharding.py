"""``ShardingRules``: one typed rules object for the trainer and the engines; ``constrain`` never
silently does nothing under a mesh."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

from rstar2_jax.model.sharding import AXES, ENGINE_RULES, TRAINER_RULES, ShardingRules, constrain, rules_for


def test_trainer_and_engine_rules_are_one_type():
    assert type(TRAINER_RULES) is type(ENGINE_RULES) is ShardingRules
    # trainer: (embed, mlp) -> (fsdp, tensor); engine: the MLP width over both TP axes, kv-major
    assert TRAINER_RULES.spec(("embed", "mlp")) == P("fsdp", "tensor")
    assert ENGINE_RULES.spec(("embed", "mlp")) == P(None, ("kv", "rep"))


def test_a_dim_its_axes_do_not_divide_is_replicated():
    sizes = {"data": 1, "fsdp": 4, "tensor": 2}
    # 6 % 4 != 0: embed replicated; 8 % 2 == 0: mlp split
    assert TRAINER_RULES.spec(("embed", "mlp"), (6, 8), sizes) == P(None, "tensor")
    # the engine writes a size-1 axis as replicated: kv = 2, rep = 1 -> q heads over ("kv", "rep") of 2
    assert ENGINE_RULES.spec(("q_heads", "head_dim"), (4, 8), {"kv": 2, "rep": 1}) == P(("kv", "rep"), None)
    assert ENGINE_RULES.spec(("kv_heads", "head_dim"), (2, 8), {"kv": 1, "rep": 2}) == P(None, None)


def test_rules_reject_a_mesh_axis_used_twice_or_unknown_names():
    with pytest.raises(ValueError, match="twice"):
        TRAINER_RULES.spec(("mlp", "q_heads"))  # both -> "tensor"
    with pytest.raises(ValueError, match="unknown logical axis"):
        TRAINER_RULES.spec(("layers",))
    with pytest.raises(ValueError, match="not one of"):
        ShardingRules(axes=("x",), mlp="tensor")


def test_constrain_applies_the_mesh_rules_and_raises_for_a_mesh_without_rules():
    x = jnp.ones((8, 4))
    assert constrain(x, ("batch", None)) is x  # no mesh: nothing to constrain
    devs = np.asarray(jax.devices()[:8])
    trainer = Mesh(devs.reshape(2, 2, 2), AXES)
    assert rules_for(trainer) is TRAINER_RULES
    with jax.set_mesh(trainer):
        y = jax.jit(lambda a: constrain(a, ("batch", None)))(x)
    assert y.sharding.spec[0] == ("data", "fsdp")  # rows over data x fsdp (trailing None dropped by JAX)
    other = Mesh(devs.reshape(4, 2), ("data", "model"))
    with pytest.raises(ValueError, match="missing"):
        rules_for(other)
    with jax.set_mesh(other), pytest.raises(ValueError, match="no ShardingRules"):
        jax.jit(lambda a: constrain(a, ("batch", None)))(x)
