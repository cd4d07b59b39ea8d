"""The train step: a pure ``step(state, batch) -> (state, metrics)`` jitted once with explicit shardings and
a donated state, plus the flush and eval functions that go with it.

Sync mode (``async_emb=off``): look up rows, forward + backward, apply this step's embedding update through
the fused kernels, update the dense parameters.

Async mode (``async_emb=on``), step t:
  1. look up the rows for batch t (they hold updates G_0..G_{t-2});
  2. start applying the deferred update G_{t-1}, gated on the lookup so the writes follow the reads, while
     the forward and backward pass of batch t run (nothing in them depends on the update);
  3. finish it (norm, valid);
  4. return G_t, deduplicated, as the new deferred update. Staleness is exactly one step.
Both modes use the same fused kernels; ``flush`` applies the last deferred update.

Bounded staleness k > 1 (``async_emb.staleness``): the state holds a queue of the k last deferred updates,
oldest first (a tuple of k records per table), so step t applies G_{t-k} (the head) and appends G_t;
``flush`` applies all k in order. The compiled step takes only the head (and the later records' ids, for the
stale-rows diagnostic) and returns only G_t; ``StepFn`` shifts the queue outside it, so the records that stay
queued are never copied and a step costs what a k = 1 step does. k = 1 keeps the single record above,
unchanged. Delay compensation (``async_emb.compensation=dc``): each record also carries the rows its gradient
was computed on (the lookup of its step), and the fused update corrects the late gradient by them
(``optimizers.AsyncEmbContext.dc_lambda``). Hash tables map ids to slots first (``hash_step.map_batch``)."""
from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding

from optimizers import (AsyncEmbContext, AsyncEmbGradientUpdate, compiler_options, dedupe, empty_update,
                        supports_async_emb)

from . import hash_step, hash_tables, mesh as mesh_lib, stacking as stacking_lib
from .failures import traced
from .dense_optimizer import DenseOptimizer
from .embeddings import TableSpec, in_id_order, lookup, lookup_counted, stored_rows, table_values
from .compiled import FlushFn, StepFn, reused
from .diagnostics import is_log_step, overlap, routed_diagnostics, skip_metrics
from .flush import count_skips, flush_state
from .state import SkipCounts, TrainState


@partial(jax.jit, static_argnums=2)
def _rows_at(table: jax.Array, rows: jax.Array, width: int) -> jax.Array:
    """``table``'s ``rows``, their first ``width`` columns (``TrainProgram.table_of``): one program, not an
    operation at a time."""
    return table[rows][:, :width]


