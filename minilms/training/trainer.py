"""The training loop behind ``python -m minilms.train``: data, the LMS executor, the solver and its
schedule, evaluation, metrics, checkpoints and resume.

``Trainer(config)`` does everything that can fail on bad input first (datasets opened, net built,
device made, plan computed) and writes nothing; ``Trainer.run(run_dir)`` then trains, writing
``metrics.jsonl`` and ``metrics.csv`` (one row per logged iteration and per evaluation), checkpoints
(``minilms.training.checkpoint``) and, with ``trace: true``, the memory trace.

Determinism: the initial weights come from ``seed``; the data order and augmentation from
``(seed, epoch, batch)`` (``BatchLoader``); dropout from the executor's generator, whose state is
checkpointed; the learning rate and Adam's step from the iteration. So a run resumed from any
checkpoint ends with the weights the uninterrupted run ends with.

Data parallel (``mpiexec -n N``, a ``World`` from ``minilms.training.distributed``): every rank
trains on its shard of each epoch with its own device, rank 0's initial weights and state are
broadcast, gradients are averaged before each update, and the logged loss and accuracy are averages
over the ranks. Validation: each rank evaluates its unpadded shard and the sums are reduced, so
every sample counts once. Rank 0 alone writes metrics, checkpoints and the summary and shows
progress; images/s counts the images of all ranks.
"""
import json
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

from tqdm import tqdm

from ..config.build import build_net, lms_policy, planned_net
from ..datasets import OPTIONS, BatchLoader, make_dataset, make_transform
from ..device import AUTO_FRACTION, make_device, parse_link, resolve_kind
from ..device.cpu import host_memory_info
from ..errors import ConfigError, DatasetError, DivergedError
from ..kernels.mkl import chosen as blas_library
from ..lms.bounds import resident_bytes
from ..lms.cost import CostModel, measure_cpu
from ..lms.host import host_memory, loader_batches
from ..lms.replay import LmsExecutor
from ..lms.ring import Pending
from ..schedules import make_schedule
from ..sizes import format_bytes
from ..solver import SGD, Adam
from .checkpoint import (
    apply_weights,
    load_checkpoint,
    load_weights,
    restore_rngs,
    save_checkpoint,
)
from .distributed import GradientReducer, World, device_of, memory_share, sharers
from .metrics import Metrics, NoMetrics, finite_or_null
from .retention import prune_checkpoints

MiB = 2**20


def make_solver(section):
    if section.type == "adam":
        return Adam(section.lr, betas=tuple(section.betas), eps=section.eps,
                    weight_decay=section.weight_decay)
    return SGD(section.lr, momentum=section.momentum, nesterov=section.nesterov,
               weight_decay=section.weight_decay)


@dataclass(frozen=True)
class Issued:
    """An iteration the loop issued and has not read yet, with what its log line says."""
    pending: Pending
    iteration: int      # counted from 0
    images: int         # in the batch, over every rank
    lr: float
    stall_ms: float     # the executor's, measured while it was issued (cpu)
    tick: float         # when the loop started issuing it


