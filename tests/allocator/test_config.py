import pytest

from labkit.allocator.sim.config import (NO_LIMIT, allocation_size, parse_alloc_conf, round_size,
                                     roundup_power2_next_division, tokenize)
from labkit.core.errors import LabkitError

MiB = 1024 * 1024
GiB = 1024 * MiB


def test_default_and_tokenizer():
    c = parse_alloc_conf("")
    assert c.max_split_size == NO_LIMIT and not c.expandable_segments
    assert c.max_non_split_rounding_size == 20 * MiB
    assert tokenize(" a : 1 ,b:[1:2,>:4]") == ["a", ":", "1", ",", "b", ":", "[", "1", ":", "2", ",", ">", ":", "4", "]"]


def test_options_parse():
    c = parse_alloc_conf("expandable_segments:True, max_split_size_mb:128,garbage_collection_threshold:0.6,"
                         "max_non_split_rounding_mb:64,roundup_power2_divisions:4")
    assert c.expandable_segments and c.max_split_size == 128 * MiB
    assert c.garbage_collection_threshold == 0.6 and c.max_non_split_rounding_size == 64 * MiB
    assert c.roundup_power2_divisions == (4,) * 16


def test_roundup_list_follows_accelerator_allocator_config():
    # [256:1,512:2,1024:4,>:8]: values before the first key take its value; '>' fills after the last key
    c = parse_alloc_conf("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]")
    assert c.roundup_power2_divisions == (1,) * 9 + (2, 4) + (8,) * 5
    assert c.divisions_for(300 * MiB) == 1 and c.divisions_for(600 * MiB) == 2
    assert c.divisions_for(1500 * MiB) == 4 and c.divisions_for(3 * GiB) == 8
    assert c.divisions_for(100 * GiB) == 8 and c.divisions_for(1000) == 1


@pytest.mark.parametrize("bad, why", [
    ("max_split_size_mb:10", "too small"),
    ("expandable_segments:true", "True or False"),
    ("roundup_power2_divisions:3", "power of 2"),
    ("roundup_power2_divisions:[256:3]", "power of 2"),
    ("garbage_collection_threshold:1.5", "(0.0, 1.0)"),
    ("no_such_option:1", "unrecognised"),
    ("max_split_size_mb", "expected ':'"),
    ("backend:cudaMallocAsync", "does not simulate"),
    ("roundup_power2_divisions:[256:1", "closing"),
])
def test_bad_configs_name_the_problem(bad, why):
    with pytest.raises(LabkitError, match=None) as e:
        parse_alloc_conf(bad)
    assert why in str(e.value) and bad.split(":")[0] in str(e.value)


def test_round_size_512_and_power2_divisions():
    assert round_size(1) == 512 and round_size(512) == 512 and round_size(513) == 1024
    c4 = parse_alloc_conf("roundup_power2_divisions:4")
    # 1.17 MiB lies in [1 MiB, 2 MiB): steps of 256 KiB -> 1.25 MiB
    assert round_size(1200 * 1024, c4) == 1280 * 1024
    assert round_size(2 * MiB, c4) == 2 * MiB  # powers of two stay
    assert round_size(1000, c4) == 1024  # below 512*divisions: plain 512 rounding
    assert roundup_power2_next_division(5 * MiB + 1, 4) == 6 * MiB
    assert roundup_power2_next_division(5 * MiB, 4) == 5 * MiB


def test_allocation_size():
    assert allocation_size(512) == 2 * MiB and allocation_size(MiB) == 2 * MiB
    assert allocation_size(MiB + 512) == 20 * MiB and allocation_size(10 * MiB - 512) == 20 * MiB
    assert allocation_size(10 * MiB) == 10 * MiB and allocation_size(11 * MiB) == 12 * MiB
