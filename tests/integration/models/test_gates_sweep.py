"""Bitwise replay of every gated variant in bfloat16 and with unrolled layers
(tests/unit/models/test_gates.py: the check, and float32 with scanned layers)."""
import pytest

from tests.unit.models.test_gates import GATED, REPLAY, UNIT_REPLAY, check_replay_is_bitwise


@pytest.mark.parametrize("dtype, scan", [r for r in REPLAY if r not in UNIT_REPLAY])
@pytest.mark.parametrize("variant", GATED)
def test_replay_is_bitwise_sweep(variant, dtype, scan, tiny_model):
    check_replay_is_bitwise(tiny_model, variant, dtype, scan)
