"""The training loop every task shares: run directory, resume, cadence, final evaluation.

``train(config, workdir)`` builds the task's :class:`~dynjax.train.lm.Training` (or
classify's), checks everything before the run directory is written, resumes from the
newest checkpoint that restores, then steps, logs, evaluates and saves on the config's
cadence and writes eval.json at the end. A batch depends only on (seed, step), so a resumed
run is bitwise an uninterrupted one. The order of things: docs/training.md (The loop).
"""
from __future__ import annotations

import contextlib
import sys

import jax
import numpy as np
from etils import epath
from tqdm.auto import tqdm

from dynjax import errors
from dynjax.runs import rundir
from dynjax.jsonio import check_writable, write_json_atomic
from dynjax.parallel import distributed, sharding
from dynjax.train import checkpoint, classify, guard, init_from, lm, preempt
from dynjax.train.metrics import Interval, RunLog
from dynjax.train.optim import learning_rate
from dynjax.train.runlock import RunLock


def task_of(config):
    """The task class that trains ``config``."""
    return classify.Training if rundir.is_classifier(config) else lm.Training


def summary(config, result: dict) -> list[str]:
    """The final evaluation in one line per split, as the CLI prints it."""
    return [task_of(config).summary(split, result[split]) for split in ("validation", "test")]


def _initial_state(task, mngr, run_dir, main: bool, source=None):
    """The newest checkpoint that restores, or a fresh state from the seed (its params
    converted from ``source``'s when the run has one: dynjax.train.init_from)."""
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


def train(config, workdir: str, progress: bool | str = True) -> dict:
    """Train (or resume) a run in ``workdir``; returns the final evaluation dict. A finished
    run (its final checkpoint restores and eval.json scored it) is not trained or evaluated
    again: its eval.json is returned, and a line says so. ``progress``: True, a progress bar
    when stderr is a terminal and one line per log step there otherwise (a batch job's log);
    ``"lines"``, the lines always; False, neither."""
    # Every check before the run directory is written: the config (a ConfigError, also for
    # what only tracing the model finds, e.g. a MoD capacity of 0 tokens), the devices, the
    # run already in the directory, the workdir's writability, the data.
    run_dir = epath.Path(workdir)   # a local folder or gs://... (orbax's path type)
    with errors.config_errors():
        # a resumed conversion's model as recorded: the source may be gone
        task = task_of(config)(init_from.with_recorded_model(config, run_dir))
    config = task.config
    config = rundir.with_recorded_family(config, run_dir)
    changes = checkpoint.check_same_run(run_dir, config, keys=task.same_run_keys)
    main = distributed.is_main()
    if main:
        check_writable(run_dir, "--workdir")
    task.load_data()
    source = init_from.source_of(task, run_dir)  # recorded in config.json
    if main:
        run_dir.mkdir(parents=True, exist_ok=True)
    with (RunLock(run_dir) if main else contextlib.nullcontext()), \
            preempt.StopOnSignal() as stop:
        return _train(task, config, source, run_dir, changes, stop, progress and main, main)


def _finished(run_dir, start: int, steps: int) -> dict | None:
    """The run's eval.json if it evaluated step ``steps`` and resumes there (that
    checkpoint restored: a damaged one was set aside and is trained again)."""
    result = rundir.read_eval(run_dir) if start == steps else None
    return result if result is not None and result.get("step") == steps else None


def _log_line(done: int, total: int, record: dict, steps: int, seconds: float) -> str:
    """A log step as one line for a batch job's log file: step, the interval's mean loss
    (and bits/byte), seconds per step and throughput without compile and evaluation, ETA."""
    loss = record.get("loss", record.get("ce"))
    parts = [f"step {done}/{total}", f"loss {loss:.4f}"]
    if "bpb" in record:
        parts.append(f"bpb {record['bpb']:.4f}")
    if steps:
        per = seconds / steps
        rate = record.get("tokens_per_s") or record.get("examples_per_s")
        unit = "tok/s" if "tokens_per_s" in record else "ex/s"
        eta = int(round(per * (total - done)))
        parts += [f"{per:.3f} s/step", f"{rate:,.0f} {unit}",
                  f"eta {eta // 3600}:{eta // 60 % 60:02d}:{eta % 60:02d}"]
    return " | ".join(parts)


