"""Many hosts on one machine: train.py on 2 processes x 2 CPU devices (gloo collectives)
equals 1 process x 4 devices and 1 device, and its checkpoint restores in one process;
an expert-parallel MoE (experts split over a mesh axis that spans both processes, tokens
sent to them by all-to-all) trains as on one device; audit.py on 2 processes x 2 devices
reports one device's numbers.

Each process builds only its rows of every batch, so the global batch, and therefore the
loss, must not depend on the process count: a process that read another's rows (or all
read the same) changes the loss at the first step. Every command has a hard timeout, so a
collective that hangs fails the test instead of blocking the suite.
"""
import json
import shutil
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.conftest import ROOT, cpu_devices_env

pytestmark = pytest.mark.subprocess   # every test here starts processes

TINY = ["--config=configs/tiny.py:feature_gate", "--config.model.d_model=32",
        "--config.model.n_heads=2", "--config.model.d_ff=64", "--config.model.n_layers=2",
        "--config.data.seq_len=32", "--config.train.batch_size=8", "--config.train.steps=6",
        "--config.train.warmup_steps=2", "--config.train.log_every=1",
        "--config.train.ckpt_every=3", "--config.train.keep_checkpoints=5",
        "--config.eval.windows=16", "--config.eval.batch_size=8", "--noprogress"]
TIMEOUT = 240
# integrated MoDE, 8 experts, top-2, dropless (tokens sorted by expert, nothing dropped)
MOE = ["--config=configs/moe_tiny.py:mode_integrated", "--config.model.d_model=32",
       "--config.model.n_heads=2", "--config.model.d_ff=64", "--config.model.n_layers=2",
       "--config.model.moe_num_experts=8", "--config.model.moe_num_experts_per_tok=2",
       "--config.model.moe_dispatch=dropless", "--config.data.seq_len=32",
       "--config.train.batch_size=8", "--config.train.steps=4", "--config.train.warmup_steps=2",
       "--config.train.log_every=1", "--config.train.ckpt_every=4", "--config.eval.windows=8",
       "--config.eval.batch_size=8", "--noprogress"]
# the ep preset on a (data 1, tensor 4) mesh: "tensor" holds devices 0, 1 (process 0) and
# 2, 3 (process 1), so every all-to-all of the expert dispatch crosses the processes. With
# data 1 each process's rows are the whole batch (on 2 x 2 devices a data axis across the
# processes would leave "tensor" inside each); each device dispatches a quarter of the tokens
EP = ["--config.sharding.preset=ep", "--config.sharding.mesh.data=1",
      "--config.sharding.mesh.tensor=4"]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(workdir, devices=1, processes=1):
    return _launch([sys.executable, "train.py", f"--workdir={workdir}", *TINY], devices,
                   processes)


def _launch(cmd, devices=1, processes=1):
    """``cmd`` on ``processes`` processes of ``devices`` CPU devices each (completed runs)."""
    if processes == 1:
        out = subprocess.run(cmd, env=cpu_devices_env(devices), cwd=ROOT, capture_output=True,
                             text=True, timeout=TIMEOUT)
        assert out.returncode == 0, out.stderr[-3000:]
        return [out]
    addr = f"127.0.0.1:{_free_port()}"
    procs = [subprocess.Popen(cmd + [f"--coordinator_address={addr}",
                                     f"--num_processes={processes}", f"--process_id={i}"],
                              env=cpu_devices_env(devices), cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(processes)]
    outs = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=TIMEOUT)
            outs.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for o in outs:
        assert o.returncode == 0, o.stderr[-3000:]
    return outs


