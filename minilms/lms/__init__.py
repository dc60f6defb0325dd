"""The LMS engine: from a net's static schedule to a plan, and the plan replayed.

``liveness`` (every blob's next need), ``plan`` (the plan's types and the knobs, ``Policy``),
``planner`` (``make_plan``), ``bounds`` (``least_pool``: how much pool a net needs), ``host``
(``host_memory``: how much host memory a plan needs), ``check`` (an independent replay of a plan),
``cost`` (the cost model, the timeline of compute and the two copy streams, ``policy: auto``),
``executor`` (a step turned into a layer call; ``ResidentExecutor``, LMS off, the reference),
``ring`` (two sets of homes for what the host writes and reads every iteration; ``Pending``, an
iteration issued whose outputs are read later) and ``replay`` (``LmsExecutor``, which replays a
plan on the copy and compute streams). Start with ``planner`` and ``replay``.
"""
from .auto import auto_plan
from .bounds import least_pool, resident_bytes, working_set_bytes
from .check import check_plan
from .cost import CostModel, measure_cpu, plan_for, simulate
from .executor import Executor, ResidentExecutor
from .host import HomeArena, HostMemory, crossing, homes, host_memory, loader_batches
from .plan import Action, Plan, Policy, StepPlan
from .planner import make_plan
from .replay import LmsExecutor
from .ring import HomeRing, Pending

__all__ = ["Action", "CostModel", "Executor", "HomeArena", "HomeRing", "HostMemory", "LmsExecutor",
           "Pending", "Plan", "Policy", "ResidentExecutor", "StepPlan", "auto_plan", "check_plan",
           "crossing", "homes", "host_memory", "least_pool", "loader_batches", "make_plan",
           "measure_cpu", "plan_for", "resident_bytes", "simulate", "working_set_bytes"]
