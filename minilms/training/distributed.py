"""Data-parallel training over MPI: ``mpiexec -n N python -m minilms.train config.yaml``.

Each of the N processes (ranks) has its own device and pool, trains on its own shard of every
epoch (``BatchLoader(rank=, world_size=)``) and averages parameter gradients with the others
before every update, so all ranks hold the same weights. With per-rank batch ``B`` and gradients
``g_r`` (each a mean over the rank's ``B`` samples), the update uses

    g = (g_0 + ... + g_{N-1}) / N

which is the gradient of the mean loss over the combined batch of ``N * B`` samples: N ranks
take the steps one process would take with batch ``N * B``, to float rounding (BatchNorm aside:
its batch statistics are per rank).

MPI is the transport (mpi4py and an MPI library, the ``mpi`` extra), imported only when a
launcher says there is more than one process, so single-process runs never need it.

The averaging happens on the host copies, where every blob lives anyway. The plan sends each
parameter gradient home right after its backward step (``Policy(reduce_grads=True)``) and loads
it back before its update; the updates come after the last backward step. ``GradientReducer``
starts an ``Iallreduce`` (in place, SUM, then a scale by ``1/N``) as soon as a gradient's copy
home has landed, on a thread of its own, while earlier layers' backward steps compute.

A rank that dies or hangs must not leave the others waiting forever: every collective here is
nonblocking and polled against a deadline (``distributed.timeout`` seconds from when this rank
entered it). Past the deadline the rank prints one line (``error: rank R: <collective> in
iteration I did not complete within T s ...``) and calls ``MPI_Abort``, which ends every process of
the job with exit code ``EXIT_PEER_LOST``. A rank killed outright is usually noticed sooner: the
launcher (MPICH's hydra) ends the job when a process dies, unless told not to.
"""
import hashlib
import os
import queue
import sys
import threading
import time

import numpy as np

from ..errors import DistributedError

EXIT_PEER_LOST = 3
# Environment variables by which launchers tell a process how many ranks it has: MPICH (hydra)
# and Intel MPI, Open MPI, MVAPICH.
LAUNCHER_SIZE = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
_POLL_SECONDS = 0.0005     # the longest sleep between tests of a pending collective
_LAST_WORDS_SECONDS = 0.5
_active = None             # the World of this process, once it has more than one rank
_failing = threading.Lock()   # held by the one thread that reports a failure and aborts


def launched_size(environ=os.environ) -> int:
    """How many processes the launcher started (1 when not launched by mpiexec)."""
    for key in LAUNCHER_SIZE:
        try:
            return max(1, int(environ[key]))
        except (KeyError, ValueError):
            continue
    return 1


