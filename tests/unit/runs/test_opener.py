"""``open_checkpoint`` is the one recogniser (issue 44): each kind of checkpoint directory is
recognised from its config.json alone, and every bad argument is one line naming the fix.
The run kinds (``RUN``, ``RUN:STEP``): tests/integration/runs/test_opener_runs.py."""
import json
import pathlib
import shutil

import pytest

from dynjax.errors import CheckpointError, ConfigError, CorruptFile
from dynjax.runs.opener import open_checkpoint, split_step
from dynjax.train import init_from
from tests.unit.loaders.test_muddpythia import write_tiny_hf_dir

HF = pathlib.Path(__file__).resolve().parents[2] / "data" / "hf"


def one_line(e) -> str:
    message = str(e.value)
    assert "\n" not in message, message
    return message


def test_each_hf_kind_is_recognised_from_config_json(tmp_path):
    for name in ("llama", "olmoe", "deepseek_v3", "qwen3_next"):
        found = open_checkpoint(HF / name)
        assert (found.kind, found.step, found.path) == ("hf", None, HF / name)
        assert found.config["model_type"] == json.loads((HF / name / "config.json").read_text())[
            "model_type"] and not found.is_run
    mudd = open_checkpoint(write_tiny_hf_dir(tmp_path / "mudd"))
    assert mudd.kind == "muddpythia" and mudd.config["model_type"] == "muddpythia"
    # gpt-fast's config.json has no model_type: its fields and the weights say MUDDPythia
    config = json.loads((tmp_path / "mudd" / "config.json").read_text())
    del config["model_type"]
    (tmp_path / "mudd" / "config.json").write_text(json.dumps(config))
    assert open_checkpoint(tmp_path / "mudd", kind="muddpythia").kind == "muddpythia"


def test_a_bad_spec_is_one_line_naming_the_fix(tmp_path):
    with pytest.raises(CheckpointError) as e:
        open_checkpoint(tmp_path / "missing")
    assert "missing does not exist; give a train.py run directory (RUN or RUN:STEP" in one_line(e)
    with pytest.raises(CheckpointError, match="looked in"):      # a repo id not in the cache
        open_checkpoint("org/nonesuch", kind="hf")

    other = tmp_path / "falcon"
    shutil.copytree(HF / "llama", other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps(dict(config, model_type="falcon")))
    for kind in (None, "hf", "muddpythia"):      # nothing falls through to another loader
        with pytest.raises(CheckpointError) as e:
            open_checkpoint(other, kind=kind)
        assert "model_type='falcon' is not supported; supported: deepseek_v2" in one_line(e)
        assert ", llama, " in str(e.value) and str(e.value).endswith(", muddpythia")

    (other / "config.json").write_text('{"model_type": "llama",')
    with pytest.raises(CorruptFile) as e:
        open_checkpoint(other)
    assert "config.json is corrupt" in one_line(e)
    (other / "config.json").write_text('{"vocab_size": 256}')
    with pytest.raises(CheckpointError) as e:
        open_checkpoint(other)
    assert "is neither a train.py run's (model and data sections) nor" in one_line(e)
    (other / "config.json").unlink()
    with pytest.raises(CheckpointError) as e:
        open_checkpoint(other)
    assert "has *.safetensors but no config.json; copy the checkpoint's" in one_line(e)
    with pytest.raises(CheckpointError) as e:
        open_checkpoint(tmp_path)
    assert "has no config.json, so it is neither a train.py run directory" in one_line(e)

    with pytest.raises(CheckpointError) as e:
        open_checkpoint(HF / "llama", step=3)
    assert ("is a Hugging Face directory and holds one set of weights; drop the step (3: --step"
            in one_line(e))
    with pytest.raises(CheckpointError, match="holds one set of weights"):
        open_checkpoint(f"{HF / 'llama'}:3")
    with pytest.raises(CheckpointError) as e:
        open_checkpoint(HF / "llama", kind="muddpythia")
    assert "is a hf checkpoint, not muddpythia; drop the kind" in one_line(e)
    with pytest.raises(CheckpointError, match="unknown checkpoint kind 'nope'; choose one of"):
        open_checkpoint(HF / "llama", kind="nope")


def test_split_step_reads_run_colon_step_only_where_no_such_path_exists(tmp_path):
    assert split_step("runs/a:600") == ("runs/a", 600)
    assert split_step("runs/a") == ("runs/a", None)
    assert split_step("runs/a:b") == ("runs/a:b", None)
    odd = tmp_path / "x:12"
    odd.mkdir()
    assert split_step(str(odd)) == (str(odd), None)


def test_conversion_takes_its_source_from_the_same_recogniser(tmp_path):
    """train.init_from accepts what a conversion starts from and refuses the rest by kind."""
    assert init_from.source_config(str(HF / "llama")).model_type == "llama"
    with pytest.raises(ConfigError) as e:
        init_from.source_config(write_tiny_hf_dir(tmp_path / "mudd"))
    assert "is a MUDDPythia directory, which does not convert" in one_line(e)
    with pytest.raises(CheckpointError, match="does not exist"):
        init_from.source_config(str(tmp_path / "missing"))
