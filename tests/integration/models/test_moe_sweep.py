"""MoE replay beyond the unit tier's cases (tests/unit/models/test_moe.py holds the check):
integrated MoDE's routes, the no-op expert included, replayed bitwise under jit."""
import pytest

from tests.unit.models.test_moe import REPLAY, UNIT_REPLAY, check_bitwise_replay_under_jit


@pytest.mark.parametrize("variant,routing", [r for r in REPLAY if r not in UNIT_REPLAY])
def test_bitwise_replay_under_jit_sweep(variant, routing):
    check_bitwise_replay_under_jit(variant, routing)
