"""The train loop: one readable function. Feed batches, step, log every ``log_interval``, evaluate every
``eval_interval`` (on its own schedule: an evaluation on a step that is not a log step is a row of its own),
stop with a ``TrainingError`` when updates keep being refused (``trainer.max_skipped_updates``) or an id is
out of range under ``trainer.strict_ids``, keep the best evaluated state and stop early when the objective
stops improving (``selection.py``), flush the deferred update at the end (its record goes into the final
row), evaluate once more, summarise."""
from __future__ import annotations

import time
from typing import Any, Mapping

import jax
import numpy as np

from .. import progress as progress_lib
from ..budget import train_examples
from ..errors import TrainingError
from . import memory_budget, placement
from .selection import Selection, selection_metric
from .diagnostics import is_log_step, settings_of
from .feed import Feed
from .step import TrainProgram
from ..tracking import Tracker


def to_device(program: TrainProgram, batch: Mapping[str, np.ndarray], keys=None) -> dict[str, jax.Array]:
    """Put a whole host batch (the same on every process) on the mesh, its leading dim split over every device."""
    keys = program.model_keys if keys is None else keys
    return placement.put_global(program.mesh, {k: batch[k] for k in keys})


def make_selection(task: Any, trainer: Any) -> Selection:
    """Selection on a validation metric (``selection_metric``: ``trainer.objective`` when it is one, else the
    task's own): on where the task selects by default (``task.selects_on_validation``) unless
    ``trainer.select_best`` says otherwise."""
    objective = selection_metric(getattr(trainer, "objective", None), task)
    select = getattr(trainer, "select_best", None)
    select = bool(getattr(task, "selects_on_validation", False)) if select is None else bool(select)
    evaluated = objective in set(getattr(task, "metric_names", lambda: [objective])())
    return Selection(objective, select=select and evaluated,
                     patience=getattr(trainer, "early_stop_patience", None) if evaluated else None)


