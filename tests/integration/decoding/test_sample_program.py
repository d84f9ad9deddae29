"""sample.py as a user runs it: text streamed from a trained run (the seed decides it, a bad
flag is one line) and from an HF checkpoint through its tokenizer (the argmax continuation of
the full forward, stopped by the checkpoint's eos_token_id). The sampling itself, in process:
tests/unit/decoding/test_sampling.py."""
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from tests.conftest import ROOT, tiny_config


@pytest.mark.subprocess
def test_sample_py_streams_text_from_a_run(tmp_path):
    from dynjax.train import loop

    c = tiny_config("feature_gate", n_layers=2)
    c.train.update(steps=2, ckpt_every=2)
    loop.train(c, str(tmp_path / "run"), progress=False)
    cmd = [sys.executable, "sample.py", str(tmp_path / "run"), "--prompt=The ",
           "--max_new_tokens=12", "--temperature=0.9", "--top_k=20", "--seed=3"]
    env = {**os.environ, "PYTHONPATH": ROOT}
    first = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("The ") and first.stdout.endswith("\n\n")
    again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert again.stdout == first.stdout                # the seed decides the text
    bad = subprocess.run(cmd[:3] + ["--top_p=2"], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=180)
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "top_p=2" in bad.stderr


def _sample_py(path, *args):
    cmd = [sys.executable, "sample.py", str(path), *args]
    return subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT},
                          capture_output=True, text=True, timeout=240)


@pytest.mark.subprocess
def test_sample_py_decodes_an_hf_checkpoint_through_its_tokenizer(tmp_path):
    """Greedy text from an HF MoE directory is the tokenizer's decoding of the argmax
    continuation of the full forward (no cache), and the checkpoint's eos_token_id stops it."""
    import json
    import shutil

    from dynjax.loaders import hf

    src = os.path.join(ROOT, "tests", "data", "hf", "qwen3_moe")
    model, params = hf.load(src)
    tok = hf.tokenizer(src)
    ids = tok.encode("The cat").ids
    # one compiled forward over the prompt and 6 slots, filled one argmax at a time (causal:
    # the slots not yet filled change nothing before them)
    seq = np.zeros((1, len(ids) + 6), np.int32)
    seq[0, :len(ids)] = ids
    apply = jax.jit(model.apply)
    for t in range(len(ids), len(ids) + 6):
        seq[0, t] = np.argmax(np.asarray(apply(params, seq)[0])[0, t - 1])
    new = [int(t) for t in seq[0, len(ids):]]
    expected = tok.decode(ids + new)[len(tok.decode(ids)):]
    run = _sample_py(src, "--prompt=The cat", "--max_new_tokens=6")
    assert run.returncode == 0, run.stderr
    assert run.stdout == "The cat" + expected + "\n\n"

    stop_at = new[2]                       # the first occurrence of this token ends the text
    shutil.copytree(src, tmp_path / "ckpt")
    cfg = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps({**cfg, "eos_token_id": [stop_at]}))
    cut = new[:new.index(stop_at)]
    stopped = _sample_py(tmp_path / "ckpt", "--prompt=The cat", "--max_new_tokens=6")
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout == "The cat" + tok.decode(ids + cut)[len(tok.decode(ids)):] + "\n\n"
    refused = _sample_py(src, "--prompt=The cat", "--step=3")
    assert refused.returncode == 2 and refused.stderr.strip().count("\n") == 0
    assert "--step" in refused.stderr
