"""Coefficient families (dynjax/audit/families.py): a condition on one family of coefficient
leaves, the others replayed as recorded; site names checked against the model's. The
end-to-end audit (audit.py --hf --config.sites) is in tests/integration/audit/test_audit_hf.py."""
import jax
import numpy as np
import pytest

from dynjax.audit import families, interventions
from dynjax.errors import AuditError
from dynjax.coeffs import Axes
from tests.conftest import uniform


def test_family_conditions_leave_the_other_families_as_recorded():
    """families.restrict: a condition on one family changes its leaves only; the others
    come back bitwise; a deterministic condition's means come from that family's own
    calibration leaves. Unknown site names are one line naming those the model has."""
    schema = {"router": Axes(("layer", "example", "token", "expert")),
              "attn_gate": Axes(("layer", "example", "token", "head", "unit"))}
    key = jax.random.key(0)
    coeffs = {"router": uniform(0, (2, 4, 8, 3)), "attn_gate": uniform(1, (2, 4, 8, 2, 5))}
    assert families.of_schema(schema) == {"router": ("router",), "attn_gate": ("attn_gate",)}
    assert families.of_schema(schema, {"all": ("router", "attn_gate")}) == \
        {"all": ("router", "attn_gate")}
    for fam, other in (("router", "attn_gate"), ("attn_gate", "router")):
        shuffled = families.restrict(interventions.cross_input, (fam,))(coeffs, schema, key)
        np.testing.assert_array_equal(shuffled[other], coeffs[other])
        assert np.any(np.asarray(shuffled[fam]) != np.asarray(coeffs[fam]))
        whole = interventions.cross_input(coeffs, schema, key)
        np.testing.assert_array_equal(shuffled[fam], whole[fam])   # the same donor map
        flat = families.restrict(interventions.structure_removed, (fam,))(coeffs, schema,
                                                                         coeffs)
        np.testing.assert_array_equal(flat[other], coeffs[other])
        np.testing.assert_allclose(flat[fam], np.full(coeffs[fam].shape,
                                                      np.mean(coeffs[fam])), rtol=1e-6)
    assert families.select(families.of_schema(schema), "all") == families.of_schema(schema)
    with pytest.raises(AuditError, match=r"unknown coefficient site\(s\) \['mhc'\]: this "
                                         r"checkpoint records \['router', 'attn_gate'\]"):
        families.select(families.of_schema(schema), "router,mhc")
