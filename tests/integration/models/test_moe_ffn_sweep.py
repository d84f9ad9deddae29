"""Integrated MoDE's logits agree under every MoE dispatch (the llm family's case and the
check: tests/unit/models/test_moe_ffn.py)."""
from tests.unit.models.test_moe_ffn import (
    check_each_family_gives_the_same_logits_under_every_dispatch)


def test_each_family_gives_the_same_logits_under_every_dispatch_moe():
    check_each_family_gives_the_same_logits_under_every_dispatch("moe")