def train(program: TrainProgram, task: Any, trainer: Any, tracker: Tracker, log=print,
          checkpoints: Any = None, preemption: Any = None) -> dict[str, Any]:
    """Run ``trainer.steps`` steps (fewer when it stops early); returns {"summary": ..., "state": final state,
    "best": the best evaluated BestState or None}. With ``checkpoints`` (runner.checkpoint.Checkpoints):
    start from its restored state (and selection record) and save as it says. With ``preemption``
    (``preemption.Preemption``): stop at the step boundary after a SIGTERM or Ctrl-C, saving that step (summary
    ``terminated``: the signal's name)."""
    B = trainer.batch_size
    put = lambda b: to_device(program, b)  # noqa: E731
    # Several processes: each generates and feeds only the rows of the global batch its devices hold.
    shard, num_shards = placement.batch_shard(program.mesh, B)
    rows = {"shard": shard, "num_shards": num_shards} if num_shards > 1 else {}
    put_rows = lambda b: placement.put_local(program.mesh, {k: b[k] for k in program.model_keys}, B)  # noqa: E731
    predict_host = lambda s, b: placement.fetch(predict(s, b))  # noqa: E731
    state, start, last = checkpoints.resume_point() if checkpoints is not None else (None, 0, {})
    state = program.init_state(trainer.seed) if state is None else state
    selection = make_selection(task, trainer)
    if checkpoints is not None:
        selection.restore(*checkpoints.selection_point())
    stop = max(getattr(trainer, "stop_after", None) or trainer.steps, start)  # stop_after: pre-emption drill
    if selection.stopped_at is not None:  # a run that had stopped early: nothing more to train
        stop = start
    # The batches of steps [start, stop), built ahead by a Grain pipeline (feed.py): a pure function of the step.
    feed = Feed(task, start, stop, B, rows, workers=int(getattr(trainer, "data_workers", 0) or 0))
    try:
        host = next(feed) if stop > start else task.batch(start, B, **rows)
        batch = put_rows(host)
        step_fn, flush_fn, predict = program.compile(state, batch)
        # What the run shows as it goes (trainer.progress): a bar on a terminal, plain lines otherwise; process 0
        # only.
        progress = progress_lib.make(getattr(trainer, "progress", "auto"), log=log,
                                     enabled=jax.process_index() == 0)
        progress.start(trainer.steps, start, batch_size=B, objective=task.objective,
                       steps_per_epoch=train_examples(task) / B if train_examples(task) else None)
        log = progress.write  # a log line that does not break the bar
        if stop > start:  # compiled ahead of its first call (which then reuses it), to check its memory first
            compiled = progress.compile(f"the train step (async_emb={'on' if program.async_emb else 'off'}, "
                                        f"{_devices(program.mesh.devices.size)})",
                                        lambda: step_fn.lower(state, batch).compile())
            memory_budget.check(compiled, list(program.mesh.local_devices), B, program.mesh.devices.size)
        evaluate = progress.evaluation(task.evaluate, getattr(task, "num_eval_batches", lambda _: None)(B))
        # Selection scores what it keeps: in async mode a mid-run evaluation scores the state with its deferred
        # update applied (a flushed copy; the live state is not touched), as the final evaluation does.
        peek = _peek_flush(program, state) if selection.active and program.async_emb else (lambda s: s)
        tracker.define_summary(task.objective, "maximize")
        tracker.define_summary("train/loss", "minimize")

        t_window, n_window = time.perf_counter(), 0
        # XLA:CPU runs a multi-device step's collectives on a shared thread pool; two steps in flight at once
        # can starve each other's rendezvous on few cores (seen as a 40 s collective timeout). On a CPU mesh,
        # finish each step (after the next batch is ready) before dispatching the next computation.
        one_at_a_time = jax.default_backend() == "cpu" and program.mesh.devices.size > 1
        lagged = None  # (metrics, step) of the step whose health check is still due
        terminated = False
        noted: set[str] = set()  # tables whose rerouted overflow has been reported (once a run)
        for step in range(start, stop):
            state, metrics = step_fn(state, batch)  # dispatch is asynchronous: prepare the next batch meanwhile
            progress.step(step + 1)
            done = step + 1 == trainer.steps
            logged_host = host
            if step + 1 < stop:
                host = next(feed)
                batch = put_rows(host)
            if one_at_a_time:
                jax.block_until_ready(metrics["train/loss"])
            n_window += 1
            row: dict[str, Any] = {}
            if is_log_step(step + 1, trainer.log_interval, trainer.steps):
                m = placement.fetch(metrics)
                elapsed = time.perf_counter() - t_window
                row = {k: _scalar(v) for k, v in m.items() if k != "outputs" and not k.startswith(EXAMPLE_ID)}
                row.update(task.train_metrics(placement.gather_rows(program.mesh, logged_host, B), m["outputs"]))
                row["perf/examples_per_s"] = n_window * B / elapsed
                row["perf/step_time_ms"] = 1000 * elapsed / n_window
                for name, opt in program.emb_optimizers.items():  # the step reports a fused optimizer's (scheduled) one
                    row.setdefault(f"emb/learning_rate/{name}", float(getattr(opt, "learning_rate", float("nan"))))
            if (step + 1) % trainer.eval_interval == 0 and not done:  # its own schedule, not only on log steps
                t_eval = time.perf_counter()
                scored = peek(state)
                evaluated = evaluate(predict_host, scored, put, B)
                selection.update(step + 1, evaluated, scored)
                del scored
                row.update(evaluated)
                if "train/loss" not in row:  # keep evaluation time out of the next throughput window
                    t_window += time.perf_counter() - t_eval
            if row:
                tracker.log(row, step=step + 1)
                shown = f"  {task.objective} {row[task.objective]:.4f}" if task.objective in row else ""
                if "train/loss" in row:
                    last = row
                    log(f"step {step + 1:>6}/{trainer.steps}  loss {row['train/loss']:.4f}{shown}  "
                        f"emb|g| {row['emb/grad_norm']:.3g}  {row['perf/examples_per_s']:,.0f} ex/s")
                    t_window, n_window = time.perf_counter(), 0
                else:
                    log(f"step {step + 1:>6}/{trainer.steps}  eval{shown}")
                progress.logged(row)
            # Refused updates and out-of-range ids stop the run (after the step's row). A check fetches a few
            # scalars; checking the previous step's (finished by now) keeps the device busy while the host waits.
            # With checkpoints on, each step is checked before it can be saved, and the last before the flush.
            if lagged is not None:
                check_health(program, trainer, *lagged, checkpoints, log=log, noted=noted)
            lagged = (metrics, step + 1)
            if checkpoints is not None or step + 1 == stop:
                check_health(program, trainer, *lagged, checkpoints, log=log, noted=noted)
                lagged = None
            if selection.should_stop():
                selection.stopped_at = step + 1
                log(f"stopping early at step {step + 1}: {selection.objective} has not improved for "
                    f"{selection.stale} evaluations (trainer.early_stop_patience={selection.patience}; best "
                    f"{selection.value:.4f} at step {selection.step})")
            if checkpoints is not None:
                with progress.timed(f"checkpoint at step {step + 1}"):
                    checkpoints.step_done(step + 1, state, selection)
            if selection.stopped_at is not None:
                break
            if preemption is not None and step + 1 < stop and preemption.requested(step + 1):
                stop, terminated = step + 1, True  # SIGTERM (or Ctrl-C): stop here, with a checkpoint of this step
                if checkpoints is not None:
                    with progress.timed(f"checkpoint at step {stop} ({preemption.signal})"):
                        checkpoints.save(stop, state, selection)
                break

    finally:
        feed.close()  # the batches read ahead of a step that will not run
    end = trainer.steps if selection.stopped_at is None else selection.stopped_at
    if selection.stopped_at is None and stop < trainer.steps:  # pre-empted (stop_after, SIGTERM), checkpoint written
        if checkpoints is not None:
            checkpoints.wait()
        progress.close()
        return {"summary": {"steps": stop, "stopped_at": stop, "final/train_loss": last.get("train/loss"),
                            **({"terminated": preemption.signal} if terminated else {})},
                "state": state, "best": selection.best}
    # Apply the last deferred update: every update lands exactly once. Its record (emb/flush_grad_norm,
    # emb/flush_valid; async only) and the skip counts after it go into the final row, at the last step.
    with progress.timed("the final flush"):
        state, flushed = flush_fn.with_metrics(state)
    check_health(program, trainer, flushed, end, checkpoints, what="the final flush")
    final = evaluate(predict_host, state, put, B)
    selection.update(end, final, state)
    loss = last.get("train/loss")
    diverged = loss is not None and not np.isfinite(loss)  # the model's parameters are not numbers: not saved
    untrained = None if diverged else never_trained(program, trainer, flushed, end, checkpoints)  # nor an untrained table
    if checkpoints is not None and not diverged and untrained is None:
        with progress.timed(f"checkpoint at step {end}"):
            checkpoints.save_final(state, selection, step=end)
    flushed = {k: _scalar(v) for k, v in placement.fetch(flushed).items()}
    data = dict(getattr(task, "data_metrics", dict)())
    best = selection.summary()
    tracker.log({**final, **flushed, **data, **best}, step=end)
    skipped = {k: v for k, v in flushed.items() if k.startswith("emb/skipped_updates")}
    summary = {"steps": end, "final/train_loss": last.get("train/loss"),
               "perf/examples_per_s": last.get("perf/examples_per_s"), **skipped, **final,
               **{f"final/{k}": v for k, v in final.items()}, **data, **best}
    if selection.active:  # what best/* and early stopping went by (a validation metric, whatever the objective)
        summary["selected_on"] = selection.objective
    tracker.log_summary(summary)
    if checkpoints is not None:
        with progress.timed("waiting for the last checkpoint save"):
            checkpoints.wait()  # the last save is committed, or its failure raised, before the run ends
    progress.close()
    if diverged:
        raise TrainingError(diverged_message(program, loss, end, checkpoints))
    if untrained is not None:
        raise TrainingError(untrained)
    return {"summary": summary, "state": state, "best": selection.best}


