"""A blob: a named n-d array whose home is the host, with an optional slot in the device pool.

The state machine is Caffe's SyncedMemory, with the head of the data in one of four states:

    UNINITIALIZED  no valid data anywhere (reads see zeros, as in Caffe)
    HOST           the host copy is the truth; the device slot, if any, is stale
    DEVICE         the device copy is the truth (dirty); the host copy is stale
    SYNCED         both copies hold the same data

Reads sync (copy the truth to where it is read); writes move the head there. ``release`` gives the
slot back to the pool: a dirty blob that is still needed is copied home first (swap-out); any other
blob is dropped without a copy. Data that is still needed is never lost.

The host copy (the *home*) is allocated on first need, not with the blob: a blob that lives its
whole life in the pool (workspace; with LMS off, nearly everything) never has one. Whoever must not
allocate mid-iteration gives homes up front with ``ensure_home`` (the LMS executor does, for the
blobs its plan says need one: ``minilms.lms.host``), page-locked for those that cross the link every
iteration (``page_locked``), or shares them out of one arena (``share_home``). ``has_home`` says
whether one exists; ``host`` is the raw host copy, and gives a blob without one a home that is never
garbage.
"""
from enum import Enum

import numpy as np

from . import events
from .device import Device
from .device.pool import Slot

ROLES = ("param", "param_grad", "activation", "activation_grad", "optimizer_state",
         "workspace", "input")


class State(Enum):
    UNINITIALIZED = "uninitialized"
    HOST = "host"
    DEVICE = "device"
    SYNCED = "synced"


