"""The batch loader: every sample once per epoch, order a function of (seed, epoch), disjoint
covering shards, errors that surface, and a thread that never outlives its iteration."""
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from minilms.datasets import BatchLoader, Dataset
from minilms.errors import ConfigError, DatasetError

from .helpers import assert_one_line, loader_threads


class IndexDataset(Dataset):
    """Image i is a 1x1x1 image holding i, so a batch tells which samples it holds."""

    def __init__(self, size: int, fail_at: int | None = None, delay: float = 0.0):
        super().__init__("index", "train", ["even", "odd"], (1, 1, 1), np.arange(size) % 2)
        self.fail_at, self.delay, self.gets = fail_at, delay, 0

    def _pixels(self, indices):
        self.gets += 1
        time.sleep(self.delay)
        if self.fail_at is not None and self.fail_at in indices:
            raise DatasetError(f"sample-{self.fail_at}.png", "an image", "garbage")
        return indices.astype(np.float32).reshape(-1, 1, 1, 1)


def seen(loader) -> list[int]:
    return [int(i) for images, _ in loader for i in images.reshape(-1)]


@pytest.mark.parametrize("prefetch", [0, 1, 3])
def test_every_sample_exactly_once_per_epoch(prefetch):
    loader = BatchLoader(IndexDataset(23), batch_size=5, prefetch=prefetch, seed=4)
    batches = list(loader)
    assert [len(labels) for _, labels in batches] == [5, 5, 5, 5, 3] and len(loader) == 5
    order = seen(loader)
    assert sorted(order) == list(range(23)) and order != list(range(23))
    for images, labels in batches:
        assert images.dtype == np.float32 and labels.dtype == np.int32
        np.testing.assert_array_equal(labels, images.reshape(-1).astype(int) % 2)


def test_drop_last_drops_the_short_batch():
    loader = BatchLoader(IndexDataset(23), batch_size=5, drop_last=True)
    assert len(loader) == 4 and [len(y) for _, y in loader] == [5, 5, 5, 5]


def test_order_is_a_function_of_seed_and_epoch():
    def order(seed, epoch, prefetch=2):
        loader = BatchLoader(IndexDataset(50), batch_size=8, seed=seed, prefetch=prefetch)
        loader.set_epoch(epoch)
        return seen(loader)
    assert order(1, 0) == order(1, 0, prefetch=0) == order(1, 0)
    assert order(1, 0) != order(1, 1)
    assert order(1, 0) != order(2, 0)
    loader = BatchLoader(IndexDataset(50), batch_size=8, seed=1)
    assert seen(loader) == seen(loader)  # without set_epoch, the same epoch again
    assert seen(BatchLoader(IndexDataset(50), batch_size=8, shuffle=False)) == list(range(50))


@given(size=st.integers(0, 120), world_size=st.integers(1, 8), seed=st.integers(0, 1000),
       epoch=st.integers(0, 50), shuffle=st.booleans())
