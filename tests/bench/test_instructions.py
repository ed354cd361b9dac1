from __future__ import annotations

from bench import instructions

SUMMARY = """
==8439== I   refs:      12,755,500,065
==8439== I1  misses:       203,935,922
==8439== LLi misses:           697,815
==8439== I1  miss rate:           1.60%
==8439== D1  misses:       127,518,089  ( 111,338,359 rd   + 16,179,730 wr)
==8439== LLd misses:        12,636,189  (   9,413,548 rd   +  3,222,641 wr)
==8439== LLd miss rate:           0.3% (          0.4%     +           0.3%  )
==8439== Mispredicts:      263,107,931  ( 145,441,482 cond + 117,666,449 ind)
"""


def test_counters_are_read_from_the_cachegrind_summary() -> None:
    assert instructions.read_counters(SUMMARY) == {
        "instructions": 12_755_500_065,
        "i1_misses": 203_935_922,
        "d1_misses": 127_518_089,
        "l2_misses": 697_815 + 12_636_189,
        "mispredicts": 263_107_931,
    }
    assert instructions.read_counters("==1== I   refs:      1,000") == {"instructions": 1000}


def test_the_simulated_l2_is_this_machines() -> None:
    assert instructions.l2_bytes() >= 256 * 1024


def test_one_message_costs_the_difference_over_the_extra_messages() -> None:
    small = {"instructions": 9_000, "d1_misses": 100}
    large = {"instructions": 13_000, "d1_misses": 300, "mispredicts": 5}
    assert instructions.per_message(small, large, 400) == {"instructions": 10.0, "d1_misses": 0.5}
