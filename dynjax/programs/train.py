"""Train any dynjax model: ``python train.py --config=configs/NAME.py[:ARG] --workdir=DIR``.

Language models (``configs/tiny.py:feature_gate``, MoD, MoE, MUDD, ...) and classifiers
(``configs/dgmlp_mnist.py:dgate``, ...) alike: the config decides (dynjax/train/loop.py).
Override any field with ``--config.train.steps=500``. Re-running the same command resumes
from the latest checkpoint in DIR. Prints the final validation and test figures (bits per
byte, or accuracy and RelMAC); the full evaluation is in DIR/eval.json.

Exit status: 0 trained (or already finished); 2 one-line error (a bad config, missing
data, no restorable checkpoint, a filesystem error, a diverged run, another writer);
143 / 130 stopped by SIGTERM / SIGINT after saving a checkpoint (re-run to resume).
docs/reliability.md has the guarantees.
"""
import sys

from absl import flags, logging
from ml_collections import config_flags

from dynjax import errors, programs
from dynjax.parallel import distributed
from dynjax.train import loop, preempt

PROG = "train.py"   # the name errors are reported under (start() sets it)
config_flags.DEFINE_config_file("config", None, "configs/NAME.py[:ARG] or dynjax:NAME[:ARG]",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "run directory: checkpoints, metrics.jsonl, eval.json")
flags.DEFINE_bool("progress", True, "show a progress bar")
flags.mark_flags_as_required(["config", "workdir"])

distributed.define_flags(flags)


def main(argv):
    del argv
    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
    # many hosts: --coordinator_address/--num_processes/--process_id or --distributed
    errors.run_program(PROG, lambda: distributed.initialize_from_flags(flags))
    # a bad config, missing data, no restorable checkpoint: one line and exit status 2
    try:
        result = errors.run_program(PROG, lambda: loop.train(
            flags.FLAGS.config, flags.FLAGS.workdir, progress=flags.FLAGS.progress),
            os_hint="then re-run the same command: it resumes from the newest complete "
                    "checkpoint")
    except preempt.Preempted as stopped:   # SIGTERM/SIGINT: saved, then stopped
        print(f"{PROG}: {stopped}", file=sys.stderr)
        sys.exit(preempt.exit_status(stopped.signum))
    for line in loop.summary(flags.FLAGS.config, result):
        print(line)


def start(prog: str = "train.py"):
    """The program under the name it was started by (``train.py``, ``dynjax-train``)."""
    programs.start(sys.modules[__name__], prog)
