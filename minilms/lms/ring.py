"""What the host writes and reads every iteration, in two sets of homes, so the host runs ahead.

The host writes an iteration's inputs (and the loss gradient seeds) into their homes before it
issues the iteration, and reads its outputs (loss, accuracy) out of theirs once the device has
copied them home. With one set of homes the host must wait for the device to finish iteration
``i`` before it writes iteration ``i + 1``'s inputs (a load may still be reading them) and before
``i + 1``'s copies home overwrite ``i``'s outputs: on a GPU the host waits for the device at the
end of every iteration, and the device idles while the host issues the next one.

``HomeRing`` keeps ``SLOTS`` sets of those homes and hands them out in turn (``take``), so the host
writes and issues iteration ``i + 1`` while iteration ``i`` runs. It waits only when it comes back
to a slot, two iterations later: for the loads that read the slot's inputs (``Slot.loaded``) and for
the outputs it holds (``Pending``; their values are read out then, and kept). An iteration submitted
returns a ``Pending``: ``result()`` waits for its own outputs' copies home, nothing else.
"""
from .host import RING_SLOTS as SLOTS
from .host import HomeArena


class Pending:
    """An iteration that was issued (``Executor.submit``): its outputs, once the device has copied
    them home. ``done()`` asks without waiting; ``result()`` waits for the event recorded after
    those copies and returns ``{output name: value}`` (read once, then kept)."""

    def __init__(self, iteration: int, homes: dict | None = None, copied=None,
                 values: dict | None = None):
        self.iteration = iteration      # the executor's iteration count once this was issued
        self._homes, self._copied, self._values = homes, copied, values

    def done(self) -> bool:
        return self._values is not None or self._copied.query()

    def result(self) -> dict:
        if self._values is None:
            self._copied.synchronize()
            self._values = {name: float(home[0]) for name, home in self._homes.items()}
            self._homes = self._copied = None   # the slot's homes may now be written again
        return self._values


class Slot:
    """One set of homes: ``homes`` by blob name, the event after the loads that read them
    (``loaded``), and the iteration whose outputs they hold (``pending``)."""

    def __init__(self, device):
        self.arena = HomeArena(device)
        self.homes: dict = {}
        self.loaded = None
        self.pending: Pending | None = None

    def settle(self) -> None:
        """Wait until the host may write this slot again: its inputs read, its outputs read out."""
        if self.loaded is not None:
            self.loaded.synchronize()
            self.loaded = None
        if self.pending is not None:
            self.pending.result()
            self.pending = None


class HomeRing:
    """``SLOTS`` sets of page-locked homes for the blobs the host writes or reads every
    iteration, carved for the program that runs (``share``) and handed out in turn (``take``)."""

    def __init__(self, device):
        self.slots = [Slot(device) for _ in range(SLOTS)]
        self.turn = 0
        self.sharing = None

    def share(self, owner, blobs: list) -> None:
        """Carve homes for ``blobs`` (``owner``'s inputs, seeds and outputs) in every slot. The
        slots' earlier outputs are read out first: their bytes are about to be reused."""
        if owner is self.sharing:
            return
        for slot in self.slots:
            slot.settle()
            slot.homes = dict(zip([b.name for b in blobs], slot.arena.carve(owner, blobs)))
        self.sharing = owner

    def take(self) -> Slot:
        """The next slot, once the host may write it (``Slot.settle``)."""
        slot = self.slots[self.turn]
        self.turn = (self.turn + 1) % SLOTS
        slot.settle()
        return slot

    def settle(self) -> None:
        """Read out every slot's outputs (before the device's work is dropped or reordered)."""
        for slot in self.slots:
            slot.settle()

    @property
    def nbytes(self) -> int:
        return sum(slot.arena.nbytes for slot in self.slots)
