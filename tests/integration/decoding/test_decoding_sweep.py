"""KV-cache decoding equals the forward for every decoder path but the unit tier's one
(tests/unit/decoding/test_decoding.py holds the cases and the check)."""
import pytest

from tests.unit.decoding.test_decoding import CASES, UNIT, check_decoding_equals_the_forward


@pytest.mark.parametrize("case", [c for c in CASES if c not in UNIT])
def test_decoding_equals_the_forward_sweep(case):
    check_decoding_equals_the_forward(case)