def _train(task, config, source, run_dir, changes, stop, progress, main: bool) -> dict:
    tc = config.train
    if main and not (run_dir / rundir.CONFIG).exists():   # config.json: how the run began
        write_json_atomic(run_dir / rundir.CONFIG, config.to_dict())

    mngr = checkpoint.manager(run_dir, tc.ckpt_every, tc.keep_checkpoints)
    state = _initial_state(task, mngr, run_dir, main, source)
    start = int(state["step"])
    if start > tc.steps:
        raise errors.ConfigError(
            f"{run_dir} is at step {start}, past train.steps={tc.steps}: resume it with "
            f"--config.train.steps={start} or more (and --config.train.allow_changes=true), "
            "or use a new --workdir")
    finished = _finished(run_dir, start, tc.steps)
    if finished is not None:
        if main:
            print(f"{run_dir} is finished (step {start} of {tc.steps}, eval.json written): "
                  "nothing to do; raise --config.train.steps (with "
                  "--config.train.allow_changes=true) to train it further")
        return finished
    if changes and main:   # recorded with the first checkpoint saved under them (_save)
        print(f"note: {run_dir} resumes at step {start} with changed train settings "
              f"({'; '.join(changes)}), recorded in {run_dir / checkpoint.HISTORY} with the "
              "first checkpoint saved under them", file=sys.stderr)
    n_params = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(state["params"]))
    skip = bool(tc.get("skip_nonfinite", False))
    step_fn = guard.guarded_step(task.train_step(top_level=False), skip, _compiler_options(task))
    record = guard.init_record(sharding.replicated(task.mesh))
    final = lambda r: start == tc.steps and r.get("split") in ("validation", "test")  # noqa: E731
    writer = RunLog(run_dir, resume_step=start, redo=final, name=rundir.METRICS)
    if source is not None and source.report is not None:
        writer.write(source.report)              # the loss jump at conversion, step 0
    # Multi-device CPU simulation can deadlock when steps are pipelined: block each step.
    block_each = jax.device_count() > 1 or tc.get("block_every_step", False)

    # the bar and the lines go to stderr (tqdm's stream), so stdout keeps only the results
    use_bar = progress is True and sys.stderr.isatty()
    lines = bool(progress) and not use_bar          # a log file: one line per log step
    bar = tqdm(range(start, tc.steps), initial=start, total=tc.steps, disable=not use_bar,
               desc=task.desc(n_params), mininterval=2)
    if lines and start < tc.steps:
        preempt.say(f"{task.desc(n_params)}: steps {start + 1}..{tc.steps}")
    interval = Interval(run_dir, start, main)
    spikes = guard.SpikeWatch(tc.get("spike_factor", guard.DEFAULT_SPIKE_FACTOR),
                              log=preempt.say,
                              chance=getattr(task, "chance_loss", None))
    spikes.seed(writer.jsonl.kept or [])   # a spike right after a resume is one too
    saved = _Saved(start, changes if main else [])
    for step in bar:
        state, record, metrics = step_fn(state, record, *task.batch(step))
        if block_each:
            jax.block_until_ready(state)
        done = step + 1
        interval.add(guard.loss_of(metrics))
        if step == start:     # it compiled: training time is counted from here
            interval.start_clock(state, done)
        # The signal flag is read once per step: a signal that lands later in this step (the
        # handler runs wherever the loop is, e.g. in the log sync or a metrics append) is
        # this step's only if it was seen before the save was decided, else the next step's.
        # Reading it twice (to save, then to stop) stopped at a step it never saved.
        stopping = stop.signum is not None
        logged = done % tc.log_every == 0 or done == tc.steps
        saving = checkpoint.will_save(mngr, done, force=done == tc.steps or stopping)
        if logged or saving:   # the guard is read where the loop syncs anyway
            skipped = _check_finite(record, skip, mngr, run_dir, tc, done, saving, saved)
        if logged:
            metrics = jax.device_get(metrics)
            mean, steps, seconds = interval.close(done)
            spikes.see(done, mean)      # the logged loss, as the window is seeded with
            key = "loss" if "loss" in metrics else "ce"          # the interval's mean
            line = {"step": done, **task.log_record({**metrics, key: mean}, max(steps, 1),
                                                    seconds if steps else float("inf")),
                    "lr": learning_rate(tc, step)}
            if not steps:     # only the step that compiled: no training time measured
                line = {k: v for k, v in line.items() if k not in THROUGHPUT}
            if skip:
                line["skipped_nonfinite"] = skipped
            writer.write(line)
            if steps:
                bar.set_postfix(task.postfix(line))
            if lines:
                preempt.say(_log_line(done, tc.steps, line, steps, seconds))
        if done % tc.eval_every == 0 and done != tc.steps:
            with interval.excluded():
                val = task.evaluate(state, "validation", done)
            writer.write({"step": done, "split": "validation", **val})
            line = task.describe(val)
            if progress and line:
                bar.write(f"step {done} validation {line}")
        if logged or done % tc.eval_every == 0:
            writer.flush()    # the TensorBoard events, at log points only
        if saving:
            interval.keep_partial(done)
            with interval.excluded():
                _save(mngr, done, state, run_dir)
            saved.now(done, skipped, run_dir, config)
        if stopping:
            break
    mngr.wait_until_finished()
    bar.close()
    if stop.signum is not None:   # the step stopped at (or the last step) was saved above
        raise preempt.Preempted(stop.signum, int(state["step"]), run_dir)

    stop.phase = preempt.FINAL   # a signal from here on: finish the evaluation, then stop
    result = {"step": int(state["step"]), "params": n_params}
    for split in ("validation", "test"):
        result[split] = task.evaluate(state, split, result["step"])
        _check_evaluation(result, split, run_dir)
        writer.write({"step": result["step"], "split": split, **result[split]})
        line = task.describe(result[split])
        if progress and line:
            print(f"{split} {line}")
    writer.close()
    task.finish(state, result)
    if main:
        write_json_atomic(run_dir / rundir.EVAL, result)
    if stop.signum is not None:
        raise preempt.Preempted(stop.signum, result["step"], run_dir, finished=True)
    return result


