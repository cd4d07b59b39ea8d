"""The train loop's batches, built ahead of the steps that use them by a Grain pipeline.

Every task's ``batch(step, batch_size, shard, num_shards)`` is a pure function of the step (the ranking data
is drawn from (seed, step); the Criteo order is a seeded permutation of the step's positions; the sequence
tasks' order likewise). So the feed is Grain's random-access ``MapDataset`` over the steps ``[start, stop)``,
each mapped to its batch:

- deterministic: the same batches in the same order however they are read ahead;
- sharded: each process builds only the rows of each global batch its devices hold (``shard`` of
  ``num_shards``);
- checkpointable with nothing but the step: a resumed or relaunched run starts the range at the step its
  checkpoint holds and reads exactly the batches an uninterrupted run would (Grain's own iterator state is not
  needed, so a resume onto another mesh or process count works the same);
- read ahead: ``trainer.data_workers`` worker processes (Grain's ``mp_prefetch``; each builds every
  ``data_workers``-th batch, in order), or with 0 (the default) one background thread of the run's process,
  ``PREFETCH`` batches ahead of the step.
"""
from __future__ import annotations

import sys
from typing import Any, Iterator, Mapping

import numpy as np

PREFETCH = 2  # batches a thread (or each worker process) builds ahead of the step that needs them
QUIET_TRACKER = "ignore:resource_tracker:UserWarning"  # the warning filter the resource tracker is started with


class StepBatch:
    """``step -> task.batch(step, batch_size, **rows)``: the map of the feed's ``MapDataset`` (picklable, so worker
    processes can run it: the task is pickled once per worker)."""

    def __init__(self, task: Any, batch_size: int, rows: Mapping[str, int]):
        self.task, self.batch_size, self.rows = task, batch_size, dict(rows)

    def __call__(self, step: int) -> dict[str, np.ndarray]:
        return self.task.batch(int(step), self.batch_size, **self.rows)


class Feed:
    """The batches of steps ``[start, stop)`` in order: ``next(feed)``; ``close()`` stops what reads ahead."""

    def __init__(self, task: Any, start: int, stop: int, batch_size: int, rows: Mapping[str, int] | None = None,
                 workers: int = 0, prefetch: int = PREFETCH):
        import grain  # noqa: PLC0415 - only where batches are fed

        self.start, self.stop = int(start), int(max(stop, start))
        ds = grain.MapDataset.range(self.start, self.stop).map(StepBatch(task, batch_size, rows or {}))
        read = grain.ReadOptions(num_threads=1 if workers == 0 and prefetch > 0 else 0,
                                 prefetch_buffer_size=prefetch if workers == 0 else 1)
        it = ds.to_iter_dataset(read)
        if workers > 0:
            from absl import flags  # noqa: PLC0415 - Grain's workers read absl flags, parsed or not

            if not flags.FLAGS.is_parsed():  # a program not run by absl.app (the runner): Grain's defaults
                flags.FLAGS.mark_as_parsed()
            # Batches come back in shared memory, which this process frees as it uses them; Python's resource
            # tracker still lists the workers' blocks as leaked when the run ends (google/grain#398), one warning a
            # run: the tracker process (started by the first worker) takes its warning filters from here.
            if QUIET_TRACKER not in sys.warnoptions:
                sys.warnoptions.append(QUIET_TRACKER)
            it = it.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=prefetch))
        self._it = iter(it)
        self.step = self.start  # the step of the next batch

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self.step >= self.stop:
            raise StopIteration
        batch = next(self._it)
        self.step += 1
        return batch

    def close(self) -> None:
        """Stop reading ahead (worker processes end, the thread stops); safe to call twice."""
        close = getattr(self._it, "close", None)
        if close is not None:
            close()

    def __enter__(self) -> "Feed":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