class Trainer:
    def __init__(self, config, quiet: bool = False, world: World | None = None):
        self.world = world = world or World()
        self.config, self.quiet = config, quiet or world.rank != 0
        world.agree(config.to_yaml(), "the resolved config")
        data = config.data
        options = {k: data[k] for k in OPTIONS if k in data}
        options["seed"] = config.seed
        self.train_set = make_dataset(data.dataset, "train", **options)
        self.val_set = make_dataset(data.dataset, "val", **options) if data.val_size else None
        for split in (self.train_set, self.val_set):    # an unreadable format fails here, early
            if split is not None and len(split):
                split.get([0])
        channels, height, width = self.train_set.shape
        if (channels, height) != (data.channels, data.image_size) or height != width:
            raise ConfigError("data.image_size", f"the data's shape ({channels} channels, "
                              f"{height}x{width})", (data.channels, data.image_size))
        wanted = config.model.options.num_classes or data.num_classes
        if wanted and wanted != self.train_set.num_classes:
            raise ConfigError("model.options.num_classes",
                              f"the data's {self.train_set.num_classes}"
                              " classes", wanted)
        shard = {"rank": world.rank, "world_size": world.size}
        self.loader = BatchLoader(self.train_set, data.batch_size, shuffle=True, seed=config.seed,
                                  transform=make_transform(data.augment, self.train_set, True),
                                  prefetch=data.prefetch, **shard)
        self.val_loader = None if self.val_set is None else BatchLoader(
            self.val_set, data.batch_size, shuffle=False, seed=config.seed,
            transform=make_transform(data.augment, self.train_set, False), prefetch=data.prefetch,
            pad=False, **shard)
        self.net = build_net(config)
        self.loss_name, self.accuracy_name, self.classes = self.outputs_of(self.net)
        if self.train_set.num_classes > self.classes:
            raise ConfigError(self.classifier_key(), f"a classifier with at least "
                              f"{self.train_set.num_classes} outputs (the data's classes)",
                              self.classes)
        link = parse_link(config.device.link)
        self.solver = make_solver(config.solver)
        self.device = self.make_device(resident_bytes(self.net, self.net.schedule(
            tuple(self.solver.state_names))))
        model = measure_cpu(link) if self.device.kind == "cpu" else \
            CostModel.for_device("cuda")
        policy, self.reducer = lms_policy(config), None
        if world.distributed:
            policy = replace(policy, reduce_grads=True)
            self.reducer = GradientReducer(world, overlap=config.distributed.overlap)
        # the net the pool holds a plan for: with LMS on, the adds' ReLUs fused where it can
        self.net, self.executor = planned_net(config, lambda net, policy: LmsExecutor(
            net, self.device, self.solver, policy, seed=config.seed, cost_model=model,
            reducer=self.reducer), policy, built=self.net)
        epochs, max_iters = config.train.epochs, config.train.max_iters
        per_epoch = len(self.loader)
        self.total_iters = min(epochs * per_epoch if epochs else math.inf, max_iters or math.inf)
        self.epochs = epochs or math.ceil(self.total_iters / per_epoch)
        # lr_scaling linear: N ranks step as one process with an N times larger batch
        self.lr_factor = world.size if config.distributed.lr_scaling == "linear" else 1
        schedule = dict(config.solver.schedule)
        schedule["min_lr"] = schedule["min_lr"] * self.lr_factor
        self.schedule = make_schedule(schedule, config.solver.lr * self.lr_factor,
                                      int(self.total_iters))
        self.plan = self.executor.plan          # the training plan, for people (full batches)
        self.epoch, self.start_batch = 0, 0
        self.best = None                # (validation accuracy, checkpoint tag)
        if config.init_weights:
            self.load_weights(config.init_weights)

    def outputs_of(self, net):
        """``(loss blob, accuracy blob or None, classifier outputs)``: what the loop reads after
        each iteration, by the names the model gave them."""
        losses = [layer for layer in net.layers if layer.is_loss]
        if not losses:
            raise ConfigError("model.layers", "a layer that computes a loss (SoftmaxWithLoss)",
                              "none")
        accuracy = [layer.top[0] for layer in net.layers if layer.type == "Accuracy"]
        return losses[0].top[0], (accuracy[0] if accuracy else None), \
            int(losses[0].bottom_shapes[0][1])

    def classifier_key(self) -> str:
        """The config key that sets the classifier's outputs (the loss layer's first bottom)."""
        layers = self.config.model.layers
        if layers is None:
            return "model.options.num_classes"
        logits = next(layer for layer in self.net.layers if layer.is_loss).bottom[0]
        for i, spec in enumerate(layers):
            if logits in ([spec.get("top")] if isinstance(spec.get("top"), str)
                          else list(spec.get("top") or [])):
                return f"model.layers[{i}].num_output"
        return "model.layers"

    def check_labels(self, labels, batch: int) -> None:
        """Labels the classifier has no output for would train to NaN: a clear error instead."""
        if len(labels) and (labels.min() < 0 or labels.max() >= self.classes):
            bad = int(labels.max() if labels.max() >= self.classes else labels.min())
            raise DatasetError(f"data.dataset ({self.train_set.name}, train split)",
                               f"labels in [0, {self.classes}) (the classifier's outputs)",
                               f"label {bad} in batch {batch}")

    def make_device(self, need: int):
        """This rank's device: on ``cuda`` the GPU of its local rank. ``device.memory: auto`` in a
        data-parallel run: a share of what is free (the least any rank on the node sees, after
        all have looked) divided by the ranks that share the device (on ``cpu``: the node's).
        ``auto`` takes no more than ``need``, what the net needs with LMS off."""
        device, world = self.config.device, self.world
        kind, memory, device_id, gpus = resolve_kind(device.kind), device.memory, 0, 1
        if kind == "cpu":
            blas_library()      # a bad MINILMS_BLAS is one line now, not mid-iteration
        if kind == "cuda":
            from numba import cuda
            if not cuda.is_available():     # before cuda.gpus, which raises a traceback
                raise ConfigError("device.kind", "a CUDA GPU (none is present; use cpu or auto)",
                                  "cuda")
            gpus = len(cuda.gpus)
            device_id = device_of(world.local_rank, gpus)
        if world.distributed and memory == "auto":
            if kind == "cuda":
                from ..device.cuda import free_gpu_memory
                free = free_gpu_memory(device_id)
            else:
                free = host_memory_info()[0]
            free = int(world.sum([free], "sharing device memory", local=True, op="min")[0])
            memory = min(need, memory_share(free, AUTO_FRACTION[kind],
                                            sharers(world.local_rank, world.local_size, gpus)))
        return make_device(kind, memory, device.link, device_id, need=need)

    # -- state -----------------------------------------------------------------------------------
    def parameters(self) -> dict:
        return {n: b for n, b in self.executor.shared.items() if b.role == "param"}

    def load_weights(self, path) -> None:
        self.executor.flush()
        apply_weights(self.parameters(), load_weights(path), source=str(path))

    def resume(self, run_dir) -> None:
        checkpoint = load_checkpoint(run_dir)
        self.executor.flush()
        state = {n: b for n, b in self.executor.shared.items() if b.role == "optimizer_state"}
        apply_weights(self.parameters(), checkpoint.weights, source=str(checkpoint.path))
        apply_weights(state, checkpoint.state, source=str(checkpoint.path))
        meta = checkpoint.meta
        restore_rngs({"dropout": self.executor.rng}, meta["rng"],
                     source=checkpoint.path / "trainer.json")
        best = meta.get("best")
        self.best = (best["val_accuracy"], best["tag"]) if isinstance(best, dict) else None
        self.executor.iteration = meta["iteration"]
        self.epoch, self.start_batch = meta["epoch"], meta["batch"]
        self.world.agree(f"{meta['iteration']} {meta['epoch']} {meta['batch']}",
                         f"the checkpoint resumed ({checkpoint.path})")

    def share_state(self) -> None:
        """Every rank takes rank 0's parameters and optimizer state (initial or resumed)."""
        if not self.world.distributed:
            return
        self.executor.flush()
        self.world.broadcast({n: b.mutable_host_data() for n, b in self.executor.shared.items()},
                             "initial weights and state")

    def checkpoint(self, run_dir: Path, batch: int, val_accuracy: float | None = None) -> None:
        """Save, then keep the newest ``train.keep_checkpoints`` and the best by validation
        accuracy (``val_accuracy``: this checkpoint's, where it was just evaluated)."""
        if self.world.rank != 0:
            return
        self.executor.sync_state()
        shared = self.executor.shared
        tag = f"iter-{self.executor.iteration:07d}"
        if val_accuracy is not None and math.isfinite(val_accuracy) and (
                self.best is None or val_accuracy > self.best[0]):
            self.best = (val_accuracy, tag)
        meta = {"iteration": self.executor.iteration, "epoch": self.epoch, "batch": batch,
                "rng": {"dropout": self.executor.rng}, "config": self.config.to_yaml()}
        if self.best is not None:
            meta["best"] = {"tag": self.best[1], "val_accuracy": self.best[0]}
        save_checkpoint(run_dir, tag,
                        {n: b.host_data() for n, b in shared.items() if b.role == "param"},
                        {n: b.host_data() for n, b in shared.items()
                         if b.role == "optimizer_state"}, meta)
        prune_checkpoints(run_dir, self.config.train.keep_checkpoints,
                          self.best[1] if self.best else None)

    # -- the loop --------------------------------------------------------------------------------
    def run(self, run_dir: Path) -> dict:
        run_dir = Path(run_dir)
        log = Metrics(run_dir) if self.world.rank == 0 else NoMetrics()
        train, world = self.config.train, self.world
        plan = self.plan
        moved = (plan.bytes_moved("h2d") + plan.bytes_moved("d2h")) / MiB
        self.say(self.describe())
        self.share_state()
        started, last = time.perf_counter(), {}
        self.reduce_wait, self._read_at = 0.0, started
        while self.epoch < self.epochs and self.executor.iteration < self.total_iters:
            self.loader.set_epoch(self.epoch)
            bar = tqdm(total=len(self.loader), initial=self.start_batch, leave=False,
                       desc=f"epoch {self.epoch + 1}/{self.epochs}", disable=self.quiet,
                       mininterval=0.5, dynamic_ncols=True)
            batch_number = self.start_batch
            issued = None   # the iteration issued last: read once the next one is issued
            for batch_number, (images, labels) in enumerate(self.loader):
                if batch_number < self.start_batch:
                    continue               # resumed mid-epoch: these were trained already
                if self.executor.iteration >= self.total_iters:
                    break
                iteration = self.executor.iteration
                self.solver.lr = self.schedule(iteration)
                tick = time.perf_counter()
                self.check_labels(labels, batch_number)
                pending = self.executor.submit({"data": images, "label": labels})
                if world.distributed:
                    self.reduce_wait += self.reducer.wait_seconds
                if issued is not None:
                    last = self.read_out(issued, bar, log, moved)
                issued = Issued(pending, iteration, len(labels) * world.size, self.solver.lr,
                                self.executor.stall_seconds * 1e3, tick)
            else:
                batch_number = len(self.loader)
            if issued is not None:
                last = self.read_out(issued, bar, log, moved)
            bar.close()
            finished_epoch = batch_number >= len(self.loader)
            if finished_epoch:
                self.epoch, self.start_batch = self.epoch + 1, 0
            else:
                self.start_batch = batch_number
            done = self.epoch >= self.epochs or self.executor.iteration >= self.total_iters
            evaluated = None
            if self.val_loader is not None and (done or (train.eval_every and finished_epoch and
                                                         self.epoch % train.eval_every == 0)):
                evaluated = self.evaluate(log, finished_epoch)
                last.update(evaluated)
            if done or (train.checkpoint_every and finished_epoch and
                        self.epoch % train.checkpoint_every == 0):
                self.checkpoint(run_dir, self.start_batch,
                                evaluated["val_accuracy"] if evaluated else None)
        seconds = time.perf_counter() - started
        self.executor.sync_state()
        summary = {"iterations": self.executor.iteration, "epochs": self.epoch,
                   "seconds": round(seconds, 2), **{k: v for k, v in last.items()}}
        if world.distributed:
            summary["ranks"] = world.size
        if self.device.kind == "cpu":     # a run's bits depend on the library (kernels/mkl.py)
            summary["blas"] = blas_library()
        self.say(self.finish(summary))
        if world.rank == 0:
            (run_dir / "summary.json").write_text(
                json.dumps(finite_or_null(summary), indent=2, allow_nan=False) + "\n")
        return summary

    def read_out(self, issued: "Issued", bar, log, moved: float) -> dict:
        """An iteration's loss and accuracy, read after the next iteration was issued (so that a
        GPU has the next one queued while the host waits for these): checked, shown, logged."""
        out = issued.pending.result()
        values = [out[self.loss_name], out.get(self.accuracy_name, math.nan)]
        world, train = self.world, self.config.train
        if world.distributed:       # the mean over ranks (each rank's batch is as big)
            values = world.sum(values, "averaging the loss") / world.size
        last = {"loss": float(values[0]), "accuracy": float(values[1])}
        if not math.isfinite(last["loss"]) and train.on_nonfinite_loss == "stop":
            raise DivergedError(
                f"iteration {issued.iteration + 1}: the loss is {last['loss']} (lr "
                f"{issued.lr:g}): training stopped; lower solver.lr, or set "
                "train.on_nonfinite_loss=continue to train on")
        now = time.perf_counter()
        images_per_s = issued.images / (now - max(issued.tick, self._read_at))
        self._read_at = now
        bar.update(1)
        bar.set_postfix(loss=f"{last['loss']:.3f}", acc=f"{last['accuracy']:.3f}",
                        img_s=f"{images_per_s:.0f}", mib_it=f"{moved:.1f}", refresh=False)
        if (issued.iteration + 1) % train.log_every == 0 or issued.iteration == 0:
            log.write(split="train", epoch=self.epoch, iteration=issued.iteration + 1, **last,
                      lr=issued.lr, images_per_s=images_per_s, mib_moved=moved,
                      stall_ms=issued.stall_ms)
        return last

    def evaluate(self, log, finished_epoch: bool = True) -> dict:
        total = {"loss": 0.0, "accuracy": 0.0}
        names = {"loss": self.loss_name, "accuracy": self.accuracy_name}
        count = 0
        for images, labels in self.val_loader:
            out = self.executor.iterate({"data": images, "label": labels}, train=False)
            for key in total:
                total[key] += out.get(names[key], math.nan) * len(labels)
            count += len(labels)
        *sums, count = self.world.sum([*total.values(), count], "summing the validation")
        result = {f"val_{k}": v / count for k, v in zip(total, sums)}
        log.write(split="val", epoch=self.epoch, iteration=self.executor.iteration,
                  loss=result["val_loss"], accuracy=result["val_accuracy"], lr=self.solver.lr)
        # mid-epoch (max_iters stopped it), name the iteration: "epoch 1" is the one before
        where = f"epoch {self.epoch}" if finished_epoch else \
            f"iteration {self.executor.iteration} (in epoch {self.epoch + 1})"
        self.say(f"{where}: validation loss {result['val_loss']:.4f}, accuracy "
                 f"{result['val_accuracy']:.4f}")
        return result

    # -- words for people ------------------------------------------------------------------------
    def describe(self) -> str:
        plan, policy = self.plan, self.plan.policy
        return (f"training {self.config.name}: {len(self.net.layers)} layers, batch "
                f"{self.config.data.batch_size}, {len(self.loader)} iterations per epoch, "
                f"{int(self.total_iters)} in all, on {self.device.name}"
                + (f", BLAS {blas_library()}" if self.device.kind == "cpu" else "") + "\n"
                f"{policy.describe()}: peak {format_bytes(plan.peak)} of "
                f"{format_bytes(plan.capacity)}, moves {format_bytes(plan.bytes_moved('h2d'))} "
                f"H2D and {format_bytes(plan.bytes_moved('d2h'))} D2H per iteration\n"
                f"host memory {self.host_memory().describe()}, beside the process itself"
                + "".join(f"\nnote: {n}" for n in plan.notes) + self.describe_world())

    def host_memory(self):
        """What the training plan needs on the host (``minilms.lms.host``), with the loader's
        batches. Evaluation's forward-only plan adds the homes of the blobs it moves."""
        return host_memory(self.plan, self.device.kind, loader_batches(self.config.data.prefetch))

    def describe_world(self) -> str:
        world, config = self.world, self.config
        if not world.distributed:
            return ""
        batch = config.data.batch_size
        overlap = "overlapped with backward" if config.distributed.overlap else \
            "after the last backward"
        scaling = (f"lr scaling linear: lr {config.solver.lr * self.lr_factor:g} = "
                   f"{config.solver.lr:g} x {world.size}" if self.lr_factor != 1 else
                   f"lr scaling none: lr {config.solver.lr:g} as configured")
        return (f"\ndata parallel: {world.size} ranks, batch {batch} each ({batch * world.size} "
                f"in all), gradients averaged with allreduce on the host copies, {overlap}; "
                f"{scaling}; a rank waits at most {config.distributed.timeout:g} s for the others")

    def finish(self, summary: dict) -> str:
        plan = self.plan
        swaps = sum(1 for _, a in plan.actions() if a.kind == "swap_out")
        loads = sum(1 for _, a in plan.actions() if a.kind == "swap_in")
        drops = sum(1 for _, a in plan.actions() if a.kind == "drop")
        text = (f"done: {summary['iterations']} iterations in {summary['seconds']:.1f} s")
        if "val_accuracy" in summary:
            text += f", validation accuracy {summary['val_accuracy']:.4f}"
        text += (f"\nLMS per iteration: {loads} swap-ins, {swaps} swap-outs, {drops} drops; "
                 f"{format_bytes(plan.bytes_moved('h2d'))} in, "
                 f"{format_bytes(plan.bytes_moved('d2h'))} out; pool peak "
                 f"{format_bytes(plan.peak)} of {format_bytes(plan.capacity)}")
        if self.world.distributed and summary["iterations"]:
            text += (f"\nallreduce: updates waited {self.reduce_wait * 1e3:.1f} ms in all for "
                     f"gradient averages on rank 0")
        return text

    def say(self, text: str) -> None:
        if not self.quiet:
            tqdm.write(text)

    def close(self) -> None:
        if self.reducer is not None:
            self.reducer.close()
        self.device.close()


def record_trace(enabled: bool, trainer: Trainer):
    """A trace recorder when ``trace: true`` (``minilms.trace``), else a no-op context. Given the
    executor, it knows the plan and the pool from before it began."""
    if not enabled:
        from contextlib import nullcontext
        return nullcontext(None)
    from ..trace.record import record
    return record(executor=trainer.executor)