class Blob:
    """``Blob(device, name, shape, dtype, role)``: host copy and device slot on demand."""

    def __init__(self, device: Device, name: str, shape, dtype=np.float32, role="activation"):
        if role not in ROLES:
            raise ValueError(f"blob {name}: role must be one of {', '.join(ROLES)}, found {role!r}")
        self.device, self.name, self.role = device, name, role
        self.shape = tuple(int(n) for n in shape)
        self.dtype = np.dtype(dtype)
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        self._host: np.ndarray | None = None
        self.page_locked = False   # whether the home is page-locked (pinned) memory
        self.state = State.UNINITIALIZED
        self.slot: Slot | None = None
        self._device_view = None
        self._views: dict = {}     # offset -> device view: a plan places a blob at few offsets

    # -- the home -------------------------------------------------------------------------------
    @property
    def has_home(self) -> bool:
        """Whether the host copy has been allocated."""
        return self._host is not None

    def ensure_home(self, page_locked: bool = False) -> np.ndarray:
        """Allocate the host copy if there is none (``device.alloc_host``), and return it;
        ``page_locked`` asks for pinned memory (a pageable home is moved into a new pinned one,
        its contents kept). The state is unchanged: a fresh home holds nothing valid, and no
        state says it does (the head is never ``host`` or ``synced`` without one)."""
        if self._host is None or (page_locked and not self.page_locked):
            home = self.device.alloc_host(self.shape, self.dtype, page_locked)
            if self._host is not None:
                home[...] = self._host
            self._host, self.page_locked = home, page_locked
        return self._host

    def share_home(self, rows: np.ndarray, page_locked: bool = False) -> None:
        """Make ``rows`` (rows of another blob's home: a chunk's samples; or a piece of an arena
        of homes) this blob's home; ``page_locked`` says whether that memory is pinned."""
        if rows.shape != self.shape or rows.dtype != self.dtype:
            raise ValueError(f"blob {self.name}: a home of {rows.shape} {rows.dtype} for a blob "
                             f"of {self.shape} {self.dtype}")
        self._host, self.page_locked = rows, page_locked

    def move_home(self, home: np.ndarray, page_locked: bool = False) -> None:
        """Make ``home`` (another buffer of this blob's shape and dtype: the next of a ring of
        homes) the host copy. Its bytes are not this blob's data, so a head on the host becomes
        ``uninitialized`` and a synced one ``device`` (the device copy stays the truth)."""
        if home is self._host:
            return
        self.share_home(home, page_locked)
        if self.state is State.HOST:
            self._set_state(State.UNINITIALIZED)
        elif self.state is State.SYNCED:
            self._set_state(State.DEVICE)

    @property
    def host(self) -> np.ndarray:
        """The host copy itself: no sync, so stale while the head is on the device. A blob
        without one gets one now, never garbage: the device's data if the head is there (copied
        home, state ``synced``), else zeros (``uninitialized``: what a read would see)."""
        if self._host is None:
            home = self.ensure_home()
            if self.state is State.DEVICE:
                self._copy_home(None)
                self._set_state(State.SYNCED)
            else:
                home.fill(0)
        return self._host

    # -- placement -------------------------------------------------------------------------------
    @property
    def placed(self) -> bool:
        return self.slot is not None

    def place(self, at: int | None = None) -> Slot:
        """Take a slot in the pool (at offset ``at`` when the plan says where)."""
        if self.slot is not None:
            raise RuntimeError(f"blob {self.name} is already placed at {self.slot.offset}")
        self.slot = self.device.pool.allocate(self.nbytes, self.name, at=at)
        view = self._views.get(self.slot.offset)
        if view is None:
            view = self._views[self.slot.offset] = self.device.view(self.slot, self.shape,
                                                                    self.dtype)
        self._device_view = view
        return self.slot

    def release(self, needed_later: bool = True, stream=None) -> str:
        """Give the slot back. Returns what it took: ``"swap_out"``, ``"drop"`` or ``"free"``.

        A dirty blob (head on the device) that is ``needed_later`` is copied home first; with
        ``stream`` that copy is only enqueued, and the caller must order any reuse of the space
        after it (an event on ``stream``).
        """
        if self.slot is None:
            raise RuntimeError(f"blob {self.name} is not placed on the device")
        action = "free"
        if self.state is State.DEVICE:
            if needed_later:
                self._copy_home(stream)
                action = "swap_out"
                self._set_state(State.HOST)
            else:
                action = "drop"
                self._set_state(State.UNINITIALIZED)
        elif self.state is State.SYNCED:
            action = "drop"
            self._set_state(State.HOST)
        if events.listening and action == "drop":
            events.emit("drop", self.name, self.nbytes, role=self.role)
        self.device.pool.free(self.slot)
        self.slot, self._device_view = None, None
        return action

    # -- access ----------------------------------------------------------------------------------
    def host_data(self) -> np.ndarray:
        """The data on the host, for reading (a read-only view)."""
        self._to_host()
        view = self._host.view()
        view.flags.writeable = False
        return view

    def mutable_host_data(self, overwrite: bool = False) -> np.ndarray:
        """The host copy, for writing: the head moves to the host. ``overwrite=True`` promises
        every element is written, so a dirty device copy is not brought home first."""
        if not overwrite:
            self._to_host()
        self._set_state(State.HOST)
        return self.ensure_home()

    def device_data(self, stream=None):
        """The device copy, for reading by a kernel: places the blob if it has no slot."""
        self._to_device(stream)
        return self._device_view

    def mutable_device_data(self, stream=None, overwrite: bool = False):
        """The device copy, for writing: the head moves to the device.

        ``overwrite=True`` promises the caller writes every element before reading any, so the
        old contents are not brought in (no H2D, no zero fill): what a layer's output needs.
        """
        if overwrite:
            if self.slot is None:
                self.place()
        else:
            self._to_device(stream)
        self._set_state(State.DEVICE)
        return self._device_view

    def resident_view(self, read: bool, write: bool):
        """The device copy as the plan left it: no placement, no copy (a planned executor's
        access). ``read`` requires valid device data; ``write`` moves the head to the device.
        A blob not placed, or read while its device copy is stale, is a plan bug: raised."""
        if self.slot is None or (read and self.state not in (State.DEVICE, State.SYNCED)):
            where = "not placed" if self.slot is None else f"{self.state.value}, not on the device"
            raise RuntimeError(f"plan mismatch: blob {self.name} is {where} when its step "
                               f"{'reads' if read else 'writes'} it")
        if write:
            self._set_state(State.DEVICE)
        return self._device_view

    def sync_home(self, stream=None) -> bool:
        """Copy a dirty device copy home and keep the slot (state ``synced``); False if clean."""
        if self.state is not State.DEVICE:
            return False
        self._copy_home(stream)
        self._set_state(State.SYNCED)
        return True

    # -- the transitions -------------------------------------------------------------------------
    def _to_host(self) -> None:
        if self.state is State.UNINITIALIZED:
            self.ensure_home().fill(0)
            self._set_state(State.HOST)
        elif self.state is State.DEVICE:
            self._copy_home(None)
            self._set_state(State.SYNCED)

    def _to_device(self, stream) -> None:
        if self.slot is None:
            self.place()
        if self.state is State.UNINITIALIZED:
            self.device.zero(self._device_view, stream)
            self._set_state(State.DEVICE)
        elif self.state is State.HOST:
            if events.listening:
                events.emit("h2d", self.name, self.nbytes, role=self.role,
                            stream=self.device.stream_name(stream))
            self.device.h2d(self._device_view, self._host, stream, self.name)
            self._set_state(State.SYNCED)

    def _copy_home(self, stream) -> None:
        if events.listening:
            events.emit("d2h", self.name, self.nbytes, role=self.role,
                        stream=self.device.stream_name(stream))
        self.device.d2h(self.ensure_home(), self._device_view, stream, self.name)

    def _set_state(self, state: State) -> None:
        if state is not self.state and events.listening:
            events.emit("state", self.name, self.nbytes, before=self.state.value,
                        after=state.value)
        self.state = state

    def __repr__(self) -> str:
        where = f"@{self.slot.offset}" if self.slot else "unplaced"
        where += "" if self._host is not None else ", no home"
        return (f"<Blob {self.name} {self.role} {self.shape} {self.dtype} {self.state.value} "
                f"{where}>")

