"""The registry's contract on every family but the unit tier's one
(tests/unit/models/test_registry.py holds the cases and the checks)."""
import pytest

from tests.unit.models.test_registry import (
    CASES, INIT_FAMILIES, UNIT, check_build_init_apply_replay_axes,
    check_init_is_one_program_with_the_op_by_op_values)


@pytest.mark.parametrize("family", [f for f in sorted(CASES) if f not in UNIT])
def test_build_init_apply_replay_axes_sweep(family):
    check_build_init_apply_replay_axes(family)


@pytest.mark.parametrize("family", [f for f in INIT_FAMILIES if f not in UNIT])
def test_init_is_one_program_with_the_op_by_op_values_sweep(family):
    check_init_is_one_program_with_the_op_by_op_values(family)