class World:
    """This process's place in the run: ``rank`` of ``size``, ``local_rank`` of ``local_size`` on
    its node. ``World()`` is one process alone: every collective is then the identity."""

    def __init__(self, comm=None, timeout: float = 300.0):
        self.comm, self.timeout = comm, float(timeout)
        self.rank, self.size = (comm.Get_rank(), comm.Get_size()) if comm else (0, 1)
        self.local_rank, self.local_size, self.local = 0, 1, None
        self.iteration = 0          # named in timeout messages
        if comm is not None:
            from mpi4py import MPI
            self.local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
            self.local_rank, self.local_size = self.local.Get_rank(), self.local.Get_size()

    @classmethod
    def detect(cls, timeout: float = 300.0) -> "World":
        """The world the launcher made: one process unless started by mpiexec with ``-n`` > 1."""
        global _active
        size = launched_size()
        if size <= 1:
            return cls(timeout=timeout)
        try:
            from mpi4py import MPI
        except ImportError:
            raise DistributedError(f"launched by mpiexec with {size} processes, but mpi4py is not "
                                   "installed: pip install 'minilms[mpi]' (mpi4py and mpich)") \
                from None
        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:   # the reducer's thread calls MPI too
            raise DistributedError("the MPI library does not provide MPI_THREAD_MULTIPLE, which "
                                   "minilms' gradient thread needs")
        world = cls(MPI.COMM_WORLD, timeout)
        if world.size > 1:
            _active = world
        return world

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def describe(self) -> str:
        return f"rank {self.rank} of {self.size} (local {self.local_rank} of {self.local_size})"

    # -- ending the job ----------------------------------------------------------------------------
    def fail(self, message: str, code: int = EXIT_PEER_LOST) -> None:
        """Say ``message`` as this rank's one line on stderr and end every process of the job.
        Once: a second caller (another thread past its deadline) waits for the end."""
        if not _failing.acquire(blocking=False):
            time.sleep(3600)
        sys.stderr.write(f"error: rank {self.rank}: {message}\n")
        _abort(self.comm, code)

    def wait(self, request, what: str) -> None:
        """Wait for a nonblocking collective; past ``timeout`` seconds, fail naming it."""
        deadline = time.monotonic() + self.timeout
        nap = 1e-5
        while not request.Test():
            if time.monotonic() > deadline:
                self.fail(self.timeout_message(what))
            time.sleep(nap)          # short naps at first: most collectives finish in microseconds
            nap = min(2 * nap, _POLL_SECONDS)

    def timeout_message(self, what: str) -> str:
        return (f"{what} in iteration {self.iteration} did not complete within {self.timeout:g} s "
                f"(distributed.timeout): another rank died or hangs; ending all {self.size} ranks")

    # -- collectives (each the identity in one process) --------------------------------------------
    def broadcast(self, arrays: dict, what: str) -> None:
        """Overwrite each array (in name order) with rank 0's, in place."""
        if not self.distributed:
            return
        for name in sorted(arrays):
            self.wait(self.comm.Ibcast(arrays[name], root=0), f"broadcast of {name} ({what})")

    def sum(self, values, what: str, local: bool = False, op: str = "sum") -> np.ndarray:
        """Elementwise sum (or ``op`` "min") of ``values`` over all ranks (``local``: over this
        node's)."""
        values = np.array(values, dtype=np.float64 if op == "sum" else np.int64)
        if not self.distributed:
            return values
        from mpi4py import MPI
        comm = self.local if local else self.comm
        self.wait(comm.Iallreduce(MPI.IN_PLACE, values, op=MPI.SUM if op == "sum" else MPI.MIN),
                  what)
        return values

    def start_sum(self, array: np.ndarray):
        """Start summing ``array`` over all ranks in place; the request to test."""
        from mpi4py import MPI
        return self.comm.Iallreduce(MPI.IN_PLACE, array, op=MPI.SUM)

    def barrier(self, what: str) -> None:
        if self.distributed:
            self.wait(self.comm.Ibarrier(), what)

    def share(self, text: str, what: str) -> str:
        """Rank 0's ``text``, on every rank."""
        if not self.distributed:
            return text
        data = np.frombuffer(text.encode(), np.uint8)
        length = np.array([len(data)], np.int64)
        self.wait(self.comm.Ibcast(length, root=0), f"broadcast of {what}")
        data = data.copy() if self.rank == 0 else np.zeros(int(length[0]), np.uint8)
        self.wait(self.comm.Ibcast(data, root=0), f"broadcast of {what}")
        return data.tobytes().decode()

    def agree(self, text: str, what: str) -> None:
        """Every rank must say the same ``text`` (a config, a model's blobs) as rank 0; a rank that
        does not ends the job, naming ``what``."""
        if not self.distributed:
            return
        mine = np.frombuffer(hashlib.sha256(text.encode()).digest(), np.uint8)
        theirs = mine.copy()
        self.wait(self.comm.Ibcast(theirs, root=0), f"comparing {what}")
        if not np.array_equal(mine, theirs):
            self.fail(f"{what} differs from rank 0's: every rank must be started with the same "
                      "config and overrides", code=2)


# -- device.memory: auto, shared ----------------------------------------------------------------
def device_of(local_rank: int, gpus: int) -> int:
    """The GPU of a local rank: ranks go round the node's GPUs."""
    return local_rank % max(1, gpus)


def sharers(local_rank: int, local_size: int, gpus: int) -> int:
    """How many of the node's ranks share this rank's GPU (all of them on the ``cpu`` device,
    ``gpus`` 0 or 1: the host's memory is one)."""
    gpus = max(1, gpus)
    mine = device_of(local_rank, gpus)
    return sum(1 for r in range(local_size) if r % gpus == mine)


def memory_share(free: int, fraction: float, sharing: int) -> int:
    """``device.memory: auto`` for one of ``sharing`` processes on one device: ``fraction`` of
    the free bytes, divided evenly, so N processes fit beside each other with a hard cap each."""
    return int(free * fraction) // max(1, sharing)


