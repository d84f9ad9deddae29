"""Record and replay are one compiled program, bitwise, for every family but the unit tier's
(tests/unit/models/test_replay.py holds the targets and the check)."""
import pytest

from tests.unit.models.test_replay import TARGETS, UNIT, check_record_and_replay_are_one_program


@pytest.mark.parametrize("name", [n for n in TARGETS if n not in UNIT])
def test_record_and_replay_are_one_program_sweep(name):
    check_record_and_replay_are_one_program(name)
