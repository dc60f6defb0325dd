"""``python -m minilms.plan CONFIG.yaml ...`` (see ``minilms.commands.plan``), and the planner's
names where code written before ``minilms.lms`` became a package imports them."""
from minilms.lms import (
    Action,
    HostMemory,
    Plan,
    Policy,
    StepPlan,
    host_memory,
    least_pool,
    make_plan,
    resident_bytes,
    working_set_bytes,
)

__all__ = ["Action", "HostMemory", "Plan", "Policy", "StepPlan", "host_memory", "least_pool",
           "make_plan", "resident_bytes", "working_set_bytes"]

if __name__ == "__main__":
    from minilms.commands.common import run
    from minilms.commands.plan import main
    raise SystemExit(run(main))
