"""The quality benchmark's data splits: held-out problems must come from the training distribution."""
from hilo.ops.pretrain import pairs


def test_splits_partition_all_pairs_about_80_10_10():
    splits = {s: {tuple(p) for p in pairs(s).tolist()} for s in ("train", "val", "test")}
    assert sum(len(v) for v in splits.values()) == 10_000
    assert set.union(*splits.values()) == {(a, b) for a in range(100) for b in range(100)}
    for s, lo, hi in (("train", 7700, 8300), ("val", 850, 1150), ("test", 850, 1150)):
        assert lo <= len(splits[s]) <= hi, (s, len(splits[s]))


def test_every_split_holds_every_digit_combination():
    # The version-1 split depended on the units digits alone, so held-out sums needed units pairs never trained on
    for s in ("train", "val", "test"):
        ab = pairs(s).tolist()
        assert {(a % 10, b % 10) for a, b in ab} == {(x, y) for x in range(10) for y in range(10)}, s
        assert {(a // 10, b // 10) for a, b in ab} == {(x, y) for x in range(10) for y in range(10)}, s


def test_a_held_out_sum_is_never_a_trained_one_with_its_operands_swapped():
    # The version-2 split hashed the ordered pair: 79% of test pairs (a, b) had (b, a), the same sum, in train
    train = {tuple(p) for p in pairs("train").tolist()}
    for s in ("val", "test"):
        held = {tuple(p) for p in pairs(s).tolist()}
        assert not {(b, a) for a, b in held} & train, s
        assert {(b, a) for a, b in held} == held, s  # both orders of a held-out pair are held out together