# train.py's program, watched: the meshes the expert-parallel dispatch is traced under, and
# at each checkpoint save every local device's slice of the experts' weights and Adam moments
# (written beside the run directory, to WORKDIR.shardsP.json for process P)
EP_TRAIN = textwrap.dedent("""
    import inspect, json, sys
    sys.path.insert(0, {root!r})
    from dynjax.runtime import setup
    setup(__name__)
    import jax
    from absl import flags
    from dynjax.models import dispatch
    from dynjax.programs import train
    from dynjax.train import loop

    traced = []
    parallel, save = dispatch.dropless_expert_parallel, loop._save

    def watched_parallel(*args, **kwargs):
        a = inspect.signature(parallel).bind(*args, **kwargs).arguments
        traced.append(dict(axis=a["axis"], size=a["mesh"].shape[a["axis"]], processes=sorted(
            {{d.process_index for d in a["mesh"].devices.flat}})))
        return parallel(*args, **kwargs)

    def watched_save(mngr, step, state, run_dir):
        shards = {{}}
        for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
            name = jax.tree_util.keystr(path)
            if "moe" in name and name.endswith(("['wi']", "['wo']")):
                shards[name] = [dict(process=s.device.process_index, shape=list(leaf.shape),
                                     index=[list(i.indices(n)[:2])
                                            for i, n in zip(s.index, leaf.shape)])
                                for s in leaf.addressable_shards]
        with open(f"{{flags.FLAGS.workdir}}.shards{{jax.process_index()}}.json", "w") as f:
            json.dump(dict(traced=traced, shards=shards), f)
        save(mngr, step, state, run_dir)

    dispatch.dropless_expert_parallel, loop._save = watched_parallel, watched_save
    train.start("train.py")
""")


def _params(run):
    from dynjax.runs import rundir
    _, _, params = rundir.load_params(run)
    import jax
    return np.concatenate([np.ravel(x) for x in jax.tree.leaves(jax.device_get(params))])


def _losses(run):
    return [r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if "loss" in r]


def test_two_processes_equal_one(tmp_path):
    two, four, one = tmp_path / "two", tmp_path / "four", tmp_path / "one"
    outs = _train(two, devices=2, processes=2)
    # process 0 alone writes and prints; process 1 prints nothing but errors
    assert "test:" in outs[0].stdout and outs[1].stdout == ""
    assert "Traceback" not in outs[1].stderr
    _train(four, devices=4)
    _train(one, devices=1)

    assert len(_losses(two)) == 6
    # the same global batch and initial params on the same 4-device mesh: the first loss is
    # bitwise the same; later ones differ in the last bits (gloo sums gradients in another
    # order than XLA's CPU all-reduce inside one process), and so does 1 device's mean
    assert _losses(two)[0] == _losses(four)[0]
    np.testing.assert_allclose(_losses(two), _losses(four), rtol=1e-6)
    np.testing.assert_allclose(_losses(two), _losses(one), rtol=1e-5)
    p2, p4, p1 = _params(two), _params(four), _params(one)   # restored in this one process
    # (measured: max 1.2e-7 for both)
    np.testing.assert_allclose(p2, p4, rtol=0, atol=1e-5)
    np.testing.assert_allclose(p2, p1, rtol=0, atol=1e-5)
    e2, e1 = (json.loads((r / "eval.json").read_text()) for r in (two, one))
    assert abs(e2["test"]["bpb"] - e1["test"]["bpb"]) < 1e-4
    print(f"params max |2 processes - 1 process x 4| = {np.max(np.abs(p2 - p4)):.3g}, "
          f"max |2 processes - 1 device| = {np.max(np.abs(p2 - p1)):.3g}")

    # the 2-process checkpoint of step 3 resumes in one process (on one device) to the end
    resumed = tmp_path / "resumed"
    shutil.copytree(two, resumed)
    shutil.rmtree(resumed / "checkpoints" / "6")
    (resumed / "eval.json").unlink()
    out = _train(resumed, devices=1)[0]
    assert f"resumed {resumed} at step 3" in out.stdout
    assert _losses(resumed)[:3] == _losses(two)[:3]
    np.testing.assert_allclose(_losses(resumed), _losses(two), rtol=2e-5)
    np.testing.assert_allclose(_params(resumed), p2, rtol=0, atol=1e-5)


