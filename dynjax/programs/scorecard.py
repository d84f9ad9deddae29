"""The execution scorecard: for each checkpoint, does it vary, does its function depend on
it, and does it really execute less?

    dynjax-scorecard --out=DIR RUN_DIR [RUN_DIR ...]     # --config=dynjax:scorecard, the default
    dynjax-scorecard --out=DIR --muddpythia=HF_DIR [RUN_DIR ...]
    dynjax-scorecard --config=dynjax:scorecard_hf --out=DIR --hf=ORG/NAME
    python scorecard.py --config=configs/scorecard.py --out=DIR RUN_DIR   # from a checkout

Writes DIR/scorecard.json, .md and .png panels and each run's audit.
Depth: docs/audit.md#the-scorecard-program-dynjaxprogramsscorecardpy
"""
import sys

from absl import flags, logging
from ml_collections import config_flags

from dynjax import errors, programs

PROG = "scorecard.py"   # the name errors are reported under (start() sets it)
COMMAND, DEFAULT_CONFIG = "scorecard", "scorecard"
config_flags.DEFINE_config_file("config", None, "dynjax:NAME (from a checkout also "
                                "configs/NAME.py); default dynjax:scorecard",
                                lock_config=True)
flags.DEFINE_string("out", None, "output directory")
flags.DEFINE_string("muddpythia", None, "a MUDDPythia HF directory to score (after any RUN_DIR)")
flags.DEFINE_string("hf", None, "a Hugging Face LLM to score (after any RUN_DIR): a "
                    "directory, or ORG/NAME[@REV] in the local Hugging Face cache")
flags.mark_flag_as_required("out")


def main(argv):
    from dynjax import scorecard
    from dynjax.jsonio import check_writable, command_line

    logging.set_verbosity(logging.WARNING)
    runs = [(r, None) for r in argv[1:]]
    if flags.FLAGS.muddpythia:
        runs.append((flags.FLAGS.muddpythia, "muddpythia"))
    if flags.FLAGS.hf:
        runs.append((flags.FLAGS.hf, "hf"))
    if not runs:
        errors.exit_with_error(PROG, "no checkpoints given: pass RUN_DIR "
                               "[RUN_DIR ...] written by dynjax-train, or --muddpythia=HF_DIR / --hf=HF_DIR")
    out = flags.FLAGS.out

    def score():
        check_writable(out, "--out")   # before any audit is computed
        cards = [scorecard.score(r, flags.FLAGS.config, f"{out}/{i}", kind=kind)
                 for i, (r, kind) in enumerate(runs)]
        scorecard.write(cards, out, command_line())
        return cards
    cards = errors.run_program(PROG, score, errors=(FileNotFoundError,))
    for c in cards:
        print(f"{c['run']} ({c['model']})")
        for axis, line in c["verdicts"].items():
            print(f"  {axis:<11} {line}")
    print(f"wrote {out}/scorecard.json, scorecard.md and figures")


def start(prog: str = "scorecard.py"):
    """The program under the name it was started by (``scorecard.py``, ``dynjax-scorecard``)."""
    programs.start(sys.modules[__name__], prog)
