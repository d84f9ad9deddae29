"""Each MoE family's logits agree under every MoE dispatch (the check:
tests/unit/models/test_moe_ffn.py, whose unit tier compares the FFN itself)."""
import pytest

from tests.unit.models.test_moe_ffn import (
    check_each_family_gives_the_same_logits_under_every_dispatch)


@pytest.mark.parametrize("family", ("llm", "moe"))
def test_each_family_gives_the_same_logits_under_every_dispatch(family):
    check_each_family_gives_the_same_logits_under_every_dispatch(family)