def test_expert_parallel_on_two_processes_equals_one_device(tmp_path):
    """A dropless MoE (integrated MoDE, E = 8, top-2) under the ep preset on 2 processes x 2
    devices, its 8 experts split 2 per device over a "tensor" axis spanning both processes
    (each process holds experts 0-3 or 4-7, parameters and Adam moments; every all-to-all
    crosses processes), trains through train.py's program to one device's losses and
    parameters. Tolerances: losses rtol 1e-6 (measured: equal), parameters after 4 AdamW
    steps atol 1e-5 (measured 2.4e-7): gloo and shard_map sum gradients in another order
    than one device, and AdamW turns that last-bit noise into ~1e-7 moves. Pairs sent to the
    mirror device (the other process's experts) moved the first loss by 7e-5 relative."""
    two, one = tmp_path / "two", tmp_path / "one"
    script = tmp_path / "ep_train.py"
    script.write_text(EP_TRAIN.format(root=ROOT))
    outs = _launch([sys.executable, str(script), f"--workdir={two}", *MOE, *EP], devices=2,
                   processes=2)
    assert "Traceback" not in outs[1].stderr
    _launch([sys.executable, "train.py", f"--workdir={one}", *MOE], devices=1)

    for p in (0, 1):
        seen = json.loads((tmp_path / f"two.shards{p}.json").read_text())
        # the dispatch ran expert-parallel (shard_map, all-to-all) over both processes
        assert seen["traced"] and all(t == {"axis": "tensor", "size": 4, "processes": [0, 1]}
                                      for t in seen["traced"]), seen["traced"]
        names = list(seen["shards"])
        assert sum(n.startswith("['params']") for n in names) == 4     # wi, wo of 2 layers
        assert sum(n.startswith("['opt_state']") for n in names) == 8  # and their mu, nu
        for name, shards in seen["shards"].items():
            # this process's 2 devices hold 2 experts each, experts 4p .. 4p + 3 in all
            assert [s["process"] for s in shards] == [p, p], name
            assert sorted(s["index"][0] for s in shards) == [[4 * p, 4 * p + 2],
                                                             [4 * p + 2, 4 * p + 4]], name
            for s in shards:
                assert s["shape"][0] == 8 and all(   # whole experts: the rest unsplit
                    i == [0, n] for i, n in zip(s["index"][1:], s["shape"][1:])), name

    l2, l1 = _losses(two), _losses(one)
    assert len(l2) == 4
    np.testing.assert_allclose(l2, l1, rtol=1e-6)
    p2, p1 = _params(two), _params(one)   # the expert-split checkpoint restored on one device
    np.testing.assert_allclose(p2, p1, rtol=0, atol=1e-5)
    e2, e1 = (json.loads((r / "eval.json").read_text()) for r in (two, one))
    assert abs(e2["test"]["bpb"] - e1["test"]["bpb"]) < 1e-5
    print(f"expert parallel, 2 processes vs 1 device: max |loss diff| = "
          f"{np.max(np.abs(np.subtract(l2, l1))):.3g}, max |param diff| = "
          f"{np.max(np.abs(p2 - p1)):.3g}")


def test_audit_on_two_processes_equals_one(tmp_path):
    """audit.py --muddpythia on 2 processes x 2 devices (each process puts only its rows of
    every batch; the coefficient cache is split over the 4 devices; results are gathered
    replicated) has an exact replay and one device's numbers; process 0 alone writes."""
    from dynjax.data import text
    from tests.unit.loaders.test_muddpythia import write_tiny_hf_dir

    hf = write_tiny_hf_dir(tmp_path / "hf")
    splits = text.load_splits()
    for name, split in (("valid", "validation"), ("test", "test")):
        (tmp_path / f"{name}.txt").write_bytes(splits[split][:4000].tobytes())
    cmd = [sys.executable, "audit.py", "--config=configs/audit_muddpythia.py",
           f"--muddpythia={hf}", "--config.data.seq_len=32",
           f"--config.data.validation_path={tmp_path / 'valid.txt'}",
           f"--config.data.test_path={tmp_path / 'test.txt'}", "--config.reassignments=2",
           "--config.batch_size=8", "--config.data.calib_windows=16",
           "--config.data.eval_windows=16", "--config.stats.n_resamples=99",
           "--config.conditions=correct,cross_input,token_shuffle,static_profile"]
    outs = _launch(cmd + [f"--out={tmp_path / 'two'}"], devices=2, processes=2)
    assert "replay: exact" in outs[0].stdout and outs[1].stdout == ""
    _launch(cmd + [f"--out={tmp_path / 'one'}"])
    two, one = (json.loads((tmp_path / d / "results.json").read_text()) for d in ("two", "one"))
    assert two["replay"]["exact"] and two["replay"]["max_abs_dlogit"] == 0.0
    np.testing.assert_allclose(two["replay"]["nll"], one["replay"]["nll"], rtol=1e-6)
    for name, want in one["conditions"].items():
        got = two["conditions"][name]
        np.testing.assert_allclose([got[k] for k in ("estimate", "ci_low", "ci_high")],
                                   [want[k] for k in ("estimate", "ci_low", "ci_high")],
                                   rtol=1e-4, atol=1e-6, err_msg=name)