def test_shards_are_equal_disjoint_and_cover_the_epoch(size, world_size, seed, epoch, shuffle):
    shards = []
    for rank in range(world_size):
        loader = BatchLoader(IndexDataset(size), batch_size=7, seed=seed, shuffle=shuffle,
                             rank=rank, world_size=world_size)
        shards.append(loader.indices(epoch).tolist())
    per_rank = -(-size // world_size)
    assert all(len(shard) == per_rank for shard in shards)  # same steps on every rank
    everything = [i for shard in shards for i in shard]
    assert set(everything) == set(range(size))
    # disjoint up to the wrap-around padding, which repeats as few samples as possible
    assert len(everything) - len(set(everything)) == per_rank * world_size - size
    if size % world_size == 0:
        assert len(set(everything)) == len(everything)


@given(batches=st.integers(1, 6), batch=st.integers(1, 5), world_size=st.integers(1, 4),
       seed=st.integers(0, 1000), epoch=st.integers(0, 9))
def test_batch_k_of_all_ranks_is_batch_k_of_one_process_with_their_sum(batches, batch,
                                                                         world_size, seed, epoch):
    """What data-parallel training relies on: N ranks with batch B see, at every step, exactly
    the samples one process sees with batch N * B (the ranks take every N-th of them)."""
    size = batches * batch * world_size
    one = BatchLoader(IndexDataset(size), batch_size=batch * world_size, seed=seed)
    one.set_epoch(epoch)
    ranks = [BatchLoader(IndexDataset(size), batch_size=batch, seed=seed, rank=rank,
                         world_size=world_size) for rank in range(world_size)]
    for loader in ranks:
        loader.set_epoch(epoch)
    for k, combined in enumerate(one.batches()):
        parts = [loader.batches()[k] for loader in ranks]
        assert [int(i) for i in combined] == [int(parts[j % world_size][j // world_size])
                                              for j in range(len(combined))]


@given(size=st.integers(0, 60), world_size=st.integers(1, 5), seed=st.integers(0, 100))
def test_unpadded_shards_count_every_sample_once(size, world_size, seed):
    shards = [BatchLoader(IndexDataset(size), batch_size=4, seed=seed, rank=rank,
                          world_size=world_size, pad=False).indices(0).tolist()
              for rank in range(world_size)]
    everything = [i for shard in shards for i in shard]
    assert sorted(everything) == list(range(size))
    for rank, shard in enumerate(shards):
        loader = BatchLoader(IndexDataset(size), batch_size=4, rank=rank, world_size=world_size,
                             pad=False, prefetch=0)
        assert loader.shard_size == len(shard)
        assert sum(len(b) for b in loader.batches()) == len(shard)


def test_threaded_shards_deliver_what_indices_promise():
    for rank in range(3):
        loader = BatchLoader(IndexDataset(31), batch_size=4, rank=rank, world_size=3, seed=9)
        loader.set_epoch(2)
        assert seen(loader) == loader.indices().tolist()
        assert len(loader) == 3  # 11 samples per rank


@pytest.mark.parametrize("prefetch", [0, 2])
def test_dataset_errors_surface_in_the_consumer_as_themselves(prefetch):
    loader = BatchLoader(IndexDataset(40, fail_at=17), batch_size=4, shuffle=False,
                         prefetch=prefetch)
    delivered = []
    with pytest.raises(DatasetError) as error:
        for images, _ in loader:
            delivered.append(images)
    assert_one_line(error, "sample-17.png")
    assert len(delivered) == 4  # batches before the bad one arrive


def test_transform_errors_surface_too():
    def broken(images, rng):
        raise ValueError("transform broke")
    with pytest.raises(ValueError, match="transform broke"):
        list(BatchLoader(IndexDataset(10), batch_size=4, transform=broken))


def test_transform_gets_a_generator_seeded_by_seed_epoch_rank_and_batch():
    def add_noise(images, rng):
        return images + rng.random(images.shape).astype(np.float32)

    def run(epoch, rank=0, prefetch=2):
        loader = BatchLoader(IndexDataset(12), batch_size=4, transform=add_noise, seed=3,
                             prefetch=prefetch, rank=rank, world_size=2)
        loader.set_epoch(epoch)
        return np.concatenate([images.reshape(-1) for images, _ in loader])

    np.testing.assert_array_equal(run(0), run(0, prefetch=0))
    assert not np.array_equal(run(0) % 1, run(1) % 1)
    assert not np.array_equal(run(0, rank=0) % 1, run(0, rank=1) % 1)


def test_abandoned_iteration_stops_the_thread():
    dataset = IndexDataset(10_000)
    loader = BatchLoader(dataset, batch_size=2, prefetch=2)
    for _ in loader:
        break
    assert not loader_threads()  # joined as soon as the loop let go of the iterator
    dataset.gets = 0
    batches = iter(loader)
    next(batches)
    time.sleep(0.1)
    assert dataset.gets <= 1 + 2 + 2  # one taken, two queued, one waiting to go in, +1 slack
    batches.close()
    assert not loader_threads()


def test_an_error_in_the_training_step_stops_the_thread():
    loader = BatchLoader(IndexDataset(1000, delay=0.001), batch_size=2, prefetch=1)
    with pytest.raises(RuntimeError, match="step failed"):
        for _ in loader:
            raise RuntimeError("step failed")
    assert not loader_threads()


def test_a_slow_thread_still_delivers_everything():
    # the consumer waits in short polls; none of them may be mistaken for the end
    loader = BatchLoader(IndexDataset(6, delay=0.07), batch_size=1, prefetch=2)
    assert sorted(seen(loader)) == list(range(6))


def test_empty_dataset_gives_an_empty_epoch():
    loader = BatchLoader(IndexDataset(0), batch_size=4)
    assert len(loader) == 0 and list(loader) == []


@pytest.mark.parametrize("options, key", [
    ({"batch_size": 0}, "data.batch_size"), ({"batch_size": 4, "prefetch": -1}, "data.prefetch"),
    ({"batch_size": 4, "rank": 2, "world_size": 2}, "rank"),
    ({"batch_size": 4, "world_size": 0}, "world_size"),
])
def test_bad_settings_are_config_errors(options, key):
    with pytest.raises(ConfigError) as error:
        BatchLoader(IndexDataset(4), **options)
    assert_one_line(error, key)
