"""``LayerRun``: one layer on a device with every blob it declares resident in the pool.

For tests, notebooks and the gradient checker; the net's executor does the same with a plan.
Values go in and come out as host numpy arrays. ``SplitRun`` is the same with each step split
along the batch (``minilms.layers.split``).
"""
import numpy as np

from ..blob import Blob
from .base import Layer, StepIO
from .split import run_split, split_buffers


class LayerRun:
    def __init__(self, device, layer: Layer, bottom_shapes, dtype=np.float32, seed: int = 0,
                 bottom_dtypes=None, device_kind: str | None = None):
        """``device_kind``: set the layer up for that device (``Layer.setup``); None, the
        default, sizes it for either."""
        self.device, self.layer, self.seed, self.dtype = device, layer, seed, np.dtype(dtype)
        top_shapes = layer.setup(bottom_shapes, device_kind)
        bottom_dtypes = bottom_dtypes or [dtype] * len(bottom_shapes)
        name = layer.name

        def blob(label, shape, role, blob_dtype=dtype):
            return Blob(device, f"{name}.{label}", shape, blob_dtype, role)

        self.bottom = [blob(f"bottom{i}", s, "input", d)
                       for i, (s, d) in enumerate(zip(bottom_shapes, bottom_dtypes))]
        self.top = [blob(f"top{i}", s, "activation") for i, s in enumerate(top_shapes)]
        self.specs = {p.name: p for p in layer.params()}
        self.params = {p.name: blob(p.name, p.shape, "param") for p in self.specs.values()}
        self.param_grad = {p.name: blob(f"{p.name}.grad", p.shape, "param_grad")
                           for p in self.specs.values() if p.learnable}
        self.saved = {b.name: blob(b.name, b.shape, "activation", b.dtype_in(dtype))
                      for b in layer.saved()}
        self.work = {b.name: blob(b.name, b.shape, "workspace", b.dtype_in(dtype))
                     for b in layer.workspace()}
        self.top_grad = [blob(f"top{i}.grad", s, "activation_grad")
                         for i, s in enumerate(top_shapes)]
        self.bottom_grad = [blob(f"bottom{i}.grad", s, "activation_grad")
                            for i, s in enumerate(bottom_shapes)]
        rng = np.random.default_rng(seed)
        for spec in self.specs.values():
            self.params[spec.name].mutable_host_data()[...] = spec.initial(rng, dtype)

    def set_param(self, name: str, value) -> None:
        self.params[name].mutable_host_data()[...] = value

    def param(self, name: str) -> np.ndarray:
        return self.params[name].host_data().copy()

    def forward(self, bottoms, train: bool = True) -> list[np.ndarray]:
        for blob, value in zip(self.bottom, bottoms):
            blob.mutable_host_data()[...] = value
        io = StepIO(bottom=[b.device_data() for b in self.bottom],
                    top=[t.mutable_device_data(overwrite=True) for t in self.top],
                    params={k: b.mutable_device_data() for k, b in self.params.items()},
                    saved={k: b.mutable_device_data(overwrite=True) for k, b in self.saved.items()},
                    work={k: b.mutable_device_data(overwrite=True) for k, b in self.work.items()},
                    train=train, rng=np.random.default_rng(self.seed),
                    stream=self.device.compute_stream if self.device.kind == "cuda" else None)
        self._forward(io)
        self.device.synchronize()
        return [t.host_data().copy() for t in self.top]

    def backward(self, top_grads, propagate_down=None):
        """Gradients for ``top_grads``: (bottom gradients, with None where not propagated, and
        parameter gradients by name). Call after ``forward``."""
        propagate_down = propagate_down or [True] * len(self.bottom)
        for blob, value in zip(self.top_grad, top_grads):
            blob.mutable_host_data()[...] = value
        # Forward blobs the layer did not declare in backward_reads are withheld, as LMS would
        # have dropped them: a layer that reads one anyway fails here, in its own test.
        reads = self.layer.backward_reads
        io = StepIO(bottom=[b.device_data() if "bottom" in reads else None for b in self.bottom],
                    top=[t.device_data() if "top" in reads else None for t in self.top],
                    params={k: b.device_data() for k, b in self.params.items()},
                    saved={k: b.device_data() for k, b in self.saved.items()},
                    work={k: b.mutable_device_data(overwrite=True) for k, b in self.work.items()},
                    top_grad=[g.mutable_device_data() if self.layer.backward_rewrites_top_grad
                              else g.device_data() for g in self.top_grad],
                    bottom_grad=[g.mutable_device_data(overwrite=True) if down else None
                                 for g, down in zip(self.bottom_grad, propagate_down)],
                    param_grad={k: g.mutable_device_data(overwrite=True)
                                for k, g in self.param_grad.items()},
                    stream=self.device.compute_stream if self.device.kind == "cuda" else None)
        self._backward(io)
        self.device.synchronize()
        bottom = [g.host_data().copy() if down else None
                  for g, down in zip(self.bottom_grad, propagate_down)]
        return bottom, {k: g.host_data().copy() for k, g in self.param_grad.items()}

    def _forward(self, io: StepIO) -> None:
        self.layer.forward(io)

    def _backward(self, io: StepIO) -> None:
        self.layer.backward(io)


class SplitRun(LayerRun):
    """``LayerRun`` whose forward and backward run as sub-steps over consecutive sample ranges
    (``run_split``): ``chunks`` is a count or a list of sizes, and may be changed between steps.
    The split temporaries of each phase (``split_buffers``) are blobs of their own, made on first
    use."""

    def __init__(self, device, layer: Layer, bottom_shapes, dtype=np.float32, seed: int = 0,
                 bottom_dtypes=None, chunks=2):
        super().__init__(device, layer, bottom_shapes, dtype, seed, bottom_dtypes)
        self.chunks = chunks
        self.temps: dict[str, dict] = {}

    def _temps(self, phase: str) -> dict:
        if phase not in self.temps:
            self.temps[phase] = {
                spec.name: Blob(self.device, f"{self.layer.name}.split.{phase}.{spec.name}",
                                spec.shape, spec.dtype_in(self.dtype), "workspace")
                for spec in split_buffers(self.layer, phase)}
        return {name: blob.mutable_device_data(overwrite=True)
                for name, blob in self.temps[phase].items()}

    def _forward(self, io: StepIO) -> None:
        phase = "forward" if io.train else "inference"
        run_split(self.layer, io, self.chunks, phase, self._temps(phase))

    def _backward(self, io: StepIO) -> None:
        run_split(self.layer, io, self.chunks, "backward", self._temps("backward"))