def _peek_flush(program: TrainProgram, state: Any):
    """``state`` with its deferred update applied, as new buffers: a flush that does not donate its input."""
    shardings = program.state_shardings(state)
    return jax.jit(lambda s: program.flush(s)[0], in_shardings=(shardings,), out_shardings=shardings)


EXAMPLE_ID = "emb/dropped_id_example/"  # the step's first out-of-range id per table: for strict_ids' message only
SKIP_CAUSES = ("Likely causes: {model}a learning rate too high for this table (optimizer.learning_rate or "
               "table_optimizers.{table}.learning_rate), eps=0, b1 or b2 >= 1, or a non-finite loss (see train/loss "
               "and dense/grad_norm; lower dense_optimizer.learning_rate)")


def _model_causes(program: TrainProgram) -> str:
    """The model's own settings that can make every update non-finite (``skip_causes``), each followed by ``, ``."""
    return "".join(f"{c}, " for c in getattr(program.model, "skip_causes", list)())


def never_trained(program: TrainProgram, trainer: Any, flushed: Mapping[str, Any], end: int,
                  checkpoints: Any) -> str | None:
    """Why a run that reached its end failed although its loss is a number: every one of its ``end`` updates of
    a table was refused, in a run too short for ``trainer.max_skipped_updates`` to stop it (None: none was)."""
    limit = int(getattr(trainer, "max_skipped_updates", 0) or 0)
    keys = [k for k in flushed if k.startswith("emb/consecutive_skips/")]
    got = placement.fetch({k: flushed[k] for k in keys}) if limit > 0 and end > 0 else {}
    names = [k.rsplit("/", 1)[1] for k in sorted(got) if end <= int(got[k]) < limit]
    if not names:
        return None
    last = getattr(checkpoints, "last_step", None) if checkpoints is not None else None
    saved = (f" No checkpoint of this state was saved; the newest is step {last} in {checkpoints.directory}."
             if last is not None and last >= 0 else " No checkpoint of this state was saved.")
    opt = program.emb_optimizers[names[0]]
    return (f"training ended without training table '{names[0]}': every one of the run's {end} embedding updates of "
            f"it was skipped (a longer run would have stopped at trainer.max_skipped_updates={limit}), each with a "
            f"non-finite gradient or writing non-finite rows or optimizer state, so the table and its optimizer state "
            f"are as initialised{'; so were ' + ', '.join(repr(n) for n in names[1:]) if names[1:] else ''}. The "
            f"metrics and summary are written.{saved} Its optimizer: {settings_of(opt)}. "
            + SKIP_CAUSES.format(table=names[0], model=_model_causes(program)) + ". trainer.max_skipped_updates=0 "
            "lets such a run end as a success")


