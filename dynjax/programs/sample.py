"""Sample text from a trained language-model run or a Hugging Face checkpoint (KV cache).

    dynjax-sample RUN_DIR --prompt="It was a dark" [--temperature=0.8 --top_p=0.95 --step=S]
    dynjax-sample RUN_DIR --prompt_file=prompts.txt     # one prompt per line
    dynjax-sample HF_DIR --prompt="The capital of France is" [--dtype=bfloat16]
    dynjax-sample Qwen/Qwen3-0.6B[@REV] --prompt=...    # a repo id in the local HF cache
    python sample.py RUN_DIR --prompt=...               # the same program, from a checkout

Greedy by default; text streams to stdout. Routed families decode causally, as
``dynjax.decoding`` does. Depth: docs/decoding.md#the-sample-program-dynjaxprogramssamplepy
"""
import sys

from absl import flags, logging

from dynjax import errors, programs

PROG = "sample.py"   # the name errors are reported under (start() sets it)
COMMAND = "sample"
flags.DEFINE_string("prompt", None, "the prompt text")
flags.DEFINE_string("prompt_file", None, "a text file of prompts, one per line")
flags.DEFINE_integer("max_new_tokens", 200, "tokens (bytes) to add to each prompt")
flags.DEFINE_float("temperature", 0.0, "0 is greedy; > 0 samples")
flags.DEFINE_integer("top_k", 0, "keep the k most likely tokens (0: all)")
flags.DEFINE_float("top_p", 1.0, "keep the nucleus of probability p (1: all)")
flags.DEFINE_integer("seed", 0, "PRNG seed of a sampled continuation")
flags.DEFINE_integer("step", None, "checkpoint step of a run (default: the latest)")
flags.DEFINE_enum("dtype", None, ["float32", "bfloat16"],
                  "the dtype an HF checkpoint's weights load in (default: its torch_dtype)")


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


def open_model(path: str):
    """``(cfg, params, text)`` of any checkpoint :func:`dynjax.audit.targets.open_target` opens whose
    model decodes (``text``: :mod:`dynjax.decoding.text`, as the checkpoint reads text)."""
    from dynjax import decoding
    from dynjax.audit.targets import open_target

    f = flags.FLAGS
    target = open_target(path, config={"hf": {"dtype": f.dtype}}, step=f.step)
    cfg = target.model.cfg
    if not hasattr(cfg, "vocab_size") or cfg.family not in decoding.FAMILIES:
        raise ValueError(f"{path} is not a language-model run this sampler decodes "
                         f"(decodable families: {sorted(decoding.FAMILIES)})")
    return cfg, target.params, target.text()


def sample(path: str):
    import jax
    import jax.numpy as jnp

    from dynjax import decoding
    from dynjax.decoding.sampling import Sampling

    f = flags.FLAGS
    sampling = Sampling(f.temperature, f.top_k, f.top_p)
    if f.max_new_tokens < 1:
        raise ValueError(f"--max_new_tokens={f.max_new_tokens} must be at least 1")
    texts = prompts()
    cfg, params, text = open_model(path)
    dcfg = decoding.forward_config(cfg)
    if dcfg != cfg:
        print(f"decoding routes causally: {dcfg.family}/{dcfg.variant} as "
              "dynjax.decoding.forward_config makes it", file=sys.stderr)
    key = jax.random.key(f.seed)
    for i, prompt_text in enumerate(texts):
        ids = text.encode(prompt_text)
        if not ids:
            raise ValueError(f"prompt {i + 1} encodes to no tokens; give a longer prompt")
        prompt = jnp.asarray(ids, jnp.int32)[None]
        add, flush = text.printer(ids)
        sys.stdout.write(prompt_text)
        for tok in decoding.stream(cfg, params, prompt, f.max_new_tokens, sampling,
                                   jax.random.fold_in(key, i)):
            if int(tok[0]) in text.stop:
                break
            sys.stdout.write(add(int(tok[0])))
            sys.stdout.flush()
        sys.stdout.write(flush() + "\n\n")


def main(argv):
    logging.set_verbosity(logging.WARNING)
    if len(argv) != 2:
        errors.exit_with_error(PROG, "give one RUN_DIR written by dynjax-train, or one HF "
                               "checkpoint directory or cached repo id ORG/NAME: "
                               f"{PROG} RUN_DIR --prompt=TEXT")
    errors.run_program(PROG, lambda: sample(argv[1]), (OSError, ValueError))


def start(prog: str = "sample.py"):
    """The program under the name it was started by (``sample.py``, ``dynjax-sample``)."""
    programs.start(sys.modules[__name__], prog)