@dataclasses.dataclass(frozen=True, eq=False)
class TrainProgram:
    """Everything static about a run's step: model, tables, optimizers, mesh and mode."""

    model: Any
    tables: Mapping[str, TableSpec]
    contexts: Mapping[str, AsyncEmbContext]
    emb_optimizers: Mapping[str, Any]
    dense: DenseOptimizer
    async_emb: bool
    mesh: Mesh
    model_keys: tuple[str, ...]
    # Diagnostics that cost real work (async: rows read while their update was pending) are computed only
    # on steps the loop logs: every ``detail_interval``-th step and the last one (``detail_last``); -1 else.
    detail_interval: int = 1
    detail_last: int = 0
    # Programs built alike in one process (``build.program_key``: the same config up to the settings no traced
    # function reads) share their jitted functions, so a relaunch in the same process (a resume, a sweep's
    # trial that differs only in the step's arguments) traces and compiles nothing again. None: never shared.
    reuse_key: str | None = None
    # table -> the config key of its optimizer ("optimizer" or "table_optimizers.<table>"), for the message of
    # an optimizer that fails (``failures.py``)
    optimizer_keys: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # async: steps a deferred update waits (1: the next step applies it; k > 1: a queue of k records)
    staleness: int = 1
    # The model's own tables (``tables`` holds the physical ones), and which of them share a physical table
    # (``stacking``, ``model.stack_tables``). None: the same as ``tables``, nothing stacked.
    logical: Mapping[str, TableSpec] | None = None
    stacking: stacking_lib.Stacking | None = None

    def __post_init__(self):
        if self.logical is None:
            object.__setattr__(self, "logical", dict(self.tables))
        if self.stacking is None:
            object.__setattr__(self, "stacking", stacking_lib.identity(self.tables))

    @property
    def dense_tx(self) -> optax.GradientTransformation:
        """The dense optimizer with its schedule's numbers as constants (the step gets them as arguments)."""
        return self.dense.tx()

    def run_args(self) -> dict[str, jax.Array]:
        """The numbers the compiled step takes as arguments rather than constants (the dense schedule and
        which steps are logged), so runs that differ only in them share one program."""
        args = {**self.dense.schedule_args(), "detail_interval": self.detail_interval,
                "detail_last": self.detail_last}
        rep = mesh_lib.replicated(self.mesh)
        return {k: jax.device_put(jnp.asarray(v, jnp.int32 if k.startswith("detail") else jnp.float32), rep)
                for k, v in args.items()}

    # ----- state -------------------------------------------------------------------------------------
    def state_shardings(self, state: TrainState) -> TrainState:
        """The sharding of each leaf of ``state`` (a pytree like it): tables, their optimizer state and the
        deferred update as each table's context lays them out, everything else replicated."""
        rep = mesh_lib.replicated(self.mesh)
        ctxs = self.contexts
        return TrainState(
            step=rep,
            params=jax.tree.map(lambda _: rep, state.params),
            opt_state=jax.tree.map(lambda _: rep, state.opt_state),
            tables={n: NamedSharding(self.mesh, ctxs[n].table_spec()) for n in state.tables},
            emb_states={n: mesh_lib.named(self.mesh, ctxs[n].state_specs(s)) for n, s in state.emb_states.items()},
            pending={n: self._queued(mesh_lib.named(self.mesh, AsyncEmbGradientUpdate(*ctxs[n].update_specs())))
                     for n in state.pending},
            rng=rep,
            skips=jax.tree.map(lambda _: rep, state.skips),
            hashed={n: mesh_lib.named(self.mesh, hash_step.state_specs(self, n, h)) for n, h in state.hashed.items()},
        )

    def state_shapes(self, seed: int) -> TrainState:
        """The initial state's shapes and dtypes, nothing allocated or compiled (``init_state``'s jitted program
        cannot be traced inside another transformation: its compiler options belong to a top-level jit)."""
        memo = self.__dict__.setdefault("_state_shapes", {})  # traced once a seed: the run and its restore ask
        if seed not in memo:
            key, rng = jax.random.key(seed), jax.random.key_data(jax.random.key(seed + 1))
            memo[seed] = jax.eval_shape(self._init, key, rng)
        return memo[seed]

    def init_state(self, seed: int) -> TrainState:
        """The initial state, built by one jitted program straight into its shardings (each table shard
        filled in place on its device; see ``init_table``)."""
        key, rng = jax.random.key(seed), jax.random.key_data(jax.random.key(seed + 1))

        def jit_init():
            shapes = self.state_shapes(seed)
            opts = compiler_options([t.dtype for t in self.tables.values()])  # may be traced inside another jit
            return jax.jit(self._init, out_shardings=self.state_shardings(shapes), compiler_options=opts)

        return self._reused(("init",), jit_init)(key, rng)

    def _init(self, key: jax.Array, rng: jax.Array) -> TrainState:
        """The initial state from ``key`` (dense parameters, tables) and ``rng`` (per-step randomness)."""
        k_params, k_tables = jax.random.split(key)
        params = self.model.init(k_params)
        opt_state = self.dense_tx.init(params)
        tables, emb_states, pending = {}, {}, {}
        index = {n: i for i, n in enumerate(sorted(self.logical))}  # each model table's own key, stacked or not
        for name, spec in sorted(self.tables.items()):
            ctx = self.contexts[name]
            members = self.stacking.stacks.get(name)
            key = ([jax.random.fold_in(k_tables, index[m]) for m in members] if members
                   else jax.random.fold_in(k_tables, index[name]))
            tables[name] = table_values(spec, key, NamedSharding(self.mesh, ctx.table_spec()))
            with traced(self, name, "its state was built (init)"):
                emb_states[name] = self.emb_optimizers[name].init(spec.rows, spec.columns)
            if self.async_emb:
                empty = empty_update(ctx)
                pending[name] = self._queued(empty)
        zero = jnp.zeros((), jnp.int32)
        hashed = {n: hash_tables.init_state(s.hash) for n, s in sorted(self.tables.items()) if s.kind == "hash"}
        return TrainState(zero, params, opt_state, tables, emb_states, pending, rng,
                          {name: SkipCounts(zero, zero) for name in sorted(self.tables)}, hashed)

    # ----- the queue of deferred updates (staleness k > 1) -------------------------------------------
    def _queued(self, record):
        """A table's deferred updates as the state keeps them, from one ``record`` (or its shardings): the
        record itself (k = 1), or a queue of k of it, oldest first."""
        return record if self.staleness == 1 else (record,) * self.staleness

    def split_queue(self, pending: Mapping[str, Any]) -> tuple[dict, dict]:
        """``(head, later)``: per table the record this step applies, and the records queued behind it
        (none for k = 1)."""
        if self.staleness == 1:
            return dict(pending), {}
        return {n: q[0] for n, q in pending.items()}, {n: tuple(q[1:]) for n, q in pending.items()}

    def shift_queue(self, later: Mapping[str, tuple], new: Mapping[str, Any]) -> dict:
        """The deferred updates after a step: each table's ``later`` records with its ``new`` one behind
        them (``new`` itself for k = 1)."""
        if self.staleness == 1:
            return dict(new)
        return {n: (*later[n], u) for n, u in new.items()}

    @staticmethod
    def later_ids(later: Mapping[str, tuple]) -> dict[str, list]:
        """Each later record as (its unique ids, whether it is pending): all the stale-rows diagnostic reads."""
        return {n: [(r.unique_tokens, r.pending) for r in q] for n, q in later.items()}

    # ----- the step ----------------------------------------------------------------------------------
    def _apply(self, name: str, ctx: AsyncEmbContext, update, table, emb_state, gate):
        """One table's update through its optimizer; returns (table, state, norm, valid, rows_per_shard)."""
        opt = self.emb_optimizers[name]
        with traced(self, name, "the train step"):  # a user's rule that raises: one message naming it
            if supports_async_emb(opt):
                _, table, emb_state = opt.gradient_update_start(ctx, update, table, emb_state, gate)
                norm, valid, _ = opt.gradient_update_done(ctx, gate)
                return table, emb_state, norm, valid, ctx.results.get("rows_per_shard")
            table, emb_state, norm, valid = opt.apply_dense(ctx, update, table, emb_state)  # sync mode only
            return table, emb_state, norm, valid, None

    def table_ids(self, batch: Mapping[str, jax.Array], hashed_rows: Mapping[str, jax.Array] | None = None,
                  raw_ids: Mapping[str, jax.Array] | None = None) -> tuple[dict[str, jax.Array], dict[str, jax.Array]]:
        """The rows the model's ids (``raw_ids``, or ``model.table_ids(batch)``) use, per table: the id, or its
        relabelling under ``mesh.permute_ids`` (``embeddings.stored_rows``; the one place ids become rows, so
        lookups, update records and row statistics all count stored rows), with every id outside ``[0, vocab)``
        replaced by the out-of-range id (the stored row count): it reads zeros on every layout and no update
        touches a row for it. Also returns each dense table's mask of those ids. A hash table's rows are
        ``hashed_rows`` (``hash_step.map_batch``), a modulo table's its ids hashed onto rows ``[1, vocab)``."""
        ids, bad, dense = {}, {}, {}
        for n, raw in (self.model.table_ids(batch) if raw_ids is None else raw_ids).items():
            if self.logical[n].kind != "dense":
                ids[n] = hash_step.keyed_rows(self.logical[n], raw, hashed_rows)
            else:
                dense[n] = raw.astype(jnp.int32)
                bad[n] = (dense[n] < 0) | (dense[n] >= self.logical[n].vocab)  # the model's own table's vocab
        # Stacked tables (``stacking``): their ids side by side in their stack's rows, out-of-range ids -1.
        for n, raw in self.stacking.physical_ids(dense, bad).items():
            out = (raw < 0) | (raw >= self.tables[n].vocab)
            ids[n] = jnp.where(out, self.contexts[n].stored_rows, stored_rows(self.tables[n], raw, self.mesh))
        return ids, bad

    def table_of(self, state: TrainState, name: str) -> jax.Array:
        """The model's table ``name`` as ``[vocab, width]`` rows in id order (row i: id i), out of its stack when
        it is stacked and unpermuted under ``mesh.permute_ids``: e.g. to read or export one feature's
        embeddings."""
        m, spec = self.stacking.members[name], self.logical[name]
        ids = np.arange(spec.vocab, dtype=np.int32)  # the rows are worked out on the host, read in one program
        phys = jax.device_put(np.where(ids == 0, 0, ids + (m.base - 1)).astype(np.int32))
        rows = stored_rows(self.tables[m.stack], phys, self.mesh, split=False)
        return _rows_at(state.tables[m.stack], rows, spec.width)  # a table stored padded: its own columns

    def model_loss(self, params, embs: Mapping[str, jax.Array], batch, raw_ids: Mapping[str, jax.Array]):
        """The model's loss of the physical tables' rows ``embs`` (each logical table's rows split out of its
        stack), so its gradient comes back per physical table."""
        return self.model.loss(params, self.stacking.logical_rows(embs, {n: x.shape for n, x in raw_ids.items()}),
                               batch)

    def train_step(self, state: TrainState, batch: Mapping[str, jax.Array], args: Mapping[str, jax.Array] | None = None):
        """One step; ``args`` are ``run_args()`` (traced in the compiled step; None = the same as constants).
        The compiled step (``StepFn``) runs ``step_core`` and shifts the queue outside it, as here."""
        head, later = self.split_queue(state.pending)
        new_state, metrics = self.step_core(state._replace(pending=head), batch, args, self.later_ids(later))
        return new_state._replace(pending=self.shift_queue(later, new_state.pending)), metrics

    def step_core(self, state: TrainState, batch: Mapping[str, jax.Array], args: Mapping[str, jax.Array] | None,
                  later: Mapping[str, list]):
        """``train_step`` with ``state.pending`` holding only each table's head record (``split_queue``) and
        ``later`` the ids of those queued behind it (``later_ids``); the new state's ``pending`` is this step's
        records. So the compiled step neither reads nor writes the records that stay queued."""
        args = self.run_args() if args is None else args
        raw_ids = self.model.table_ids(batch)
        state, hashed_rows, moved, hash_metrics = hash_step.map_batch(self, state, raw_ids)
        ids, bad_ids = self.table_ids(batch, hashed_rows, raw_ids)
        ctxs = {n: c.fresh() for n, c in self.contexts.items()}
        detail = is_log_step(state.step + 1, args["detail_interval"], args["detail_last"])
        # The batch's distinct ids. Routed row and column tables never dedupe the whole batch (each device
        # dedupes its own tokens in its lookup, which is also its update record): for them one global dedupe
        # feeds the diagnostics (distinct ids, stale rows), on logged steps only.
        routed = {n for n in ids if ctxs[n].per_device_record}  # per-device records (routed row, column)
        dedup = {n: dedupe(ids[n], ctxs[n].stored_rows, ctxs[n].num_unique,
                           method="native" if ctxs[n].one_device else None) for n in ids if n not in routed}
        head, stale_dropped = hash_step.drop_moved(self, state.pending, moved)
        # every record still pending, as (its ids, whether pending): the rows a read misses. Only those two
        # leaves go into the diagnostics' cond (a whole record there would be copied every step).
        queued = {n: [(q.unique_tokens, q.pending), *later.get(n, [])] for n, q in head.items()}
        diag = {n: jax.lax.cond(detail, partial(routed_diagnostics, ids[n], ctxs[n]), lambda p: (jnp.int32(-1),) * 2,
                                queued.get(n) if self.async_emb else None) for n in sorted(routed)}
        looked = {n: lookup_counted(ctxs[n], state.tables[n], ids[n], with_dedupe=n in routed) for n in ids}
        embs = {n: e for n, (e, *_) in looked.items()}
        tables, emb_states = dict(state.tables), dict(state.emb_states)
        applied: dict[str, tuple] = {}
        metrics: dict[str, jax.Array] = {**hash_metrics, **stale_dropped}

        if self.async_emb:  # apply G_{t-1}, ordered after this step's lookups, beside the forward pass
            gate = sum(e.reshape(-1)[0] for e in embs.values())
            for n, upd in head.items():
                metrics[f"emb/stale_rows/{n}"] = diag[n][1] if n in routed else jax.lax.cond(
                    detail, partial(overlap, rows=ctxs[n].stored_rows), lambda *_: jnp.int32(-1), dedup[n][0],
                    queued[n])
                tables[n], emb_states[n], *applied[n] = self._apply(n, ctxs[n], upd, tables[n], emb_states[n], gate)

        (loss, outputs), (g_params, g_embs) = jax.value_and_grad(self.model_loss, argnums=(0, 1), has_aux=True)(
            state.params, embs, batch, raw_ids)

        dense_norm = optax.tree.norm(g_params)
        dense_ok = jnp.isfinite(dense_norm)
        upd, new_opt_state = self.dense.tx(args).update(g_params, state.opt_state, state.params)
        new_params = optax.apply_updates(state.params, upd)
        params, opt_state = jax.tree.map(lambda new, old: jnp.where(dense_ok, new, old),
                                         (new_params, new_opt_state), (state.params, state.opt_state))

        record = {n: looked[n][2] if n in routed else dedup[n] for n in ids}  # (unique ids, segment ids)
        updates = {n: AsyncEmbGradientUpdate(record[n][0], g_embs[n].reshape(-1, g_embs[n].shape[-1]), record[n][1],
                                             jnp.ones((), bool),  # the rows the gradient saw: compensation only
                                             embs[n].reshape(-1, embs[n].shape[-1]) if ctxs[n].compensates else None)
                   for n in ids}
        if self.async_emb:
            pending = updates  # G_t: into fresh buffers (the queue behind the head is shifted outside the step)
        else:
            pending = {}
            for n, u in updates.items():
                tables[n], emb_states[n], *applied[n] = self._apply(n, ctxs[n], u, tables[n], emb_states[n], loss)

        norms = jnp.stack([a[0] for a in applied.values()]) if applied else jnp.zeros((0,))
        metrics.update({
            "train/loss": loss,
            "emb/grad_norm": jnp.sqrt(jnp.sum(norms * norms)),
            "emb/valid_step": jnp.all(jnp.stack([a[1] for a in applied.values()])) if applied else jnp.array(False),
            "emb/unique_rows": jnp.where(detail | (not routed), sum(
                diag[n][0] if n in routed else jnp.sum(dedup[n][0] < ctxs[n].stored_rows) for n in ids), -1),
            "dense/grad_norm": dense_norm,
            "dense/learning_rate": self.dense.schedule(args)(state.step),
            "outputs": outputs,
        })
        for n, (norm, valid, rows) in applied.items():
            metrics[f"emb/grad_norm/{n}"] = norm
            metrics[f"emb/valid/{n}"] = valid
            lr_at = getattr(self.emb_optimizers[n], "learning_rate_at", None)
            if lr_at is not None:  # the learning rate the update applied in this step used (its schedule's value)
                metrics[f"emb/learning_rate/{n}"] = jnp.asarray(lr_at(state.emb_states[n].count + 1), jnp.float32)
            if rows is not None and rows.shape[0] > 1:
                metrics[f"emb/shard_rows_max/{n}"] = jnp.max(rows)
                metrics[f"emb/shard_rows_mean/{n}"] = jnp.mean(rows.astype(jnp.float32))
        if self.async_emb:
            stale = sum(metrics[f"emb/stale_rows/{n}"] for n in head)
            metrics["emb/stale_rows"] = jnp.where(detail, stale, -1)
        for n, (_, (overflow, peak), *_) in looked.items():  # ids with no slot at their owner / past the exchange
            if ctxs[n].counts_routes:
                metrics[f"emb/route_overflow/{n}"] = overflow
                metrics[f"emb/route_peak/{n}"] = peak
                metrics[f"emb/route_refused/{n}"] = ctxs[n].results.get("route_refused", jnp.int32(0))
        for n, bad in bad_ids.items():  # ids outside [0, vocab): they read zeros and update nothing
            metrics[f"emb/dropped_ids/{n}"] = jnp.sum(bad).astype(jnp.int32)
            # One of them (the first in batch order), so trainer.strict_ids can name it; not logged.
            # A masked sum, not an index: indexing a batch split over the mesh would all-gather it.
            flat = raw_ids[n].reshape(-1).astype(jnp.int32)
            first = jnp.arange(flat.shape[0]) == jnp.argmax(bad.reshape(-1))
            metrics[f"emb/dropped_id_example/{n}"] = jnp.sum(jnp.where(first, flat, 0))
        skips = count_skips(state.skips, {n: a[1] for n, a in applied.items()},
                            {n: (head[n] if self.async_emb else updates[n]).pending for n in applied})
        metrics.update(skip_metrics(skips))
        return TrainState(state.step + 1, params, opt_state, tables, emb_states, pending, state.rng, skips,
                          state.hashed), metrics

    def flush(self, state: TrainState) -> tuple[TrainState, dict[str, jax.Array]]:
        """Apply every pending deferred update now; afterwards nothing is pending (``runner.core.flush``)."""
        return flush_state(self, state)

    def predict(self, state: TrainState, batch: Mapping[str, jax.Array]) -> jax.Array:
        """The model's scores of ``batch`` under ``state`` (for evaluation), tables looked up as in the step."""
        raw_ids = self.model.table_ids(batch)
        ids, _ = self.table_ids(batch, hash_step.read_rows(self, state, raw_ids), raw_ids)
        embs = {n: lookup(self.contexts[n], state.tables[n], ids[n]) for n in ids}
        embs = self.stacking.logical_rows(embs, {n: x.shape for n, x in raw_ids.items()})
        # The model scores catalogues by row number: it gets every table with row i holding id i (a gather
        # under mesh.permute_ids, dropped by the compiler for a model that never reads the tables).
        return self.model.predict(state.params, embs, batch,
                                  {n: in_id_order(self.tables[n], t, self.mesh)[:, :self.tables[n].width]
                                   for n, t in state.tables.items()})

    # ----- compiled entry points ---------------------------------------------------------------------
    def compile(self, state: TrainState, example_batch: Mapping[str, Any]):
        """Jitted (step, flush, predict) with explicit in/out shardings; step and flush donate the state. A
        program with the ``reuse_key`` of one compiled earlier in this process (and batches of the same
        shapes) gets that program's jitted functions, with its own run arguments."""
        shapes = tuple((k, tuple(v.shape), str(v.dtype)) for k, v in sorted(example_batch.items()))
        args = self.run_args()
        step, flush, predict = self._reused(("step", shapes), lambda: self._jit(state, example_batch, args))
        return StepFn(step, args, self), FlushFn(flush), predict

    def _reused(self, what: tuple, make):
        """``make()``'s jitted function(s), or those a program with this ``reuse_key`` made earlier in this
        process for the same ``what`` (``compiled.reused``)."""
        return make() if self.reuse_key is None else reused((self.reuse_key, *what), make)

    def _jit(self, state: TrainState, example_batch: Mapping[str, Any], args: Mapping[str, jax.Array]):
        """The jitted (step, flush, predict) for states like ``state`` and batches like ``example_batch``."""
        s_sh = self.state_shardings(state)
        b_sh = {k: mesh_lib.batch_sharding(self.mesh, v) for k, v in example_batch.items()}
        # bf16 tables: no f32 table copies; one device: the older fusion emitters (optimizers.compiler_options),
        # which speed up the fused updates' gathers and scatters; a program whose tables all take optax's dense
        # updates keeps the default emitters (its step measured about 1.15x faster with them)
        fused = any(supports_async_emb(o) for o in self.emb_optimizers.values())
        opts = compiler_options([t.dtype for t in self.tables.values()], self.mesh.size if fused else None)
        head_sh, later_sh = self.split_queue(s_sh.pending)
        step = jax.jit(lambda rest, head, later, batch, a: self.step_core(rest._replace(pending=head), batch, a, later),
                       in_shardings=(s_sh._replace(pending={}), head_sh, self.later_ids(later_sh), b_sh,
                                     {k: v.sharding for k, v in args.items()}),
                       out_shardings=(s_sh._replace(pending=head_sh), None), donate_argnums=0,
                       compiler_options=opts)
        flush = jax.jit(self.flush, in_shardings=(s_sh,), out_shardings=(s_sh, None), donate_argnums=0,
                        compiler_options=opts)
        predict = jax.jit(self.predict, in_shardings=(s_sh, b_sh), compiler_options=opts)
        return step, flush, predict