# -- the gradients --------------------------------------------------------------------------------
class GradientReducer:
    """Averages parameter gradients over the world's ranks, on their host copies, in place.

    The executor (``LmsExecutor``) calls ``submit(name, host, copied)`` at a plan's ``reduce``
    action (``copied``: an event behind the gradient's copy home), ``poll()`` before each step,
    and ``finish(name)`` before loading a gradient back. ``poll`` hands each gradient whose copy
    has landed to a thread that starts its ``Iallreduce`` and tests it until done, then scales it
    by ``1/size``. Gradients are handed over in plan order, which is the same on every rank, so
    the ranks start the same collectives in the same order, as MPI requires. ``overlap=False``
    holds them all until the first ``finish`` (for comparison: no overlap with backward).
    ``wait_seconds``: how long the last iteration's updates waited for averages.
    """

    def __init__(self, world: World, overlap: bool = True):
        self.world, self.overlap = world, overlap
        self.scale = np.float32(1.0 / world.size)
        self.copying: list = []           # (name, host, copied, done) in plan order
        self.done: dict = {}              # name -> threading.Event, until finished
        self.ready: queue.Queue = queue.Queue()
        self.wait_seconds = 0.0
        self.thread = threading.Thread(target=self._serve, name="minilms-allreduce", daemon=True)
        self.thread.start()

    def begin_iteration(self, iteration: int) -> None:
        self.world.iteration = iteration
        self.wait_seconds = 0.0

    def submit(self, name: str, host: np.ndarray, copied) -> None:
        done = self.done[name] = threading.Event()
        self.copying.append((name, host, copied, done))
        self.poll()

    def poll(self) -> None:
        """Hand over, in order, the gradients whose copies home have landed."""
        while self.overlap and self.copying and self.copying[0][2].query():
            self._hand_over()

    def _hand_over(self) -> None:
        name, host, copied, done = self.copying.pop(0)
        copied.synchronize()
        self.ready.put((name, host, done, self.world.iteration))

    def finish(self, name: str) -> None:
        """Return once ``name``'s average is in its host copy (at once if none is pending)."""
        done = self.done.pop(name, None)
        if done is None:
            return
        started = time.perf_counter()
        while any(item[0] == name for item in self.copying) or (not self.overlap and self.copying):
            self._hand_over()
        # The thread ends the job itself past the deadline; this one only guards against a
        # thread that died.
        if not done.wait(self.world.timeout + 10.0):
            self.world.fail(self.world.timeout_message(f"allreduce of {name}") +
                            " (the reducer thread stopped)")
        self.wait_seconds += time.perf_counter() - started

    def close(self) -> None:
        self.ready.put(None)

    def _serve(self) -> None:
        try:
            self._loop()
        except Exception as error:     # an MPI error: the job cannot go on, say why at once
            self.world.fail(f"the gradient average failed in iteration {self.world.iteration}: "
                            f"{' '.join(str(error).split())}")

    def _loop(self) -> None:
        world = self.world
        pending: list = []              # (name, host, done, iteration, request, deadline)
        nap = 1e-5
        while True:
            try:       # idle: block until there is work; busy: take what is there
                job = self.ready.get_nowait() if pending else self.ready.get()
            except queue.Empty:
                job = False
            if job is None:
                return
            if job:
                name, host, done, iteration = job
                request = world.start_sum(host)
                pending.append((name, host, done, iteration, request,
                                time.monotonic() + world.timeout))
                nap = 1e-5
                continue                     # start every ready one before testing any
            still = []
            for item in pending:
                name, host, done, iteration, request, deadline = item
                if request.Test():
                    np.multiply(host, self.scale, out=host)
                    done.set()
                elif time.monotonic() > deadline:
                    world.iteration = iteration
                    world.fail(world.timeout_message(f"allreduce of {name}"))
                else:
                    still.append(item)
            if still and len(still) == len(pending):
                time.sleep(nap)
                nap = min(2 * nap, _POLL_SECONDS)
            pending = still


def abort_if_distributed(code: int, traceback: bool = False) -> None:
    """After an error has been reported (``traceback``: report it now): end the other ranks too,
    so none waits for this one. Nothing in one process."""
    if _active is not None:
        if traceback:
            import traceback as tb
            tb.print_exc()
        _abort(_active.comm, code)


def _abort(comm, code: int) -> None:
    sys.stderr.flush()
    # The launcher forwards a rank's output through a proxy, and tears the job down on Abort,
    # output in flight or not: give the proxy a moment to pass the last words on.
    time.sleep(_LAST_WORDS_SECONDS)
    comm.Abort(code)


def rank_suffix(world: World) -> str:
    """``""`` for rank 0, ``".rank3"`` for rank 3: names of files every rank writes."""
    return "" if world.rank == 0 else f".rank{world.rank}"
