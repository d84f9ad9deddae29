"""Train any dynjax model (language models and classifiers alike: the config decides).

    dynjax-train --config=dynjax:tiny:feature_gate --workdir=runs/fg [--config.train.steps=500]
    dynjax-train --config=dynjax:dgmlp_mnist:dgate --workdir=runs/mnist
    python train.py --config=configs/tiny.py:feature_gate --workdir=runs/fg   # from a checkout

Re-running the same command resumes from the workdir's latest checkpoint; the evaluation
is in WORKDIR/eval.json. Exit status: 0 trained, 2 a one-line error, 128 + the signal when
stopped by it (after saving: re-run to resume).
Depth: docs/training.md#the-train-program-dynjaxprogramstrainpy
"""
import sys

from absl import flags, logging
from ml_collections import config_flags

from dynjax import errors, programs

PROG = "train.py"   # the name errors are reported under (start() sets it)
COMMAND = "train"
config_flags.DEFINE_config_file("config", None, "dynjax:NAME[:ARG] (from a checkout also "
                                "configs/NAME.py[:ARG]); override fields with "
                                "--config.FIELD=VALUE", lock_config=True)
flags.DEFINE_string("workdir", None, "run directory: checkpoints, metrics.jsonl, eval.json")
flags.DEFINE_bool("progress", True, "a progress bar when stderr is a terminal, else one "
                  "line per log step; --noprogress: the lines, never a bar")
flags.mark_flags_as_required(["config", "workdir"])

programs.define_distributed_flags(flags)


def main(argv):
    from dynjax.parallel import distributed
    from dynjax.train import loop, preempt
    from dynjax.train.optim import clamp_warmup

    del argv
    logging.set_verbosity(logging.WARNING)  # orbax logs every save at INFO
    # many hosts: --coordinator_address/--num_processes/--process_id or --distributed
    errors.run_program(PROG, lambda: distributed.initialize_from_flags(flags))
    # a bad config, missing data, no restorable checkpoint: one line and exit status 2
    try:
        # the config's own warm-up, longer than a short run's steps, is clamped (one line);
        # a --config.train.warmup_steps given beside them is the user's and is checked as is
        config = flags.FLAGS.config if any(a.startswith("--config.train.warmup_steps")
                                           for a in sys.argv) else \
            clamp_warmup(flags.FLAGS.config, log=preempt.say
                         if distributed.is_main() else None)
        result = errors.run_program(PROG, lambda: loop.train(
            config, flags.FLAGS.workdir,
            progress=True if flags.FLAGS.progress else "lines"),
            os_hint=lambda: _resume_hint(flags.FLAGS.workdir))
    except preempt.Preempted as stopped:   # SIGTERM/SIGINT: saved, then stopped
        print(f"{PROG}: {stopped}", file=sys.stderr)
        sys.exit(preempt.exit_status(stopped.signum))
    for line in loop.summary(config, result):
        print(line)


def _resume_hint(workdir) -> str:
    """What re-running does after a filesystem error: resume, or start (nothing saved)."""
    from dynjax.jsonio import is_local
    from dynjax.runs import rundir

    try:
        saved = rundir.steps(workdir) if is_local(workdir) else [1]
    except OSError:
        saved = []
    return ("then re-run the same command: it resumes from the newest complete checkpoint"
            if saved else "then re-run the same command (no checkpoint was saved yet: it "
            "starts the run from the beginning)")


def start(prog: str = "train.py"):
    """The program under the name it was started by (``train.py``, ``dynjax-train``)."""
    from dynjax.train import preempt

    preempt.from_the_start()   # train.py did it before importing JAX; dynjax-train here
    programs.start(sys.modules[__name__], prog)
