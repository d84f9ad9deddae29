"""How HF checkpoints are read, in processes of their own: each tensor placed in its device
shard under a 2-device mesh (the device count is set before JAX starts), and the programs
reporting a broken checkpoint in one line. The rest, in process:
tests/unit/loaders/test_hf_formats.py."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, cpu_devices_env
from tests.unit.loaders.test_hf_formats import DATA, _copy, _truncate_index, _truncate_shard


@pytest.mark.subprocess
def test_each_tensor_goes_to_its_device_shard():
    """Under a 2-device mesh and the ep preset, every expert tensor arrives split over the
    devices (each holds 4 of mixtral's 8 experts) and equals the unsharded load."""
    script = (
        "import jax, numpy as np\n"
        "from jax.sharding import Mesh\n"
        "from dynjax.loaders import hf\n"
        "mesh = Mesh(np.array(jax.devices()).reshape(1, 1, 2), ('data', 'fsdp', 'tensor'))\n"
        "d = 'tests/data/hf/mixtral'\n"
        "_, p = hf.load(d, mesh=mesh, preset='ep')\n"
        "_, q = hf.load(d)\n"
        "g = p['layers'][0]['moe']['experts']['gate']\n"
        "assert [s.data.shape[0] for s in g.addressable_shards] == [4, 4], g.sharding\n"
        "assert len(p['embed'].addressable_shards) == 2 and p['embed'].sharding.is_fully_replicated\n"
        "jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), p, q)\n"
        "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         cwd=ROOT, env={**cpu_devices_env(2), "PYTHONPATH": ROOT}, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


@pytest.mark.subprocess
def test_programs_report_a_broken_checkpoint_in_one_line(tmp_path):
    """Issue 51's commands: sample.py on a truncated shard, audit.py --hf on a truncated
    index: exit 2 and one line on stderr, no traceback."""
    shard = tmp_path / "shard"
    _truncate_shard(_copy(DATA / "hf" / "mixtral", shard))
    index = tmp_path / "index"
    _truncate_index(_copy(DATA / "hf" / "mixtral", index))
    for args, bad in ((["sample.py", str(shard), "--prompt=x", "--max_new_tokens=1"], shard),
                      (["audit.py", "--config=configs/audit_hf.py", f"--hf={index}",
                        f"--out={tmp_path / 'aud'}"], index)):
        out = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": ROOT}, timeout=300)
        errors = [line for line in out.stderr.splitlines() if "error" in line]
        assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
        assert len(errors) == 1 and str(bad) in errors[0], out.stderr[-2000:]
