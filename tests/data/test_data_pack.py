"""Sequence packing: first-fit placement, the targets/loss-mask shift, positions and segment ids."""

import random

import numpy as np
import pytest

from rstar2_jax.data.chat import pack_sequences

pytestmark = pytest.mark.fast

PAD = -1


def _ex(start: int, mask: list[int]) -> tuple[list[int], list[int]]:
    return list(range(start, start + len(mask))), mask


def test_hand_packed_rows():
    a = _ex(10, [0, 0, 1, 1, 1])  # 5 tokens
    b = _ex(20, [0, 1, 1])  # 3 tokens: fills row 0 exactly (5 + 3 = 8)
    c = _ex(30, [0, 1, 0, 1])  # 4 tokens: row 1
    p = pack_sequences([a, b, c], seq_len=8, pad_id=PAD)
    np.testing.assert_array_equal(p["tokens"], [[10, 11, 12, 13, 14, 20, 21, 22],
                                                [30, 31, 32, 33, PAD, PAD, PAD, PAD]])
    # target = next token of the same segment; a segment's last column has no target (pad)
    np.testing.assert_array_equal(p["targets"], [[11, 12, 13, 14, PAD, 21, 22, PAD],
                                                 [31, 32, 33, PAD, PAD, PAD, PAD, PAD]])
    # mask of the TARGET: a's mask [0,0,1,1,1] shifted left -> [0,1,1,1,0]
    np.testing.assert_array_equal(p["loss_mask"], [[0, 1, 1, 1, 0, 1, 1, 0],
                                                   [1, 0, 1, 0, 0, 0, 0, 0]])
    np.testing.assert_array_equal(p["positions"], [[0, 1, 2, 3, 4, 0, 1, 2], [0, 1, 2, 3, 0, 0, 0, 0]])
    np.testing.assert_array_equal(p["segment_ids"], [[1, 1, 1, 1, 1, 2, 2, 2], [1, 1, 1, 1, 0, 0, 0, 0]])
    assert p["tokens"].dtype == np.int32 and p["loss_mask"].dtype == np.float32
    assert (p.n_truncated, p.n_records) == (0, 3)


def test_first_fit_uses_the_first_row_with_room():
    lens = [6, 5, 2, 3]  # 6 -> row 0; 5 -> row 1; 2 -> row 0 (room 2); 3 -> row 1 (room 3)
    p = pack_sequences([_ex(100 * i, [1] * n) for i, n in enumerate(lens)], seq_len=8, pad_id=PAD)
    np.testing.assert_array_equal(p["tokens"], [[0, 1, 2, 3, 4, 5, 200, 201],
                                                [100, 101, 102, 103, 104, 300, 301, 302]])
    np.testing.assert_array_equal(p["segment_ids"], [[1] * 6 + [2] * 2, [1] * 5 + [2] * 3])


def test_random_packing_round_trips_every_record():
    rng = random.Random(0)
    examples = [_ex(1000 * i, [rng.randint(0, 1) for _ in range(rng.randint(1, 16))]) for i in range(60)]
    p = pack_sequences(examples, seq_len=16, pad_id=PAD)
    recovered = []
    for r in range(p["tokens"].shape[0]):
        seg = p["segment_ids"][r]
        used = seg > 0
        assert used[:used.sum()].all()  # padding only at the end
        assert (np.diff(seg[used]) >= 0).all() and set(np.diff(seg[used])) <= {0, 1}  # contiguous, 1..k
        for k in range(1, seg.max() + 1):
            cols = np.flatnonzero(seg == k)
            np.testing.assert_array_equal(p["positions"][r, cols], np.arange(len(cols)))
            toks = p["tokens"][r, cols]
            np.testing.assert_array_equal(p["targets"][r, cols[:-1]], toks[1:])
            recovered.append((toks.tolist(), p["loss_mask"][r, cols].tolist()))
        assert (p["loss_mask"][r, ~used] == 0).all() and (p["tokens"][r, ~used] == PAD).all()
    by_start = {toks[0]: toks for toks, _ in recovered}
    assert len(recovered) == len(examples)
    for toks, mask in examples:
        assert by_start[toks[0]] == toks
    # every trained token is counted exactly once (m_0 of each record is never a target)
    assert p["loss_mask"].sum() == sum(sum(m[1:]) for _, m in examples)


def test_long_record_is_truncated_with_a_count():
    with pytest.warns(UserWarning, match="1 of 2 records"):
        p = pack_sequences([_ex(0, [1] * 12), _ex(50, [1] * 3)], seq_len=8, pad_id=PAD)
    assert p.n_truncated == 1
    np.testing.assert_array_equal(p["tokens"][0], np.arange(8))
    assert p["loss_mask"][0].tolist() == [1] * 7 + [0]


@pytest.mark.parametrize("examples,msg", [([([1, 2], [1])], "2 tokens but 1 mask"), ([([], [])], "empty")])
def test_bad_examples_raise(examples, msg):
    with pytest.raises(ValueError, match=msg):
        pack_sequences(examples, seq_len=8, pad_id=PAD)
