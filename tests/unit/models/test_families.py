"""A family is one record (``models.Family``), and every per-layer registry names every
family: it supports it or refuses it in so many words. A family added to ``models.FAMILIES``
and forgotten in one registry fails here. Nothing is compiled."""
from __future__ import annotations

import json

import pytest

from dynjax import decoding, models
from dynjax.decoding.protocol import FamilyDecoder
from dynjax.errors import ConfigError
from dynjax.measure import lm_execution
from dynjax.models import FAMILIES, Family, Routing, build
from dynjax.models.transformer import SECTIONS, ModelConfig
from dynjax.train import checkpoint, convert
from dynjax.train import families as train_families
from tests.unit.models.test_registry import CASES

# registry -> (the families it supports, the families it refuses: name -> why)
REGISTRIES = {
    "decoding.FAMILIES": (decoding.FAMILIES, decoding.REFUSED),
    "train.families.HOOKS": (train_families.HOOKS, {}),
    "measure.lm_execution.FAMILY_FLOPS": (lm_execution.FAMILY_FLOPS,
                                          dict.fromkeys(lm_execution.FLOPS_ELSEWHERE, "")),
    "train.convert.FAMILIES": (dict.fromkeys(convert.FAMILIES), convert.REFUSED),
    "transformer.SECTIONS": ({f.name: f for f in FAMILIES.values() if f.section},
                             {f.name: "" for f in FAMILIES.values() if f.config is not ModelConfig}),
}


@pytest.mark.parametrize("registry", sorted(REGISTRIES))
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_is_supported_or_refused_by_every_registry(family, registry):
    supported, refused = REGISTRIES[registry]
    assert (family in supported) != (family in refused), (
        f"{registry} must support or refuse the {family} family (exactly one); "
        "docs/contributing.md: adding a family")


@pytest.mark.parametrize("registry", sorted(REGISTRIES))
def test_no_registry_names_an_unknown_family(registry):
    supported, refused = REGISTRIES[registry]
    assert set(supported) | set(refused) <= set(FAMILIES), registry


def test_sections_are_the_records_and_decoders_keep_the_protocol():
    assert {f.section: f.name for f in FAMILIES.values() if f.section} == \
        {s: s for s in SECTIONS}
    for name, dec in decoding.FAMILIES.items():
        assert isinstance(dec, FamilyDecoder), name


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_record_answers_for_a_config_of_its_family(family):
    """What callers ask instead of branching on the name: routes and their causality,
    routing facts, the scorecard's routing rows, the dense twin."""
    fam = FAMILIES[family]
    assert isinstance(fam, Family) and fam.name == family and fam.task in ("lm", "classifier")
    cfg = build(CASES[family][0]).cfg
    assert models.family_of(cfg) == family
    routes = fam.eval_routes(cfg)
    assert routes and all(isinstance(causal, bool) for _, causal in routes.values())
    routing = fam.routing(cfg)
    assert routing is None or isinstance(routing, Routing)
    assert fam.routing_summary(cfg, {}) == {}
    if fam.dense_twin is not None:
        twin = fam.dense_twin(cfg)
        assert twin.variant == "dense" and build(twin) is not None


def test_routing_facts_of_the_moe_families():
    moe_cfg = build(CASES["moe"][0]).cfg
    assert FAMILIES["moe"].routing(moe_cfg) == Routing(4, 1, True)
    assert not FAMILIES["moe"].routing(
        moe_cfg.replace(moe_routing="expert_choice")).token_choice
    assert FAMILIES["llm"].routing(build(CASES["llm"][0]).cfg) == Routing(4, 2, True)
    assert FAMILIES["gates"].routing(build(CASES["gates"][0]).cfg) is None


def test_an_old_llm_config_json_builds_and_resumes_under_the_new_name(tmp_path):
    """``router_aux_loss_coef`` became ``moe_load_balance_loss_weight`` (the moe family's
    name): a run's config.json written before builds the same config and is the same run."""
    import ml_collections

    new = dict(CASES["llm"][0], moe_load_balance_loss_weight=0.01)
    old = {("router_aux_loss_coef" if k == "moe_load_balance_loss_weight" else k): v
           for k, v in new.items()}
    assert build(old).cfg == build(new).cfg
    assert build(old).cfg.moe_load_balance_loss_weight == 0.01
    config = ml_collections.ConfigDict({"model": new, "train": {"steps": 1}})
    (tmp_path / "config.json").write_text(json.dumps({"model": old, "train": {"steps": 1}}))
    assert checkpoint.check_same_run(tmp_path, config) == []
    changed = ml_collections.ConfigDict({"model": dict(new, moe_load_balance_loss_weight=0.1),
                                         "train": {"steps": 1}})
    with pytest.raises(ConfigError, match="moe_load_balance_loss_weight"):
        checkpoint.check_same_run(tmp_path, changed)
