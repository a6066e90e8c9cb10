"""Every page operation gives the same K/V in every ``KVLayout`` (token-major is the reference)."""

import jax.numpy as jnp
import numpy as np
import pytest

from rstar2_jax.sampling import kv_transfer
from rstar2_jax.sampling.kv_cache import copy_pages
from rstar2_jax.sampling.kv_layout import KVLayout

pytestmark = pytest.mark.fast
P, Z, K, H = 9, 4, 2, 3
LAYOUTS = list(KVLayout)


def _pool(seed):
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.normal(size=(P, Z, K, H)), jnp.float32), jnp.asarray(rng.normal(size=(P, Z, K, H)),
                                                                                 jnp.float32)


def _as_token_major(layout, layer):
    k, v = layout.gather(layer, jnp.arange(P))
    return np.asarray(k), np.asarray(v)


@pytest.mark.parametrize("layout", LAYOUTS, ids=[x.value for x in LAYOUTS])
def test_shapes_dims_and_the_head_axis(layout):
    layer = layout.init(P, Z, K, H, jnp.bfloat16)
    assert layout.dims(layer) == (P, Z, K, H) and all(x.dtype == jnp.bfloat16 for x in layer)
    assert sum(x.size for x in layer) == 2 * P * Z * K * H  # the same bytes in every layout
    assert layer[0].shape[layout.head_axis] == (2 * K if layout is KVLayout.COMBINED else K)
    assert layer[0].shape[layout.page_axis] == P


@pytest.mark.parametrize("layout", LAYOUTS, ids=[x.value for x in LAYOUTS])
def test_write_gather_scatter_copy_equal_token_major(layout):
    k0, v0 = _pool(0)
    ref, got = KVLayout.TOKEN_MAJOR.from_token_major(k0, v0), layout.from_token_major(k0, v0)
    np.testing.assert_array_equal(_as_token_major(layout, got), _as_token_major(KVLayout.TOKEN_MAJOR, ref))
    rng = np.random.default_rng(1)
    kt, vt = jnp.asarray(rng.normal(size=(5, K, H)), jnp.float32), jnp.asarray(rng.normal(size=(5, K, H)), jnp.float32)
    page, slot = jnp.array([3, 3, 7, 0, 1]), jnp.array([0, 3, 2, 0, 1])
    kn, vn = jnp.asarray(rng.normal(size=(2, Z, K, H)), jnp.float32), jnp.asarray(rng.normal(size=(2, Z, K, H)),
                                                                                  jnp.float32)
    for lay, x in ((KVLayout.TOKEN_MAJOR, "ref"), (layout, "got")):
        layer = ref if x == "ref" else got
        layer = lay.write(layer, kt, vt, page, slot)
        layer = lay.scatter(layer, jnp.array([5, 8]), kn, vn)
        layer = lay.copy(layer, jnp.array([3, 0]), jnp.array([6, 0]))  # a fork's copy and a null pair
        if x == "ref":
            ref = layer
        else:
            got = layer
    want = _as_token_major(KVLayout.TOKEN_MAJOR, ref)
    np.testing.assert_array_equal(_as_token_major(layout, got), want)
    np.testing.assert_array_equal(want[0][6], want[0][3])
    np.testing.assert_array_equal(want[0][3, 3], np.asarray(kt[1]))


@pytest.mark.parametrize("layout", LAYOUTS, ids=[x.value for x in LAYOUTS])
def test_host_copies_are_layout_independent(layout):
    """Swap and migration read and write token-order host K/V: a sequence read from one layout is
    written into another unchanged (a GPU engine hands a sequence to a CPU one)."""
    k0, v0 = _pool(2)
    src = [layout.from_token_major(k0, v0)]
    kv = kv_transfer.read_tokens(src, [4, 2, 6], 10, layout)
    want = kv_transfer.read_tokens([(k0, v0)], [4, 2, 6], 10)
    np.testing.assert_array_equal(kv[0][0], want[0][0])
    np.testing.assert_array_equal(kv[0][1], want[0][1])
    dst = kv_transfer.write_tokens([KVLayout.HEAD_MAJOR.init(P, Z, K, H, jnp.float32)], [1, 8, 3], kv,
                                   KVLayout.HEAD_MAJOR)
    back = kv_transfer.read_tokens(dst, [1, 8, 3], 10, KVLayout.HEAD_MAJOR)
    np.testing.assert_array_equal(back[0][0], want[0][0])
    kv_transfer.check_compatible(kv, dst, KVLayout.HEAD_MAJOR)
    with pytest.raises(ValueError, match="not the same model"):
        kv_transfer.check_compatible(kv, [KVLayout.COMBINED.init(P, Z, K + 1, H, jnp.float32)], KVLayout.COMBINED)


def test_copy_pages_jit_takes_the_layout():
    k0, v0 = _pool(3)
    cache = [KVLayout.HEAD_MAJOR.from_token_major(k0, v0)]
    out = copy_pages(cache, jnp.array([2]), jnp.array([7]), KVLayout.HEAD_MAJOR)
    k, _ = KVLayout.HEAD_MAJOR.gather(out[0], jnp.arange(P))
    np.testing.assert_array_equal(np.asarray(k[7]), np.asarray(k0[2]))