def diverged_message(program: TrainProgram, loss: float, end: int, checkpoints: Any) -> str:
    """Why a run that reached its last step failed: its train loss is not a number (too short a run for
    ``trainer.max_skipped_updates`` to stop it first, or the dense parameters diverged)."""
    last = getattr(checkpoints, "last_step", None) if checkpoints is not None else None
    saved = (f" The newest checkpoint is step {last} in {checkpoints.directory}; resume from an earlier one if it "
             f"holds the divergence too." if last is not None and last >= 0 else "")
    model = _model_causes(program)
    return (f"training diverged: the last logged train loss is {loss} at the end of the run (step {end}), so the "
            f"model's parameters are not numbers; the metrics and summary are written, and no checkpoint of this "
            f"state was saved.{saved} Likely causes: {model}a dense learning rate too high (dense_optimizer."
            f"learning_rate) or an embedding one (optimizer.learning_rate; see emb/skipped_updates)")


ROUTE_KEYS = ("emb/route_overflow/", "emb/route_peak/", "emb/route_refused/")


def _route_slots(ctx: Any) -> str:
    """How many ids a routed table's devices exchange and where the number comes from, for the overflow message."""
    if ctx.layout.splits_width:
        basis = (f"{ctx.route_capacity:g} x {ctx.route_peak}, the most distinct ids one device held in the sampled "
                 f"batches" if ctx.route_peak is not None else f"every distinct id of its {ctx.local_tokens} tokens")
        return (f"mesh.route_capacity={ctx.route_capacity:g} lets each device exchange {ctx.route_slots} distinct "
                f"ids with the other column shards ({basis})")
    basis = (f"{ctx.route_capacity:g} x {ctx.route_peak}, the most distinct ids one device sent one shard in the "
             f"sampled batches" if ctx.route_peak is not None else
             f"{ctx.route_capacity:g} x the even share of {ctx.slot_base(ctx.local_tokens):.0f} ids")
    return f"mesh.route_capacity={ctx.route_capacity:g} gives {ctx.route_slots} slots per device and shard ({basis})"


