"""Sample text from a trained language-model run, through the KV-cache decoder.

    python sample.py RUN_DIR --prompt="It was a dark" [--max_new_tokens=200 --temperature=0.8
        --top_k=40 --top_p=0.95 --seed=0 --step=S]
    python sample.py RUN_DIR --prompt_file=prompts.txt     # one prompt per line

Greedy by default (--temperature=0). Text streams to stdout as it is decoded; each prompt's
continuation ends with a blank line. Routed families decode as ``dynjax.decoding`` does
(MoD and staged MoDE route causally; stderr says which rule), so what is printed is what the
model computes without seeing the future.
"""
import codecs
import sys

from absl import flags, logging

from dynjax import errors, programs

PROG = "sample.py"   # the name errors are reported under (start() sets it)
flags.DEFINE_string("prompt", None, "the prompt text")
flags.DEFINE_string("prompt_file", None, "a text file of prompts, one per line")
flags.DEFINE_integer("max_new_tokens", 200, "tokens (bytes) to add to each prompt")
flags.DEFINE_float("temperature", 0.0, "0 is greedy; > 0 samples")
flags.DEFINE_integer("top_k", 0, "keep the k most likely tokens (0: all)")
flags.DEFINE_float("top_p", 1.0, "keep the nucleus of probability p (1: all)")
flags.DEFINE_integer("seed", 0, "PRNG seed of a sampled continuation")
flags.DEFINE_integer("step", None, "checkpoint step (default: the latest)")


def prompts() -> list[str]:
    f = flags.FLAGS
    if (f.prompt is None) == (f.prompt_file is None):
        raise ValueError("give exactly one of --prompt=TEXT or --prompt_file=FILE")
    if f.prompt is not None:
        texts = [f.prompt]
    else:
        with open(f.prompt_file, encoding="utf-8") as fh:
            texts = [line.rstrip("\n") for line in fh if line.strip()]
    if not all(texts):
        raise ValueError("a prompt is empty: the decoder needs at least one token to start from")
    return texts


def sample(run_dir: str):
    import jax
    import jax.numpy as jnp

    from dynjax import decoding, rundir
    from dynjax.decoding.sampling import Sampling

    f = flags.FLAGS
    sampling = Sampling(f.temperature, f.top_k, f.top_p)
    if f.max_new_tokens < 1:
        raise ValueError(f"--max_new_tokens={f.max_new_tokens} must be at least 1")
    texts = prompts()
    run = rundir.load(run_dir, step=f.step)
    cfg = run.model.cfg
    if not hasattr(cfg, "vocab_size") or cfg.family not in decoding.FAMILIES:
        raise ValueError(f"{run_dir} is not a language-model run this sampler decodes "
                         f"(decodable families: {sorted(decoding.FAMILIES)})")
    dcfg = decoding.forward_config(cfg)
    if dcfg != cfg:
        print(f"decoding routes causally: {dcfg.family}/{dcfg.variant} as "
              "dynjax.decoding.forward_config makes it", file=sys.stderr)
    key = jax.random.key(f.seed)
    for i, text in enumerate(texts):
        prompt = jnp.asarray(list(text.encode("utf-8")), jnp.int32)[None]
        out = codecs.getincrementaldecoder("utf-8")(errors="replace")
        sys.stdout.write(text)
        for tok in decoding.stream(cfg, run.params, prompt, f.max_new_tokens, sampling,
                                   jax.random.fold_in(key, i)):
            sys.stdout.write(out.decode(bytes([int(tok[0])])))
            sys.stdout.flush()
        sys.stdout.write(out.decode(b"", final=True) + "\n\n")


def main(argv):
    logging.set_verbosity(logging.WARNING)
    if len(argv) != 2:
        errors.exit_with_error(PROG, "give one RUN_DIR written by train.py: "
                               "python sample.py RUN_DIR --prompt=TEXT")
    errors.run_program(PROG, lambda: sample(argv[1]), (OSError, ValueError))


def start(prog: str = "sample.py"):
    """The program under the name it was started by (``sample.py``, ``dynjax-sample``)."""
    programs.start(sys.modules[__name__], prog)
