"""Learning-rate schedules: the config's ``solver.schedule`` section as a function of the iteration.

``make_schedule(section, base_lr, total_iters)`` returns a ``Schedule``; ``schedule(iteration)`` is
the learning rate for that iteration, counted from 0, and ``schedule.describe()`` says it in one
line. The trainer sets ``solver.lr = schedule(iteration)`` before each update.

The decays are PyTorch's, stepped once per iteration, so a run can be compared with
``torch.optim.lr_scheduler`` number for number:

* ``constant``   ``base_lr``
* ``step``       ``base_lr * gamma ** (iteration // step_size)``            (``StepLR``)
* ``multistep``  ``base_lr * gamma ** (number of milestones <= iteration)``  (``MultiStepLR``)
* ``cosine``     ``min_lr + (base_lr - min_lr) * (1 + cos(pi * iteration / total_iters)) / 2``
                 (``CosineAnnealingLR`` with ``T_max = total_iters``, ``eta_min = min_lr``)

One deliberate difference: past ``total_iters`` the cosine stays at ``min_lr``; PyTorch's keeps
going round the cosine and climbs back to ``base_lr``, which no run that ends at ``total_iters``
wants (and a resumed run that trains longer should not see its rate jump up).

Warm-up, the one rule for every type: over the first ``warmup_iters`` iterations the decayed rate is
multiplied by ``(iteration + 1) / warmup_iters``, so it rises linearly from
``base_lr / warmup_iters`` and reaches the undamped schedule at iteration ``warmup_iters - 1`` with
no jump. The decay itself keeps counting from iteration 0 (milestones, step sizes and the cosine's
length are the absolute iteration numbers written in the config, as in Detectron2's
``WarmupMultiStepLR``), so a warm-up never shifts when a decay happens.
"""
import math
from bisect import bisect_right
from dataclasses import dataclass

from .errors import ConfigError

TYPES = ("constant", "step", "multistep", "cosine")
WHERE = "solver.schedule"


@dataclass(frozen=True)
class Schedule:
    """The learning rate for each iteration; build one with ``make_schedule``."""

    type: str
    base_lr: float
    total_iters: int | None
    step_size: int | None = None
    gamma: float = 0.1
    milestones: tuple = ()
    warmup_iters: int = 0
    min_lr: float = 0.0

    def __call__(self, iteration: int) -> float:
        if iteration < 0:
            raise ValueError(f"iteration: expected an integer >= 0, found {iteration}")
        return self.decayed(iteration) * self.warmup_factor(iteration)

    def decayed(self, iteration: int) -> float:
        """The rate without warm-up."""
        if self.type == "step":
            return self.base_lr * self.gamma ** (iteration // self.step_size)
        if self.type == "multistep":
            return self.base_lr * self.gamma ** bisect_right(self.milestones, iteration)
        if self.type == "cosine":
            if iteration >= self.total_iters:
                return self.min_lr
            cosine = (1 + math.cos(math.pi * iteration / self.total_iters)) / 2
            return self.min_lr + (self.base_lr - self.min_lr) * cosine
        return self.base_lr

    def warmup_factor(self, iteration: int) -> float:
        if iteration >= self.warmup_iters:
            return 1.0
        return (iteration + 1) / self.warmup_iters

    def describe(self) -> str:
        """One line for people, e.g. ``lr 0.1, x0.1 every 30 iterations, warm-up 5 iterations``."""
        if self.type == "step":
            decay = f"x{self.gamma:g} every {self.step_size} iterations"
        elif self.type == "multistep":
            decay = f"x{self.gamma:g} at iterations {', '.join(map(str, self.milestones))}"
        elif self.type == "cosine":
            decay = f"cosine to {self.min_lr:g} over {self.total_iters} iterations"
        else:
            decay = "constant"
        warmup = (f", linear warm-up over the first {self.warmup_iters} iterations "
                  f"(from {self.base_lr / self.warmup_iters:g})" if self.warmup_iters else "")
        return f"lr {self.base_lr:g}, {decay}{warmup}"


def make_schedule(section: dict, base_lr: float, total_iters: int | None = None) -> Schedule:
    """The schedule a resolved ``solver.schedule`` section describes (keys missing from it take
    the config's defaults). ``total_iters`` is the run's length, which only cosine needs.
    Raises ``ConfigError`` naming the key for a value the config schema would also have refused."""
    kind = section.get("type", "constant")
    if kind not in TYPES:
        raise ConfigError(f"{WHERE}.type", f"one of {', '.join(TYPES)}", kind)
    if not base_lr > 0:
        raise ConfigError("solver.lr", "a number > 0", base_lr)
    step_size = section.get("step_size")
    gamma = section.get("gamma", 0.1)
    milestones = tuple(section.get("milestones") or ())
    warmup_iters = section.get("warmup_iters") or 0
    min_lr = section.get("min_lr")
    min_lr = 0.0 if min_lr is None else min_lr
    if kind == "step" and not (isinstance(step_size, int) and step_size >= 1):
        raise ConfigError(f"{WHERE}.step_size", "an integer >= 1 for a step schedule", step_size)
    if kind == "multistep" and (not milestones or list(milestones) != sorted(set(milestones))):
        raise ConfigError(f"{WHERE}.milestones",
                          "a non-empty list of increasing integers for a multistep schedule",
                          list(milestones))
    if not gamma > 0:
        raise ConfigError(f"{WHERE}.gamma", "a number > 0", gamma)
    if not (isinstance(warmup_iters, int) and warmup_iters >= 0):
        raise ConfigError(f"{WHERE}.warmup_iters", "an integer >= 0", warmup_iters)
    if kind == "cosine":
        if not 0 <= min_lr <= base_lr:
            raise ConfigError(f"{WHERE}.min_lr", f"a number in [0, solver.lr ({base_lr:g})]",
                              min_lr)
        if not (isinstance(total_iters, int) and total_iters >= 1):
            raise ConfigError("train", "a run of at least 1 iteration for a cosine schedule",
                              total_iters)
    return Schedule(kind, float(base_lr), total_iters, step_size, float(gamma), milestones,
                    warmup_iters, float(min_lr))
