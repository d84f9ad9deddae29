"""``open_checkpoint`` on train.py run directories (the fault suites' shared tiny run, steps 3
and 6): ``RUN`` is the latest step, ``RUN:STEP`` a saved one, and an unsaved step, two
different steps or a kind the run is not are one line each. The other kinds:
tests/unit/runs/test_opener.py."""
import pytest

from dynjax.errors import CheckpointError
from dynjax.runs import rundir
from dynjax.runs.opener import open_checkpoint


def test_a_run_and_run_colon_step(faults_base):
    run, _ = faults_base
    found = open_checkpoint(run)
    assert (found.kind, found.path, found.step, found.is_run) == ("lm_run", run, None, True)
    assert found.config.to_dict() == rundir.read_config(run).to_dict()
    assert open_checkpoint(f"{run}:3").step == 3
    assert open_checkpoint(run, step=6).step == 6
    assert open_checkpoint(run, kind="lm_run").kind == "lm_run"
    for spec, kw, message in (
            (f"{run}:4", {}, "has no checkpoint step 4 (saved: 3, 6); pass one of them"),
            (f"{run}:3", {"step": 6}, ":3 names step 3 and the step argument is 6"),
            (run, {"kind": "hf"}, "is a lm_run checkpoint, not hf; drop the kind")):
        with pytest.raises(CheckpointError) as e:
            open_checkpoint(spec, **kw)
        assert message in str(e.value) and "\n" not in str(e.value)
