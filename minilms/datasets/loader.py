"""The batch loader: one epoch of ``(images, labels)`` batches, made by a background thread.

While the model trains on one batch, a thread gathers (decodes, draws) and augments the next
``prefetch`` ones; numpy and Pillow release the GIL for most of that work, so the two overlap.

Order is a pure function of (seed, epoch), as in PyTorch's DistributedSampler: every rank computes
the same permutation, pads it by wrapping around to a multiple of ``world_size`` (so every rank runs
the same number of steps, which collective communication needs), and takes every
``world_size``-th index starting at ``rank``. Call ``set_epoch`` before each epoch for a new order.
Batch ``k`` of every rank together are then the samples of batch ``k`` of one process with batch
``world_size * batch_size``. ``pad=False`` (evaluation, where no rank waits for another) leaves
the shards unpadded, so every sample is counted once: shards may then differ in length by one.
Each batch's augmentation draws from its own generator, seeded by (seed, epoch, rank, batch), so
results do not depend on thread timing.

An exception in the thread is re-raised, as itself, where the batch was awaited. Leaving the loop
early (``break``, an exception in the training step) stops and joins the thread.
"""
from __future__ import annotations

import queue
import threading
from typing import Callable, Iterator

import numpy as np

from ..errors import ConfigError
from .base import Dataset

Batch = tuple[np.ndarray, np.ndarray]
Transform = Callable[[np.ndarray, np.random.Generator], np.ndarray]

# Tags that keep the shuffle's and the augmentation's seed sequences apart.
_SHUFFLE, _AUGMENT = 0, 1
_POLL_SECONDS = 0.05  # how often a blocked thread looks at the stop flag or at its partner


class _Failure:
    def __init__(self, error: BaseException):
        self.error = error


_END = object()


class BatchLoader:
    """Iterating gives this rank's batches of one epoch; ``len`` is how many. The last batch may be
    smaller, unless ``drop_last``. ``prefetch=0`` makes batches in the caller's thread."""

    def __init__(self, dataset: Dataset, batch_size: int, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, transform: Transform | None = None, prefetch: int = 2,
                 rank: int = 0, world_size: int = 1, pad: bool = True):
        for key, value, low in (("data.batch_size", batch_size, 1), ("data.prefetch", prefetch, 0),
                                ("world_size", world_size, 1), ("seed", seed, 0)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise ConfigError(key, f"an integer >= {low}", value)
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) \
                or not 0 <= rank < world_size:
            raise ConfigError("rank", f"an integer in 0..{world_size - 1}", rank)
        self.dataset, self.batch_size, self.shuffle, self.seed = dataset, batch_size, shuffle, seed
        self.drop_last, self.transform, self.prefetch = drop_last, transform, prefetch
        self.rank, self.world_size, self.pad = rank, world_size, pad
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s order (and augmentation) for the next iteration."""
        if int(epoch) < 0:
            raise ValueError(f"epoch must be >= 0, not {epoch}")
        self.epoch = int(epoch)

    @property
    def shard_size(self) -> int:
        """Samples per rank per epoch: ceil(len(dataset) / world_size) (unpadded: this rank's
        share of the dataset)."""
        if not self.pad:
            return len(range(self.rank, len(self.dataset), self.world_size))
        return -(-len(self.dataset) // self.world_size)

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        if self.drop_last:
            return self.shard_size // self.batch_size
        return -(-self.shard_size // self.batch_size)

    def indices(self, epoch: int | None = None) -> np.ndarray:
        """This rank's sample indices for ``epoch`` (default: the current one), in order."""
        epoch = self.epoch if epoch is None else epoch
        count = len(self.dataset)
        if self.shuffle:
            order = np.random.default_rng([self.seed, epoch, _SHUFFLE]).permutation(count)
        else:
            order = np.arange(count)
        padding = self.shard_size * self.world_size - count if self.pad else 0
        if padding:
            order = np.concatenate([order, np.resize(order, padding)])
        return order[self.rank::self.world_size]

    def batches(self) -> list[np.ndarray]:
        """This rank's batches of indices for the current epoch."""
        indices = self.indices()
        return [indices[i:i + self.batch_size] for i in range(0, len(self) * self.batch_size,
                                                              self.batch_size)]

    def make_batch(self, number: int, indices: np.ndarray, epoch: int | None = None) -> Batch:
        """Batch ``number`` of an epoch: its images (transformed) and labels."""
        epoch = self.epoch if epoch is None else epoch
        images, labels = self.dataset.get(indices)
        if self.transform is not None:
            rng = np.random.default_rng([self.seed, epoch, _AUGMENT, self.rank, number])
            images = self.transform(images, rng)
        return images, labels

    def __iter__(self) -> Iterator[Batch]:
        plan, epoch = self.batches(), self.epoch  # fixed now: set_epoch mid-epoch changes nothing
        if self.prefetch == 0:  # no thread: simplest to debug and to profile
            return (self.make_batch(n, indices, epoch) for n, indices in enumerate(plan))
        return self._in_background(plan, epoch)

    def _in_background(self, plan: list[np.ndarray], epoch: int) -> Iterator[Batch]:
        ready: queue.Queue = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()

        def hand_over(item) -> bool:
            while not stop.is_set():
                try:
                    ready.put(item, timeout=_POLL_SECONDS)
                    return True
                except queue.Full:
                    pass
            return False

        def work() -> None:
            try:
                for number, indices in enumerate(plan):
                    if not hand_over(self.make_batch(number, indices, epoch)):
                        return
                hand_over(_END)
            except BaseException as error:  # everything goes to the consumer, nothing is lost
                hand_over(_Failure(error))

        worker = threading.Thread(target=work, name=f"minilms-loader-{self.dataset.name}",
                                  daemon=True)
        worker.start()
        try:
            while True:
                try:
                    item = ready.get(timeout=_POLL_SECONDS)
                except queue.Empty:
                    if not worker.is_alive() and ready.empty():
                        raise RuntimeError("the batch loader's thread ended without a result")
                    continue
                if item is _END:
                    return
                if isinstance(item, _Failure):
                    raise item.error
                yield item
        finally:
            stop.set()
            worker.join()

    def __repr__(self) -> str:
        return (f"BatchLoader({self.dataset!r}, batch_size={self.batch_size}, "
                f"shuffle={self.shuffle}, epoch={self.epoch}, rank={self.rank}/{self.world_size})")
