"""Liveness: every blob's uses across a schedule, and its next *need* after any step.

A blob's need is its next read or update before any overwrite: a blob whose next use writes it
whole is dead until then. Blobs that outlive the iteration (parameters, optimizer state) are
needed again in the next one; the net's outputs (loss, accuracy) are read by the host after the
last step; its inputs (and the loss gradient seed) arrive fresh on the host each iteration. The
planner (``minilms.plan``) decides everything from these answers.
"""
import bisect

from ..net import Net, Step

PERSISTENT_ROLES = ("param", "optimizer_state")
INFINITY = float("inf")


class Liveness:
    """Every blob's uses across the schedule, and its next need after any step."""

    def __init__(self, net: Net, steps: list[Step]):
        self.steps, self.n = steps, len(steps)
        self.uses: dict[str, list[int]] = {}
        self.kinds: dict[str, list[str]] = {}
        for step in steps:
            for kind, names in (("read", step.reads), ("update", step.updates),
                                ("write", step.writes), ("work", step.workspace)):
                for name in names:
                    self.uses.setdefault(name, []).append(step.index)
                    self.kinds.setdefault(name, []).append(kind)
        for name in self.uses:  # a blob listed twice in one step: keep its first (strongest) use
            pairs = sorted(dict(reversed(list(zip(self.uses[name], self.kinds[name])))).items())
            self.uses[name], self.kinds[name] = [p[0] for p in pairs], [p[1] for p in pairs]
        self.blobs = {name: net.blobs[name] for name in self.uses}
        self.persistent = {n for n, info in self.blobs.items() if info.role in PERSISTENT_ROLES}
        losses = [ly for ly in net.layers if ly.is_loss]
        self.outputs = [ly.top[0] for ly in net.layers if (ly.is_loss or ly.type == "Accuracy")
                        and ly.top[0] in self.uses]
        seeds = [f"{ly.top[0]}.grad" for ly in losses if f"{ly.top[0]}.grad" in self.uses]
        self.host_inputs = [n for n in net.inputs if n in self.uses] + seeds

    def kind_at(self, name: str, index: int) -> str:
        i = bisect.bisect_left(self.uses[name], index)
        return self.kinds[name][i]

    def need_after(self, name: str, index: int) -> float:
        """The step after ``index`` that next needs ``name``'s data: ``n`` for the host reading an
        output, ``n + first use`` for state read again next iteration; INFINITY if none (dead)."""
        uses = self.uses[name]
        i = bisect.bisect_right(uses, index)
        if i < len(uses):
            return uses[i] if self.kinds[name][i] in ("read", "update") else INFINITY
        if name in self.persistent:
            return self.n + uses[0]
        return self.n if name in self.outputs else INFINITY

    def loads(self, index: int) -> list[str]:
        step = self.steps[index]
        return list(dict.fromkeys(step.reads + step.updates))
