"""The training loop every task shares: run directory, resume, cadence, final evaluation.

``train(config, workdir)`` picks the task from the config (a classifier run,
:func:`dynjax.rundir.is_classifier`: :mod:`dynjax.train.classify`; otherwise a language model:
:mod:`dynjax.train.lm`) and runs it: every check before the run directory is written, the
resume guard, ``config.json``, the orbax manager (resume from the newest checkpoint that
restores), then per step the task's batch and jitted step, logging every
``train.log_every`` steps, validation every ``train.eval_every``, a checkpoint every
``train.ckpt_every``, and at the end the validation and test evaluation in ``eval.json``.

The train state is a plain dict {step, params, opt_state} so it goes straight into orbax
and NamedSharding. A task's batch for step s depends only on (seed, s), so a run stopped
and resumed from a checkpoint is bitwise identical to an uninterrupted one. On many
processes (:mod:`dynjax.parallel.distributed`) each builds only its rows of that batch, so
the run does not depend on the number of processes; process 0 alone writes the run
directory's files and the progress bar.
"""
from __future__ import annotations

import pathlib
import time

import jax
import numpy as np
from tqdm.auto import tqdm

from dynjax import errors, rundir
from dynjax.jsonio import write_json_atomic
from dynjax.parallel import distributed
from dynjax.train import checkpoint, classify, convert, lm
from dynjax.train.metrics import JsonlWriter


def task_of(config):
    """The task class that trains ``config``."""
    return classify.Task if rundir.is_classifier(config) else lm.Task


def summary(config, result: dict) -> list[str]:
    """The final evaluation in one line per split, as the CLI prints it."""
    return [task_of(config).summary(split, result[split]) for split in ("validation", "test")]


def _initial_state(task, mngr, run_dir, main: bool, source=None):
    """The newest checkpoint that restores, or a fresh state from the seed (its params
    converted from ``source``'s when the run has one: dynjax.train.convert)."""
    if mngr.latest_step() is None:
        state = jax.jit(task.init_state, out_shardings=task.state_shardings)(
            jax.random.key(task.config.seed))
        return state if source is None else source.convert(task, state)
    target = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                          task.abstract, task.state_shardings)
    state = checkpoint.restore_newest(mngr, target, run_dir)
    if main:
        print(f"resumed {run_dir} at step {int(state['step'])}")
    return state


def train(config, workdir: str, progress: bool = True) -> dict:
    """Train (or resume) a run in ``workdir``; returns the final evaluation dict."""
    # Every check before the run directory is written: the config (a ConfigError, also for
    # what only tracing the model finds, e.g. a MoD capacity of 0 tokens), the devices, the
    # run already in the directory, the data.
    with errors.config_errors():
        task = task_of(config)(config)
    config, tc = task.config, task.config.train
    run_dir = pathlib.Path(workdir)
    config = rundir.with_recorded_family(config, run_dir)
    checkpoint.check_same_run(run_dir, config, keys=task.same_run_keys)
    task.load_data()
    source = convert.source_of(task, run_dir)  # train.init_from, recorded in config.json
    main = distributed.is_main()
    progress = progress and main
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(run_dir / rundir.CONFIG, config.to_dict())

    mngr = checkpoint.manager(run_dir, tc.ckpt_every, tc.keep_checkpoints)
    state = _initial_state(task, mngr, run_dir, main, source)
    start = int(state["step"])
    n_params = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(state["params"]))
    step_fn = task.train_step()
    writer = JsonlWriter(run_dir / rundir.METRICS, resume_step=start)
    if source is not None and source.report is not None:
        writer.write(source.report)              # the loss jump at conversion, step 0
    # Multi-device CPU simulation can deadlock when steps are pipelined: block each step.
    block_each = jax.device_count() > 1 or tc.get("block_every_step", False)

    bar = tqdm(range(start, tc.steps), initial=start, total=tc.steps, disable=not progress,
               desc=task.desc(n_params), mininterval=2)
    t_last, step_last = time.perf_counter(), start
    for step in bar:
        state, metrics = step_fn(state, *task.batch(step))
        if block_each:
            jax.block_until_ready(state)
        done = step + 1
        if done % tc.log_every == 0 or done == tc.steps:
            metrics = jax.device_get(metrics)
            now = time.perf_counter()
            record = {"step": done, **task.log_record(metrics, done - step_last, now - t_last)}
            writer.write(record)
            bar.set_postfix(task.postfix(record))
            t_last, step_last = now, done
        if done % tc.eval_every == 0 and done != tc.steps:
            val = task.evaluate(state, "validation", done)
            writer.write({"step": done, "split": "validation", **val})
            line = task.describe(val)
            if progress and line:
                bar.write(f"step {done} validation {line}")
        checkpoint.save(mngr, done, state, force=done == tc.steps)
    mngr.wait_until_finished()
    bar.close()

    result = {"step": int(state["step"]), "params": n_params}
    for split in ("validation", "test"):
        result[split] = task.evaluate(state, split, result["step"])
        writer.write({"step": result["step"], "split": split, **result[split]})
        line = task.describe(result[split])
        if progress and line:
            print(f"{split} {line}")
    task.finish(state, result)
    if main:
        write_json_atomic(run_dir / rundir.EVAL, result)
    return result
