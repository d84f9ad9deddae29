"""Train an MLP-family classifier (DynamicGate-MLP or a baseline) on tabular / image data.

    python -m dynjax.data.tabular fetch
    python train_mlp.py --config=configs/dgmlp_mnist.py:dgate --workdir=runs/mnist_dgate

Override any field with ``--config.gate.lambda_g=1.0``. Re-running the same command resumes
from the latest checkpoint in the workdir. Prints test accuracy, RelMAC and open rates
(definitions in dynjax/measure/macs.py); the full evaluation is in WORKDIR/eval.json.
"""
from dynjax._alloc import reexec  # the allocator setting, before JAX starts: dynjax/_alloc.py
reexec(__name__)
from absl import app, flags, logging
from ml_collections import config_flags

from dynjax import errors
from dynjax.train import distributed
from dynjax.train.classify import train

config_flags.DEFINE_config_file("config", None, "configs/NAME.py[:METHOD]", lock_config=True)
flags.DEFINE_string("workdir", None, "run directory: checkpoints, metrics.jsonl, eval.json")
flags.DEFINE_bool("progress", True, "show a progress bar")
flags.mark_flags_as_required(["config", "workdir"])

distributed.define_flags(flags)


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)
    # many hosts: --coordinator_address/--num_processes/--process_id or --distributed
    errors.run_program("train_mlp.py", lambda: distributed.initialize_from_flags(flags))
    # a bad config, missing data, no restorable checkpoint: one line and exit status 2
    result = errors.run_program("train_mlp.py", lambda: train(
        flags.FLAGS.config, flags.FLAGS.workdir, progress=flags.FLAGS.progress))
    for split in ("validation", "test"):
        r = result[split]
        rates = ", ".join(f"{o:.3f}" for o in r["open_rate_per_layer"])
        print(f"{split}: accuracy {r['accuracy']:.4f}, RelMAC {r['relmac']:.4f} "
              f"(MAC reduction {r['mac_reduction']:.1%}), open rate per layer [{rates}]")


if __name__ == "__main__":
    app.run(main, flags_parser=errors.flags_parser("train_mlp.py"))
