"""Train a dynjax model: ``python train.py --config=configs/tiny.py:feature_gate --workdir=DIR``.

Override any field with ``--config.train.steps=500``. Re-running the same command resumes
from the latest checkpoint in DIR. Prints the final validation and test bits per byte.
"""
from dynjax._alloc import reexec  # the allocator setting, before JAX starts: dynjax/_alloc.py
reexec(__name__)
from absl import app, flags, logging
from ml_collections import config_flags

from dynjax import errors
from dynjax.train import distributed
from dynjax.train.loop import train

config_flags.DEFINE_config_file("config", None, "configs/NAME.py[:ARG]", lock_config=True)
flags.DEFINE_string("workdir", None, "run directory: checkpoints, metrics.jsonl, eval.json")
flags.DEFINE_bool("progress", True, "show a progress bar")
flags.mark_flags_as_required(["config", "workdir"])

distributed.define_flags(flags)


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
    # many hosts: --coordinator_address/--num_processes/--process_id or --distributed
    errors.run_program("train.py", lambda: distributed.initialize_from_flags(flags))
    # a bad config, missing data, no restorable checkpoint: one line and exit status 2
    result = errors.run_program("train.py", lambda: train(
        flags.FLAGS.config, flags.FLAGS.workdir, progress=flags.FLAGS.progress))
    for split in ("validation", "test"):
        r = result[split]
        mass = f", gate mass {r['gate_mass']:.4f}" if "gate_mass" in r else ""
        print(f"{split}: {r['bpb']:.4f} bits/byte over {r['windows']} windows{mass}")


if __name__ == "__main__":
    app.run(main, flags_parser=errors.flags_parser("train.py"))