def route_overflow_message(program: TrainProgram, name: str, overflow: int, refused: int, peak: int,
                           where: str) -> str:
    """Why a run stopped on ids the row layout's all-to-all routing (or the column layout's exchange) had no room
    for, and what to raise."""
    ctx = program.contexts[name]
    column = ctx.layout.splits_width
    held = "distinct ids" if column else "distinct ids for one shard"
    fits = (f" One device had {peak} {held}: mesh.route_capacity="
            f"{peak / ctx.slot_base(ctx.local_tokens):.2f} or more fits that batch." if peak > ctx.route_slots else "")
    if column:  # only "stop" refuses: a rerouted column step exchanges every device's whole buffer
        return (f"training stopped at {where}: table '{name}': {max(overflow, refused)} distinct ids of the batch "
                f"(summed over devices) were past what their device exchanges with the other column shards: "
                f"{_route_slots(ctx)}. None was dropped silently: they read zeros, and an embedding update holding "
                f"them is refused whole.{fits} Raise mesh.route_capacity (see emb/route_peak/{name}, the most "
                f"distinct ids one device held), or set mesh.route_overflow=reroute (such a step exchanges every "
                f"device's whole buffer of ids).")
    if ctx.reroutes:
        return (f"training stopped at {where}: table '{name}': {refused} rows had no room at their owning table "
                f"shard even after the step routed every id in further rounds of its slots: an owner keeps at most "
                f"{ctx.owner_unique - 1} distinct rows, every device's slots for it, and {_route_slots(ctx)}. The "
                f"update was refused whole: nothing of it was written.{fits} Raise mesh.route_capacity (see "
                f"emb/route_peak/{name}), or set mesh.routing=gather.")
    return (f"training stopped at {where}: table '{name}': {max(overflow, refused)} distinct ids of the batch "
            f"(summed over devices) had no slot at their owning table shard: {_route_slots(ctx)}. None was "
            f"dropped silently: they read zeros, and an embedding update holding them is refused whole.{fits} "
            f"Raise mesh.route_capacity (hot ids crowd one shard; see emb/route_peak/{name}), set "
            f"mesh.route_overflow=reroute (such a step routes the rest in further rounds of its slots), or set "
            f"mesh.routing=gather.")


def route_reroute_note(program: TrainProgram, name: str, overflow: int, peak: int, where: str) -> str:
    """The one line a run prints the first time a table's ids overflowed their slots and were rerouted."""
    ctx = program.contexts[name]
    if ctx.layout.splits_width:
        return (f"note: table '{name}' at {where}: {overflow} distinct ids (summed over devices) were past what their "
                f"device exchanges with the other column shards ({peak} distinct ids on one device, "
                f"{_route_slots(ctx)}); the step exchanged every device's whole buffer of ids instead, so nothing "
                f"was lost, but such steps move more. emb/route_overflow/{name} counts them; raise "
                f"mesh.route_capacity if it is often above 0.")
    return (f"note: table '{name}' at {where}: {overflow} distinct ids (summed over devices) had no slot at their "
            f"owning table shard ({peak} for one shard, {_route_slots(ctx)}); the step routed them in further rounds "
            f"of its slots, so nothing was lost, but such steps are slower. emb/route_overflow/{name} counts them; "
            f"raise mesh.route_capacity if it is often above 0.")


