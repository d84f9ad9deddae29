"""MUDDPythia's bfloat16 checkpoint replays its coefficients bitwise under jit (float32 and
the parity with the official code: tests/unit/loaders/test_muddpythia.py, whose fixtures
and check these are)."""
from tests.unit.loaders.test_muddpythia import (  # noqa: F401 (ref, state_dict: fixtures)
    check_replay_is_bitwise_equal_to_record_under_jit, ref, state_dict)


def test_replay_is_bitwise_equal_to_record_under_jit_bfloat16(state_dict, ref):
    check_replay_is_bitwise_equal_to_record_under_jit(state_dict, ref, "bfloat16")
