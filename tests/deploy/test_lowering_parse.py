"""The StableHLO readers of ``deploy.lowering`` on handwritten snippets (no lowering, no devices)."""

import pytest

from rstar2_jax.deploy.lowering import pool_copies, pool_ops, pool_updates, tensor_elems, triton_kernels

pytestmark = pytest.mark.fast

POOL = 4096 * 16 * 8 * 128  # one layer's K pool [P, Z, K, H]

# two pool transposes (K and V to head-major) inside a while body, the donated scatter of write_kv,
# a gather of a few pages, the carry passing and a Triton call reading the pool in place
SNIPPET = '''
module @jit_mixed_loop {
  func.func public @main(%arg0: tensor<4096x16x8x128xbf16>, %arg1: tensor<4096x16x8x128xbf16>) -> (tensor<4096x16x8x128xbf16>) {
    %0:2 = stablehlo.while(%iterArg = %arg0, %iterArg_1 = %arg1) : tensor<4096x16x8x128xbf16>, tensor<4096x16x8x128xbf16>
    cond {
      stablehlo.return %c : tensor<i1>
    } do {
      %1 = stablehlo.transpose %iterArg, dims = [2, 0, 1, 3] : (tensor<4096x16x8x128xbf16>) -> tensor<8x4096x16x128xbf16> loc(#loc12)
      %2 = stablehlo.transpose %iterArg_1, dims = [2, 0, 1, 3] : (tensor<4096x16x8x128xbf16>) -> tensor<8x4096x16x128xbf16>
      %3 = "stablehlo.scatter"(%iterArg, %idx, %upd) <{scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1, 2]>}> ({
      ^bb0(%a: tensor<bf16> loc("scatter:"(#loc1)), %b: tensor<bf16>):
        stablehlo.return %b : tensor<bf16>
      }) : (tensor<4096x16x8x128xbf16>, tensor<64x2xi32>, tensor<64x8x128xbf16>) -> tensor<4096x16x8x128xbf16> loc(#loc9)
      %4 = "stablehlo.gather"(%3, %pages) <{dimension_numbers = #stablehlo.gather<offset_dims = [1]>, slice_sizes = array<i64: 1, 16, 8, 128>}> : (tensor<4096x16x8x128xbf16>, tensor<32x1xi32>) -> tensor<32x16x8x128xbf16>
      %5 = stablehlo.custom_call @__gpu$xla.gpu.triton(%q, %1, %2) {mhlo.backend_config = {debug = false, ir = "ML\\EFR", name = "ragged_paged_attention_q1", num_warps = 4 : i32}} : (tensor<64x40x128xbf16>, tensor<8x4096x16x128xbf16>, tensor<8x4096x16x128xbf16>) -> tensor<64x40x128xbf16>
      %6 = stablehlo.convert %w : (tensor<5120x40x128xf32>) -> tensor<5120x40x128xbf16>
      stablehlo.return %3, %iterArg_1 : tensor<4096x16x8x128xbf16>, tensor<4096x16x8x128xbf16>
    }
    return %0#0 : tensor<4096x16x8x128xbf16>
  }
}
'''


def test_tensor_elems_parses_shapes_scalars_and_dynamic_dims():
    assert tensor_elems("4096x16x8x128xbf16") == POOL
    assert tensor_elems("bf16") == 1
    assert tensor_elems("3x?xf32") == 0
    assert tensor_elems("8x2xf32, #stablehlo.bounds<?, 4>") == 16


def test_pool_copies_counts_the_two_transposes_not_carry_scatter_gather_or_kernel():
    ops = pool_ops(SNIPPET, POOL)
    assert ops == {"copies": 2, "updates": 1, "stablehlo.transpose": 2, "stablehlo.scatter": 1}
    assert pool_copies(SNIPPET, POOL) == 2
    assert pool_updates(SNIPPET, POOL) == 1


def test_pool_sized_gather_result_and_concatenate_are_copies():
    text = '''
    %1 = "stablehlo.gather"(%p, %i) <{slice_sizes = array<i64: 4096, 16, 8, 128>}> : (tensor<4096x16x8x128xbf16>, tensor<1x1xi32>) -> tensor<1x4096x16x8x128xbf16>
    %2 = stablehlo.concatenate %a, %b, dim = 0 : (tensor<2048x16x8x128xbf16>, tensor<2048x16x8x128xbf16>) -> tensor<4096x16x8x128xbf16>
    %3 = stablehlo.dynamic_slice %p, %c, %c, %c, %c, sizes = [16, 16, 8, 128] : (tensor<4096x16x8x128xbf16>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<16x16x8x128xbf16>
    %4 = stablehlo.dynamic_update_slice %p, %u, %c, %c, %c, %c : (tensor<4096x16x8x128xbf16>, tensor<1x16x8x128xbf16>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<4096x16x8x128xbf16>
    %5 = stablehlo.reshape %p : (tensor<4096x16x8x128xbf16>) -> tensor<65536x8x128xbf16>
    %6 = stablehlo.add %p, %p : tensor<4096x16x8x128xbf16>
    '''
    assert pool_ops(text, POOL) == {"copies": 3, "updates": 1, "stablehlo.gather": 1, "stablehlo.concatenate": 1,
                                    "stablehlo.reshape": 1, "stablehlo.dynamic_update_slice": 1}


def test_a_smaller_threshold_counts_the_weight_convert_too():
    assert pool_copies(SNIPPET, 5120 * 40 * 128) == 3  # + the [D, N, H] weight convert


def test_triton_kernels_counts_calls_and_names():
    assert triton_kernels(SNIPPET) == (1, ["ragged_paged_attention_q1"])
    assert triton_kernels("%0 = stablehlo.add %a, %b : tensor<2xf32>") == (0, [])


def test_pool_elems_must_be_positive():
    with pytest.raises(ValueError, match="pool_elems"):
        pool_ops(SNIPPET, 0)