def check_health(program: TrainProgram, trainer: Any, metrics: Mapping[str, Any], step: int,
                 checkpoints: Any = None, what: str | None = None, log=None, noted: set | None = None) -> None:
    """Raise a TrainingError when a table's last ``trainer.max_skipped_updates`` updates were all refused,
    or (``trainer.strict_ids``) the batch held an id outside a table. Fetches only the few scalars it needs
    (one device sync a step, only when a check is on)."""
    max_skips = int(getattr(trainer, "max_skipped_updates", 0) or 0)
    strict = bool(getattr(trainer, "strict_ids", False))
    keys = [k for k in metrics if (strict and k.startswith("emb/dropped_id"))
            or (max_skips > 0 and k.startswith("emb/consecutive_skips/")) or k.startswith(ROUTE_KEYS)]
    if not keys:
        return
    got = placement.fetch({k: metrics[k] for k in keys})
    where = what or f"step {step}"
    for name in sorted(program.tables):
        overflow = int(got.get(f"emb/route_overflow/{name}", 0))
        refused = int(got.get(f"emb/route_refused/{name}", 0))
        peak = int(got.get(f"emb/route_peak/{name}", 0))
        if refused or (overflow and not program.contexts[name].reroutes):
            raise TrainingError(route_overflow_message(program, name, overflow, refused, peak, where))
        if overflow and log is not None and noted is not None and name not in noted:
            noted.add(name)
            log(route_reroute_note(program, name, overflow, peak, where))
    for name in sorted(program.logical):  # the model's own tables (a stacked one is checked against its own vocab)
        count = int(got.get(f"emb/dropped_ids/{name}", 0))
        if strict and count:
            example = int(got[f"emb/dropped_id_example/{name}"])
            vocab = program.logical[name].vocab
            raise TrainingError(
                f"table '{name}' got id {example} in the batch of step {step}, outside its vocab [0, {vocab}) "
                f"({count} such ids in that batch; trainer.strict_ids=true stops on them). Fix the data's ids, "
                f"raise model.tables.{name}.vocab above the largest id, or set trainer.strict_ids=false to read "
                f"zeros for them and count them in emb/dropped_ids/{name}.")
    for name in sorted(program.tables):
        streak = int(got.get(f"emb/consecutive_skips/{name}", 0))
        if max_skips > 0 and streak >= max_skips:
            opt = program.emb_optimizers[name]
            last = getattr(checkpoints, "last_step", -1) if checkpoints is not None else -1
            saved = (f" No checkpoint was saved of this state; the newest is step {last} in {checkpoints.directory}"
                     f" (if it is later than step {step - streak}, it was written during the skips: resume from an "
                     f"earlier one with checkpoint.resume=<path>)." if last is not None and last >= 0 else "")
            raise TrainingError(
                f"training stopped at {where}: the last {streak} embedding updates of table '{name}' were all "
                f"skipped (trainer.max_skipped_updates={max_skips}): each had a non-finite gradient or would have "
                f"written non-finite rows or optimizer state, so the table and its optimizer state are as they "
                f"were before step {step - streak + 1}. Its optimizer: {settings_of(opt)}. "
                + SKIP_CAUSES.format(table=name, model=_model_causes(program)) + "." + saved
                + " trainer.max_skipped_updates=0 never stops.")


def _devices(n: int) -> str:
    """``1 device`` / ``8 devices``."""
    return f"{n} device" + ("s" if n != 1 else "")


def _scalar(v: Any) -> Any:
    """A fetched array as a Python number (a scalar) or list, for the summary's JSON."""
    a = np.asarray(v)
    return a.item() if a.ndim == 0 else a.tolist()
