"""Liveness: every blob's uses across a schedule, and its next *need* after any step.

A blob's need is its next read or update before any overwrite: a blob whose next use writes it
whole is dead until then. Blobs that outlive the iteration (parameters, optimizer state) are
needed again in the next one; the net's outputs (loss, accuracy) are read by the host after the
last step; its inputs (and the loss gradient seed) arrive fresh on the host each iteration. The
planner (``minilms.plan``) decides everything from these answers.

Everything here depends on the schedule alone, not on the pool or the knobs, so it is computed
once and shared by every plan of the same schedule (``least_pool`` and ``policy: auto`` make
dozens): each blob's size, its need after each of its uses (a table, so a query is one bisection
and no scan), and each step's blobs in the orders the planner walks them.
"""
import bisect
import operator
import weakref

from ..net import Net, Step

PERSISTENT_ROLES = ("param", "optimizer_state")
INFINITY = float("inf")


class Liveness:
    """Every blob's uses across the schedule, and its next need after any step."""

    @classmethod
    def of(cls, net: Net, steps: list[Step]) -> "Liveness":
        """The liveness of ``steps`` on ``net``, made once while the net lives and the schedule
        is the same steps: the plan command asks for the least pool, the plan and the plan
        without prefetch of one schedule, and each needs it (a tenth of a second for a net of a
        thousand layers)."""
        made = _MADE.get(net)
        if made is not None and len(made[0]) == len(steps) and \
                all(map(operator.is_, made[0], steps)):
            return made[1]
        live = cls(net, steps)
        _MADE[net] = (tuple(steps), live)
        return live

    def __init__(self, net: Net, steps: list[Step]):
        self.steps, self.n = steps, len(steps)
        self.uses: dict[str, list[int]] = {}
        self.kinds: dict[str, list[str]] = {}
        in_order = all(a.index < b.index for a, b in zip(steps, steps[1:]))
        for step in steps:
            index = step.index
            for kind, names in (("read", step.reads), ("update", step.updates),
                                ("write", step.writes), ("work", step.workspace)):
                for name in names:
                    uses = self.uses.get(name)
                    if uses is None:
                        self.uses[name], self.kinds[name] = [index], [kind]
                    elif uses[-1] != index or not in_order:  # listed twice in one step: its
                        uses.append(index)                   # first (strongest) use counts
                        self.kinds[name].append(kind)
        if not in_order:
            for name in self.uses:
                pairs = sorted(dict(reversed(list(zip(self.uses[name], self.kinds[name])))
                                    ).items())
                self.uses[name], self.kinds[name] = [p[0] for p in pairs], [p[1] for p in pairs]
        # a blob and the chunks of it that split steps use (``minilms.lms.substeps``): name ->
        # (parent, mask of its samples), for every member of a family that is used
        self.family: dict[str, tuple] = {}
        self.members: dict[str, list] = {}
        self.chunks = {n: net.chunks[n] for n in self.uses if n in net.chunks}
        if self.chunks:
            self._families(net)
        self.blobs = {name: net.blobs[name] for name in self.uses}
        self.blobs.update((parent, net.blobs[parent]) for parent in self.members)
        self.nbytes = {name: info.nbytes for name, info in self.blobs.items()}
        self.persistent = {n for n, info in self.blobs.items() if info.role in PERSISTENT_ROLES}
        losses = [ly for ly in net.layers if ly.is_loss]
        self.outputs = [ly.top[0] for ly in net.layers if (ly.is_loss or ly.type == "Accuracy")
                        and ly.top[0] in self.uses]
        seeds = [f"{ly.top[0]}.grad" for ly in losses if f"{ly.top[0]}.grad" in self.uses]
        self.host_inputs = [n for n in net.inputs if n in self.uses or n in self.members] + seeds
        # needs[name][i]: the need once the schedule is past i of its uses (see need_after)
        outputs = set(self.outputs)
        self.needs: dict[str, list] = {}
        for name, uses in self.uses.items():
            if name in self.family:
                self.needs[name] = self._family_needs(name)
                continue
            table = [use if kind in ("read", "update") else INFINITY
                     for use, kind in zip(uses, self.kinds[name])]
            table.append(self.n + uses[0] if name in self.persistent else
                         self.n if name in outputs else INFINITY)
            self.needs[name] = table
        self.workspace = {n for n, info in self.blobs.items() if info.role == "workspace"}
        # the pinned blobs' placement per pool size and pinned set, made by the first plan that
        # needs it (``minilms.lms.planner``): every later one starts from a copy
        self.prologues: dict = {}
        # per step: its blobs as a set, the order demand places them in (largest first; equal
        # sizes in list order), which of them hold data to load, and its loads in list order
        self.working: list[frozenset] = []
        self.placing: list[list[str]] = []
        self.loaded: list[frozenset] = []
        self.load_lists: list[list[str]] = []
        self.made: list[tuple] = []     # what each step writes, updates or works in
        nbytes = self.nbytes
        for step in steps:
            names = list(dict.fromkeys(step.reads + step.updates + step.writes + step.workspace))
            self.working.append(frozenset(step.blobs))
            self.placing.append(sorted(names, key=lambda n: -nbytes[n]))
            self.loaded.append(frozenset(step.reads + step.updates))   # their first use
            self.load_lists.append(list(dict.fromkeys(step.reads + step.updates)))
            self.made.append(step.writes + step.updates + step.workspace)

    def _families(self, net: Net) -> None:
        """Group each used chunk with its parent and the parent's other used chunks; a parent
        no step names whole is still a member (its home holds the chunks' rows)."""
        for name, (parent, n0, n1) in self.chunks.items():
            self.family[name] = (parent, ((1 << n1) - 1) ^ ((1 << n0) - 1))
            self.members.setdefault(parent, [parent] if parent in self.uses else []).append(name)
        for parent in self.members:
            self.family[parent] = (parent, (1 << net.blobs[parent].shape[0]) - 1)
        self._own = {name: (list(self.uses[name]), list(self.kinds[name]))
                     for name in self.family if name in self.uses}
        self.overlapping = {name: [other for other in self.members[parent]
                                   if other != name and self.family[other][1] & mask]
                            for name, (parent, mask) in self.family.items() if name in self.uses}

    def _family_needs(self, name: str) -> list:
        """The need table of a blob with chunks, or of a chunk: a use of any blob that overlaps
        it is a use of it. It is needed by any read or update of an overlap, and by a partial
        overwrite (what the overwrite leaves may be read later: kept, conservatively); only an
        overwrite of all its samples (its own, or a bigger blob's) kills it. Its uses become
        the merged ones, so the planner's bisections see them."""
        mask = self.family[name][1]
        events: dict = {}     # step -> the strongest effect on ``name`` there
        for other in [name, *self.overlapping[name]]:
            covers = self.family[other][1] & mask == mask
            for use, kind in zip(*self._own[other]):
                effect = "read" if kind in ("read", "update") or not covers else "write"
                if events.get(use) != "read":
                    events[use] = effect
        uses = sorted(events)
        self.uses[name], self.kinds[name] = uses, [events[u] for u in uses]
        return [use if events[use] == "read" else INFINITY for use in uses] + [INFINITY]

    def kind_at(self, name: str, index: int) -> str:
        i = bisect.bisect_left(self.uses[name], index)
        return self.kinds[name][i]

    def need_after(self, name: str, index: int) -> float:
        """The step after ``index`` that next needs ``name``'s data: ``n`` for the host reading an
        output, ``n + first use`` for state read again next iteration; INFINITY if none (dead)."""
        return self.needs[name][bisect.bisect_right(self.uses[name], index)]

    def loads(self, index: int) -> list[str]:
        return list(self.load_lists[index])


_MADE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # net -> (steps, its Liveness)
