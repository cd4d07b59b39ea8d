"""How long a run trains: ``trainer.steps``, or ``trainer.epochs`` over the task's training examples.

The budget is given in one of two units:

- ``trainer.steps``: that many steps of ``trainer.batch_size`` examples (the ranking task's default, 3000);
- ``trainer.epochs``: ``steps = ceil(epochs * examples / batch_size)``, where ``examples`` is what one pass
  over the training data holds. For the sequential task that is the number of users with a training
  prefix (>= 2 items: one input and one target); batches draw users uniformly with replacement, so an
  epoch is that many sequences drawn, not a guarantee that each user was seen. The synthetic ranking
  generator draws fresh examples every step (no finite training set): epochs are refused there.

Precedence: what the command line (or an experiment) sets wins over the model's default. Setting both
``trainer.steps`` and ``trainer.epochs`` is refused (unless the steps are exactly what the epochs make, as in
a config resolved before). The defaults come from the model's YAML: ``conf/model/ranking.yaml`` sets
``trainer.steps: 3000``; ``conf/model/sequential.yaml`` sets ``trainer.steps: null`` and
``trainer.default_epochs``, the budget when neither steps nor epochs is given. ``trainer.eval_interval: null`` means "evaluate at most ``EVALS_PER_RUN`` times": the
interval is derived from the resolved steps (rounded up to a multiple of ``trainer.log_interval`` when that
is shorter, so evaluations land on logged rows).

``resolve`` runs once, when the run is built (``runner.build.build_run``): it writes the resolved
``trainer.steps`` (and a derived ``eval_interval``) into the config, so everything downstream (schedule,
checkpoints, the logged config) sees plain step counts, and returns the :class:`Budget`, which the build
passes on to the run: it converts between steps and epochs for the rest of the run (the summary, the
progress bar, and epoch-based schedules such as early stopping).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from .errors import PreflightError

MAX_EPOCHS = 200  # above this many passes over the data a run is warned about: the data cannot use them
EVALS_PER_RUN = 10  # eval_interval: null -> at most this many evaluations during the run (plus the final one)


def train_examples(task: Any) -> int | None:
    """Examples one epoch passes over (``task.num_train_examples``); None when the task has no finite set."""
    n = getattr(task, "num_train_examples", None)
    return int(n) if n is not None else None


@dataclasses.dataclass(frozen=True)
class Budget:
    """A run's length: ``steps`` of ``batch_size``, and, when the task has a finite training set of
    ``examples``, the same in epochs. ``source`` says which setting it came from."""

    steps: int
    batch_size: int
    examples: int | None = None
    source: str = "trainer.steps"

    @property
    def steps_per_epoch(self) -> float | None:
        return self.examples / self.batch_size if self.examples else None

    def epochs_at(self, step: int) -> float | None:
        """Passes over the training examples after ``step`` steps; None when an epoch is not defined."""
        return step * self.batch_size / self.examples if self.examples else None

    @property
    def epochs(self) -> float | None:
        return self.epochs_at(self.steps)

    @staticmethod
    def steps_for(epochs: float, examples: int, batch_size: int) -> int:
        """The steps that make ``epochs`` passes over ``examples`` (rounded up, at least 1)."""
        return max(1, math.ceil(epochs * examples / batch_size))

    def describe(self) -> str:
        if self.epochs is None:
            return f"{self.steps:,} steps of {self.batch_size:,} ({self.source})"
        return (f"{self.steps:,} steps of {self.batch_size:,} = {self.epochs:.1f} epochs of {self.examples:,} "
                f"training examples ({self.source})")

    def warnings(self) -> list[str]:
        """Lines (each starting with ``warning:``) about a budget far outside what the data can use."""
        if self.epochs is not None and self.epochs > MAX_EPOCHS:
            return [f"warning: {self.describe()}: more than {MAX_EPOCHS} passes over the same data, which a "
                    f"model will overfit long before the end; set trainer.epochs (e.g. trainer.epochs=50) "
                    f"or fewer trainer.steps"]
        return []


def check(trainer: Any) -> None:
    """The budget settings on their own, before any data is read; all problems at once."""
    errors = []
    steps, epochs, default = trainer.get("steps"), trainer.get("epochs"), trainer.get("default_epochs")
    if steps is not None and steps < 1:
        errors.append(f"trainer.steps={steps} must be >= 1 (or null to give trainer.epochs instead)")
    for key, v in (("epochs", epochs), ("default_epochs", default)):
        if v is not None and not (math.isfinite(v) and v > 0):
            errors.append(f"trainer.{key}={v} must be a positive number of passes over the training data")
    if steps is None and epochs is None and default is None:
        errors.append("no training budget: set trainer.steps or trainer.epochs")
    interval = trainer.get("eval_interval")
    if interval is not None and interval < 1:
        errors.append(f"trainer.eval_interval={interval} must be >= 1 (or null: at most {EVALS_PER_RUN} a run)")
    if errors:
        raise PreflightError("invalid config:\n  - " + "\n  - ".join(errors))


def resolve(cfg: Any, task: Any) -> Budget:
    """The run's budget from ``cfg.trainer`` and the task's data; writes the resolved ``trainer.steps`` (and a
    derived ``trainer.eval_interval``) into ``cfg``. Raises PreflightError for a budget that cannot work."""
    t = cfg.trainer
    check(t)
    B, examples = int(t.batch_size), train_examples(task)
    key = "epochs" if t.get("epochs") is not None else "default_epochs"
    if examples is None and (t.get("epochs") is not None or t.steps is None):
        raise PreflightError(
            f"trainer.{key}={t[key]}: data={cfg.data.name} has no finite training set (its generator draws "
            f"fresh examples every step), so an epoch is not defined; give trainer.steps instead")
    if t.steps is not None and t.get("epochs") is not None and not (  # a config resolved before is fine
            examples and Budget.steps_for(float(t.epochs), examples, B) == t.steps):
        raise PreflightError(f"trainer.steps={t.steps} and trainer.epochs={t.epochs:g} are both set: give one "
                             f"of them (add trainer.steps=null to use epochs, or drop trainer.epochs)")
    if t.steps is not None:
        budget = of(cfg, task)
    else:
        if examples < 1:
            raise PreflightError(f"trainer.{key}={t[key]}: data={cfg.data.name} has no training examples")
        budget = Budget(Budget.steps_for(float(t[key]), examples, B), B, examples, f"trainer.{key}={t[key]:g}")
    t.steps = budget.steps
    if t.get("eval_interval", 1) is None:
        t.eval_interval = derived_eval_interval(budget.steps, int(t.log_interval))
    return budget


def derived_eval_interval(steps: int, log_interval: int, evals: int = EVALS_PER_RUN) -> int:
    """At most ``evals`` evaluations over ``steps``: every ceil(steps / evals) steps, rounded up to a multiple
    of ``log_interval`` when that is no longer (so an evaluation lands on a logged row)."""
    interval = max(1, math.ceil(steps / evals))
    if 1 <= log_interval <= interval:
        interval = math.ceil(interval / log_interval) * log_interval
    return interval


def of(cfg: Any, task: Any) -> Budget:
    """The budget of a config whose ``trainer.steps`` is set (``resolve`` for such a config; a test's check of
    a resolved one), with the setting it came from."""
    t = cfg.trainer
    steps, B, examples = int(t.steps), int(t.batch_size), train_examples(task)
    source = "trainer.steps"
    if examples:
        for key in ("epochs", "default_epochs"):
            if t.get(key) is not None and Budget.steps_for(float(t[key]), examples, B) == steps:
                source = f"trainer.{key}={t[key]:g}"
                break
    return Budget(steps, B, examples, source)