THROUGHPUT = ("tokens_per_s", "examples_per_s")


def _compiler_options(task):
    """The task's train-step XLA options (the guard compiles the step into its program)."""
    hooks = getattr(task, "hooks", None)
    return hooks.compiler_options(jax.default_backend()) if hooks is not None else None


class _Saved:
    """The last save's step and skipped count, and the train changes not yet recorded
    (config_history.jsonl holds a change only once a checkpoint was saved under it)."""

    def __init__(self, step: int, changes: list[str]):
        self.start = self.step = step
        self.skipped, self.changes = 0, changes

    def now(self, step: int, skipped: int, run_dir, config) -> None:
        self.step, self.skipped = step, skipped
        if self.changes:   # in force from the resumed step
            checkpoint.record_changes(run_dir, self.start, self.changes, config)
            self.changes = []


def _check_finite(record, skip: bool, mngr, run_dir, tc, done: int, saving: bool,
                  saved: _Saved) -> int:
    """Stop (NonFiniteError) if a step since the last check was non-finite, unless ``skip``;
    with ``skip``, stop when too many steps in a row were skipped, or (before a save) every
    step since the last save was. Returns the number of skipped steps."""
    record = jax.device_get(record)
    bad = int(record["first_bad"])
    if bad >= 0 and not skip:
        _diverged(f"step {bad} has a non-finite loss or gradient", mngr, run_dir, bad, tc)
    skipped, streak = int(record["skipped"]), int(record["streak"])
    limit = tc.get("max_skipped_in_a_row", guard.MAX_SKIPPED_IN_A_ROW)
    if skip and streak > limit:
        _diverged(f"steps {done - streak + 1}-{done} were all non-finite and skipped (more "
                  f"than train.max_skipped_in_a_row={limit})", mngr, run_dir, bad, tc)
    if skip and saving and skipped - saved.skipped == done - saved.step > 0:
        _diverged(f"every step since {'the start' if saved.step == 0 else f'step {saved.step}'}"
                  f" ({saved.step + 1}-{done}) was non-finite and skipped: nothing was trained",
                  mngr, run_dir, bad, tc)
    return skipped


def _check_evaluation(result: dict, split: str, run_dir) -> None:
    """A non-finite figure never goes into eval.json: the run stops naming it."""
    bad = [k for k, v in result[split].items()
           if isinstance(v, (float, np.floating)) and not np.isfinite(v)]
    if bad:
        raise errors.NonFiniteError(
            f"the final {split} evaluation of step {result['step']} is non-finite "
            f"({split}.{bad[0]}={result[split][bad[0]]}); eval.json was not written. The "
            f"checkpoint is finite ({run_dir}/checkpoints/{result['step']}): check eval.* "
            "(e.g. eval.batch_size, the model's dtype), or train with a lower train.lr")


def _save(mngr, step: int, state, run_dir) -> None:
    try:
        checkpoint.save(mngr, step, state, force=True)
    except checkpoint.NonFiniteState as e:
        _diverged(f"the state after step {step} has {e}", mngr, run_dir)


def _diverged(what: str, mngr, run_dir, bad: int = -1, tc=None):
    last = mngr.latest_step()
    newest = (f"the newest checkpoint, step {last}, is finite" if last is not None
              else "no checkpoint was saved yet")
    if bad == 1 and tc is not None and tc.warmup_steps > 0:
        # step 1's learning rate is 0 under warm-up: the model or the data, not the optimizer
        raise errors.NonFiniteError(
            f"training diverged: {what}; nothing was saved. Step 1 is non-finite before any "
            "update (its learning rate is 0 under warm-up): the model config or the data "
            "give a non-finite loss; check model.* (e.g. model.rope_base, model.dtype)")
    raise errors.NonFiniteError(
        f"training diverged: {what}; nothing non-finite was saved ({newest}: "
        f"{run_dir}/checkpoints). Lower train.lr or train.clip_norm, or raise "
        "train.warmup_steps, and re-run with --config.train.allow_changes=true (it resumes "
        "from that checkpoint)" + ("" if tc is not None and tc.get("skip_nonfinite", False)
                                   else "; or skip such steps with "
                                   "--config.train.skip_nonfinite=true"))
