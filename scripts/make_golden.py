"""Golden fixtures: PyTorch's answers for every minilms layer type and a few whole nets, written as
small ``.npz`` files into ``tests/golden/`` so that ``tests/test_golden.py`` compares minilms with
PyTorch on machines without PyTorch (CI, and every fresh checkout).

    python scripts/make_golden.py          (with an interpreter that has torch; exits 2 without)

Why fixtures: the PyTorch comparisons in the layer and kernel tests skip where torch is missing,
which is everywhere CI runs. The fixtures keep those comparisons alive there; regenerate them when a
case is added or PyTorch's answer should be re-taken, and review the diff like code.

Every file holds plain arrays only (no pickle: ``np.load(path, allow_pickle=False)`` reads it) and
a 0-d string array ``meta``, a JSON object saying what the file is. A layer case (``kind: layer``):

    meta            type, options (the layer's, as a config gives them), dtype (the run's), train,
                    propagate_down, rng_seed (LayerRun's seed: Dropout's mask), what
    bottom.<i>      the inputs (labels int32)
    param.<name>    the parameters before the step, in PyTorch's layouts (minilms uses them)
    top_grad.<i>    the seed gradient of each top
    top.<i>         PyTorch's outputs
    bottom_grad.<i> PyTorch's input gradients (where propagate_down)
    param_grad.<n>  PyTorch's parameter gradients
    param_after.<n> state a training forward updates (BatchNorm's running statistics)
    mask            Dropout's keep mask, which minilms draws on the host from ``rng_seed``

A net case (``kind: net``): meta holds the layer list (a config's ``model.layers``), the solver and
the number of steps; ``input.data``, ``input.label``, ``param.<layer>.<name>`` before training,
``loss`` and ``accuracy`` per step (the forward's, before that step's update), and
``after<k>.<layer>.<name>`` every parameter after step k.

References are float64 (PyTorch's CPU supports it for every op here), so a comparison's tolerance
is minilms's rounding alone. ``dtype: float32`` cases store float32 inputs and parameters (float32
runs take other paths: the CPU's direct convolution) and still a float64 reference computed from
those exact values. Whole nets run in float32 in minilms (``Net`` declares float32 blobs): their
inputs and weights are float32 values, their reference float64. Inputs keep away from kinks (ReLU
at 0, max-pooling ties, accuracy ties, Adam's first step at a zero gradient) by construction or by
a margin check that moves to the next seed, so float32 rounding cannot flip a branch.

Deterministic: fixed seeds, one torch thread, and zip entries with a fixed timestamp (the format is
``np.savez_compressed``'s), so regenerating unchanged cases leaves ``git status`` clean.
"""
import json
import shutil
import sys
import zipfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"
FORMAT = 1
MARGIN = 1e-3   # least distance from a kink (see the module docstring), in the values' own units
BUDGET = 2 * 2**20


# --------------------------------------------------------------------------- writing

def save(name: str, meta: dict, arrays: dict) -> Path:
    """``np.savez_compressed``'s layout (a zip of ``.npy`` entries, deflated), but every entry
    dated 1980-01-01 and written without pickle: the bytes depend on the arrays alone."""
    path = GOLDEN / f"{name}.npz"
    entries = {"meta": np.array(json.dumps({"format": FORMAT, "name": name, **meta},
                                           sort_keys=True))}
    for key, value in arrays.items():
        value = np.ascontiguousarray(value)
        if value.dtype == object:
            raise TypeError(f"{name}: {key} is an object array")
        entries[key] = value
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for key, value in entries.items():
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            with archive.open(info, "w", force_zip64=True) as out:
                np.lib.format.write_array(out, value, allow_pickle=False)
    return path


# --------------------------------------------------------------------------- PyTorch, per layer

def pair(value):
    return tuple(value) if isinstance(value, (list, tuple)) else (value, value)


def torch_layer(torch, type_, options, bottoms, params, train=True):
    """PyTorch's forward for a minilms layer: ``bottoms`` and ``params`` are tensors, ``params``
    by minilms's (PyTorch's) names. Returns the top tensor."""
    F = torch.nn.functional
    x = bottoms[0]
    if type_ == "Convolution":
        return F.conv2d(x, params["weight"], params.get("bias"),
                        stride=pair(options.get("stride", 1)), padding=pair(options.get("pad", 0)),
                        dilation=pair(options.get("dilation", 1)), groups=options.get("groups", 1))
    if type_ == "InnerProduct":
        return F.linear(x.flatten(1), params["weight"], params.get("bias"))
    if type_ == "Pooling":
        pool = options.get("pool", "max").lower()
        if options.get("global_pooling"):
            kernel, stride, pad, ceil = tuple(x.shape[2:]), tuple(x.shape[2:]), 0, False
        else:
            kernel = pair(options["kernel_size"])
            stride = pair(options.get("stride", options["kernel_size"]))
            pad, ceil = pair(options.get("pad", 0)), options.get("ceil_mode", False)
        if pool == "max":
            return F.max_pool2d(x, kernel, stride, pad, ceil_mode=ceil)
        return F.avg_pool2d(x, kernel, stride, pad, ceil_mode=ceil,
                            count_include_pad=options.get("count_include_pad", True))
    if type_ == "BatchNorm":
        # F.batch_norm updates running_mean/var in place in training: PyTorch's momentum, new =
        # (1 - momentum) * old + momentum * batch statistic (unbiased variance), as minilms's.
        return F.batch_norm(x, params["running_mean"], params["running_var"],
                            params.get("weight"), params.get("bias"), training=train,
                            momentum=options.get("momentum", 0.1), eps=options.get("eps", 1e-5))
    if type_ == "ReLU":
        return F.relu(x)
    if type_ == "Dropout":
        raise ValueError("Dropout is computed from its mask (see dropout_case)")
    if type_ == "Eltwise":
        coeffs = options.get("coeffs") or [1.0] * len(bottoms)
        return sum(c * b for c, b in zip(coeffs, bottoms))
    if type_ == "Concat":
        return torch.cat(bottoms, dim=1)
    if type_ == "Flatten":
        return torch.flatten(x, 1)
    if type_ == "SoftmaxWithLoss":
        logits = x.reshape(x.shape[0], -1)
        loss = F.cross_entropy(logits, bottoms[1].long())
        return (options.get("loss_weight", 1.0) * loss).reshape(1)
    if type_ == "Accuracy":
        logits = x.reshape(x.shape[0], -1)
        top = torch.topk(logits, options.get("top_k", 1), dim=1).indices
        hit = (top == bottoms[1].long()[:, None]).any(dim=1)
        return hit.to(x.dtype).mean().reshape(1)
    raise ValueError(f"no PyTorch reference for layer type {type_}")


# --------------------------------------------------------------------------- layer cases

class Cases:
    """Writes the cases and remembers the files (for the size budget)."""

    def __init__(self, torch):
        self.torch, self.written = torch, []
        self.rng = np.random.default_rng(0)   # seed gradients: each family sets its own

    def tensor(self, value, grad=False):
        t = self.torch.tensor(np.asarray(value))
        if t.is_floating_point():
            t = t.double()
            t.requires_grad_(grad)
        return t

    def layer(self, name, type_, options, bottoms, params=None, *, dtype="float64", train=True,
              propagate_down=None, what="", state=()):
        """One layer case: ``bottoms`` and ``params`` as numpy arrays (cast to ``dtype`` here, the
        reference computed in float64 from the cast values); ``state``: parameters the forward
        updates (stored after as ``param_after``)."""
        cast = {"float64": np.float64, "float32": np.float32}[dtype]
        bottoms = [b if b.dtype.kind == "i" else b.astype(cast) for b in bottoms]
        params = {k: v.astype(cast) for k, v in (params or {}).items()}
        if propagate_down is None:
            propagate_down = [b.dtype.kind == "f" for b in bottoms]
        backward = train and type_ != "Accuracy"
        tb = [self.tensor(b, backward and down) for b, down in zip(bottoms, propagate_down)]
        tp = {k: self.tensor(v, backward and k not in state) for k, v in params.items()}
        top = torch_layer(self.torch, type_, options, tb, tp, train)
        arrays = {f"bottom.{i}": b for i, b in enumerate(bottoms)}
        arrays.update({f"param.{k}": v for k, v in params.items()})
        arrays["top.0"] = top.detach().numpy()
        if backward:
            dy = self.rng.standard_normal(tuple(top.shape)).astype(cast)
            arrays["top_grad.0"] = dy
            top.backward(self.tensor(dy))
            for i, (t, down) in enumerate(zip(tb, propagate_down)):
                if down:
                    arrays[f"bottom_grad.{i}"] = t.grad.numpy()
            for k, t in tp.items():
                if k not in state:
                    arrays[f"param_grad.{k}"] = t.grad.numpy()
        for k in state:
            arrays[f"param_after.{k}"] = tp[k].detach().numpy()
        self.write(name, dict(kind="layer", type=type_, options=options, dtype=dtype, train=train,
                              propagate_down=propagate_down, rng_seed=0, what=what), arrays)

    def write(self, name, meta, arrays):
        meta = dict(meta, torch=self.torch.__version__.split("+")[0])
        self.written.append(save(name, meta, arrays))


def away_from_zero(rng, shape, margin=0.1):
    x = rng.standard_normal(shape)
    return np.where(np.abs(x) < margin, np.copysign(margin, x), x)


def distinct(rng, shape, spacing=0.05):
    """Values at least ``spacing`` apart, in random order: no max-pooling or accuracy ties."""
    values = (np.arange(int(np.prod(shape))) - np.prod(shape) / 2) * spacing
    return rng.permutation(values).reshape(shape)


def convolution(cases, rng):
    def case(name, shape, out, kernel, dtype="float64", what="", **options):
        options = dict(num_output=out, kernel_size=kernel, **options)
        kh, kw = pair(kernel)
        params = {"weight": rng.standard_normal((out, shape[1] // options.get("groups", 1),
                                                 kh, kw)) * 0.5}
        if options.get("bias", True):
            params["bias"] = rng.standard_normal(out)
        cases.layer(f"Convolution-{name}", "Convolution", options, [rng.standard_normal(shape)],
                    params, dtype=dtype, what=what)

    case("plain", (2, 3, 5, 5), 4, 3, what="3x3, no padding")
    case("strided_padded", (2, 2, 6, 5), 3, 3, stride=2, pad=1, what="stride 2, pad 1")
    case("dilated", (2, 2, 6, 6), 3, [2, 3], dilation=[2, 1], pad=[1, 1],
         what="dilation (2, 1), a 2x3 kernel")
    case("groups", (2, 4, 5, 6), 6, 3, groups=2, stride=[1, 2], pad=1,
         what="2 groups, stride (1, 2)")
    case("no_bias_asymmetric", (1, 2, 4, 5), 2, [3, 2], stride=[2, 1], pad=[1, 0], bias=False,
         what="no bias, rectangular kernel, stride and pad")
    case("banded", (2, 2, 5, 4), 4, 3, pad=1, groups=2, max_workspace=200,
         what="a workspace too small for one sample: bands of output rows")
    case("plain_f32", (2, 3, 5, 5), 4, 3, dtype="float32",
         what="float32: the CPU's direct convolution")
    case("strided_padded_f32", (2, 2, 6, 5), 3, 3, stride=2, pad=1, dtype="float32",
         what="float32, stride 2, pad 1")


def inner_product(cases, rng):
    for name, shape, bias, dtype in (("4d", (3, 2, 2, 3), True, "float64"),
                                     ("no_bias", (4, 5), False, "float64"),
                                     ("f32", (3, 2, 2, 3), True, "float32")):
        k = int(np.prod(shape[1:]))
        params = {"weight": rng.standard_normal((4, k)) * 0.5}
        if bias:
            params["bias"] = rng.standard_normal(4)
        cases.layer(f"InnerProduct-{name}", "InnerProduct", dict(num_output=4, bias=bias),
                    [rng.standard_normal(shape)], params, dtype=dtype,
                    what=f"{shape} flattened to [N, {k}] -> 4")


def pooling(cases, rng):
    def case(name, shape, what, dtype="float64", **options):
        cases.layer(f"Pooling-{name}", "Pooling", options, [distinct(rng, shape)], dtype=dtype,
                    what=what)

    case("max", (2, 2, 5, 5), "max 3x3, stride 2, pad 1", pool="max", kernel_size=3, stride=2,
         pad=1)
    case("max_ceil", (2, 2, 5, 6), "max 2x2, stride 2, pad 1, ceil_mode (a last window dropped)",
         pool="max", kernel_size=2, stride=2, pad=1, ceil_mode=True)
    case("ave", (2, 2, 5, 5), "average 3x3, stride 2, pad 1, padding counted", pool="ave",
         kernel_size=3, stride=2, pad=1)
    case("ave_exclude_pad", (2, 2, 5, 6), "average 3x2, stride (2, 1), pad 1, padding not counted",
         pool="ave", kernel_size=[3, 2], stride=[2, 1], pad=1, count_include_pad=False)
    case("ave_ceil", (2, 2, 6, 5), "average 3x3, stride 2, pad 1, ceil_mode", pool="ave",
         kernel_size=3, stride=2, pad=1, ceil_mode=True)
    case("global_ave", (2, 3, 4, 5), "global average", pool="ave", global_pooling=True)
    case("global_max", (2, 3, 4, 5), "global max", pool="max", global_pooling=True)
    case("max_f32", (2, 2, 5, 5), "float32 max 3x3, stride 2, pad 1", dtype="float32",
         pool="max", kernel_size=3, stride=2, pad=1)


def batch_norm(cases, rng):
    def case(name, shape, what, dtype="float64", train=True, affine=True, **options):
        c = shape[1]
        params = {"weight": rng.standard_normal(c), "bias": rng.standard_normal(c)} if affine \
            else {}
        params.update(running_mean=rng.standard_normal(c), running_var=rng.random(c) + 0.5)
        x = rng.standard_normal(shape) * 2 + 1
        cases.layer(f"BatchNorm-{name}", "BatchNorm", dict(options, affine=affine), [x], params,
                    dtype=dtype, train=train, state=("running_mean", "running_var"), what=what)

    case("train_4d", (3, 2, 3, 4), "training: batch statistics, running statistics updated with "
         "momentum 0.3 (PyTorch's convention)", momentum=0.3, eps=1e-4)
    case("train_2d", (6, 3), "training, [N, C], default momentum 0.1 and eps 1e-5")
    case("train_no_affine", (4, 2, 2, 2), "training without affine parameters", affine=False,
         momentum=0.2)
    case("eval_4d", (2, 3, 2, 3), "test mode: running statistics, nothing updated", train=False,
         momentum=0.3, eps=1e-3)
    case("train_f32", (3, 2, 3, 4), "float32 training", dtype="float32", momentum=0.3)


def simple(cases, rng):
    cases.layer("ReLU-4d", "ReLU", {}, [away_from_zero(rng, (2, 3, 4, 5))],
                what="max(x, 0), inputs at least 0.1 from the kink")
    cases.layer("ReLU-2d_f32", "ReLU", {}, [away_from_zero(rng, (3, 7))], dtype="float32",
                what="float32")
    cases.layer("Eltwise-coeffs", "Eltwise", dict(operation="sum", coeffs=[1.0, -2.0, 0.5]),
                [rng.standard_normal((2, 3, 4)) for _ in range(3)],
                what="sum with coefficients 1, -2, 0.5")
    cases.layer("Eltwise-plain", "Eltwise", {}, [rng.standard_normal((2, 5)) for _ in range(2)],
                what="plain sum (coefficients 1)")
    cases.layer("Concat-4d", "Concat", {}, [rng.standard_normal((2, c, 3, 2)) for c in (1, 3, 2)],
                what="three bottoms along channels")
    cases.layer("Concat-2d", "Concat", {}, [rng.standard_normal((3, c)) for c in (2, 4)],
                what="[N, C] bottoms")
    cases.layer("Flatten-4d", "Flatten", {}, [rng.standard_normal((2, 3, 2, 4))], what="4-d")
    cases.layer("Flatten-3d", "Flatten", {}, [rng.standard_normal((3, 2, 5))], what="3-d")


def dropout(cases, rng):
    """PyTorch draws its own mask; minilms draws ``rand(shape) >= p`` from the step's numpy RNG
    (``kernels.elementwise.dropout_mask``), which LayerRun seeds with its ``seed``. The mask is
    drawn here the same way and stored; PyTorch computes ``x * mask / (1 - p)`` with it, which is
    its dropout's arithmetic for a given mask. p = 0 and p = 1 go through F.dropout itself."""
    torch, F = cases.torch, cases.torch.nn.functional
    for name, p, shape, train in (("p0.3", 0.3, (3, 4, 5), True), ("p0", 0.0, (2, 6), True),
                                  ("p1", 1.0, (2, 6), True), ("eval", 0.5, (2, 3, 4), False)):
        x = rng.standard_normal(shape)
        mask = np.greater_equal(np.random.default_rng(0).random(shape), p).astype(np.uint8)
        tx = cases.tensor(x, train)
        if not train:
            top = F.dropout(tx, p, training=False)
        elif p in (0.0, 1.0):
            top = F.dropout(tx, p, training=True)
        else:
            top = tx * torch.tensor(mask, dtype=torch.float64) / (1 - p)
        arrays = {"bottom.0": x, "top.0": top.detach().numpy()}
        if train:
            arrays["mask"] = mask
            dy = rng.standard_normal(shape)
            top.backward(cases.tensor(dy))
            arrays.update({"top_grad.0": dy, "bottom_grad.0": tx.grad.numpy()})
        cases.write(f"Dropout-{name}", dict(
            kind="layer", type="Dropout", options=dict(ratio=p), dtype="float64", train=train,
            propagate_down=[True], rng_seed=0,
            what="test mode: the identity" if not train else f"training, p = {p}, the stored mask"),
            arrays)


def losses(cases, rng):
    for name, shape, weight, dtype in (("2d", (4, 5), 0.5, "float64"),
                                       ("4d", (3, 4, 1, 1), 1.0, "float64"),
                                       ("f32", (4, 5), 2.0, "float32")):
        z = rng.standard_normal(shape) * 2
        labels = rng.integers(0, shape[1], shape[0]).astype(np.int32)
        cases.layer(f"SoftmaxWithLoss-{name}", "SoftmaxWithLoss", dict(loss_weight=weight),
                    [z, labels], dtype=dtype, propagate_down=[True, False],
                    what=f"loss_weight {weight} * cross_entropy (batch mean), logits {shape}")
    for name, shape, k, dtype in (("top1", (6, 4), 1, "float64"), ("top3", (6, 5), 3, "float64"),
                                  ("4d_f32", (5, 3, 1, 1), 2, "float32")):
        z = distinct(rng, shape, 0.25)
        labels = rng.integers(0, shape[1], shape[0]).astype(np.int32)
        cases.layer(f"Accuracy-{name}", "Accuracy", dict(top_k=k), [z, labels], dtype=dtype,
                    what=f"top-{k} hit rate (distinct logits: no ties)")


# --------------------------------------------------------------------------- whole nets

LENET_BN = [
    {"name": "conv1", "type": "Convolution", "bottom": "data", "top": "conv1", "num_output": 3,
     "kernel_size": 3, "pad": 1, "bias": False},
    {"name": "bn1", "type": "BatchNorm", "bottom": "conv1", "top": "bn1"},
    {"name": "relu1", "type": "ReLU", "bottom": "bn1", "top": "bn1"},
    {"name": "pool1", "type": "Pooling", "bottom": "bn1", "top": "pool1", "pool": "max",
     "kernel_size": 2, "stride": 2},
    {"name": "fc", "type": "InnerProduct", "bottom": "pool1", "top": "fc", "num_output": 4},
    {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["fc", "label"], "top": "loss"},
    {"name": "accuracy", "type": "Accuracy", "bottom": ["fc", "label"], "top": "accuracy"},
]

# A residual add (coefficients), a 1x1 branch joined by Concat, average pooling, Flatten: the
# gradient of b1 is the sum of three readers'.
RESIDUAL = [
    {"name": "conv1", "type": "Convolution", "bottom": "data", "top": "c1", "num_output": 3,
     "kernel_size": 3, "pad": 1, "bias": False},
    {"name": "bn1", "type": "BatchNorm", "bottom": "c1", "top": "b1", "momentum": 0.2},
    {"name": "relu1", "type": "ReLU", "bottom": "b1", "top": "b1"},
    {"name": "conv2", "type": "Convolution", "bottom": "b1", "top": "c2", "num_output": 3,
     "kernel_size": 3, "pad": 1},
    {"name": "add", "type": "Eltwise", "bottom": ["b1", "c2"], "top": "sum", "coeffs": [1.0, 0.5]},
    {"name": "relu2", "type": "ReLU", "bottom": "sum", "top": "sum"},
    {"name": "conv3", "type": "Convolution", "bottom": "b1", "top": "c3", "num_output": 2,
     "kernel_size": 1},
    {"name": "cat", "type": "Concat", "bottom": ["sum", "c3"], "top": "cat"},
    {"name": "pool", "type": "Pooling", "bottom": "cat", "top": "pool", "pool": "ave",
     "kernel_size": 2, "stride": 2},
    {"name": "flat", "type": "Flatten", "bottom": "pool", "top": "flat"},
    {"name": "fc", "type": "InnerProduct", "bottom": "flat", "top": "fc", "num_output": 3},
    {"name": "loss", "type": "SoftmaxWithLoss", "bottom": ["fc", "label"], "top": "loss"},
    {"name": "accuracy", "type": "Accuracy", "bottom": ["fc", "label"], "top": "accuracy"},
]

NETS = {"lenet_bn": (LENET_BN, (2, 1, 8, 8), 4), "residual": (RESIDUAL, (2, 2, 4, 4), 3)}
SOLVERS = {"sgd": dict(type="SGD", lr=0.1, momentum=0.9, weight_decay=1e-2),
           "adam": dict(type="Adam", lr=0.01, betas=[0.9, 0.999], eps=1e-8, weight_decay=1e-2)}
STEPS = 2   # the second step is where SGD's momentum and Adam's moments first matter


def net_params(spec_list, rng, shape):
    """Parameters by ``<layer>.<name>``, float32 values, the shapes minilms gives them."""
    params, blobs = {}, {"data": shape}
    for spec in spec_list:
        bottoms = spec["bottom"] if isinstance(spec["bottom"], list) else [spec["bottom"]]
        x = blobs[bottoms[0]]
        name, kind = spec["name"], spec["type"]
        if kind == "Convolution":
            k = spec["kernel_size"]
            params[f"{name}.weight"] = rng.standard_normal((spec["num_output"], x[1], k, k)) \
                * np.sqrt(2.0 / (x[1] * k * k))
            if spec.get("bias", True):
                params[f"{name}.bias"] = rng.standard_normal(spec["num_output"]) * 0.1
            pad = spec.get("pad", 0)
            out = (x[0], spec["num_output"], x[2] + 2 * pad - k + 1, x[3] + 2 * pad - k + 1)
        elif kind == "BatchNorm":
            c = x[1]
            params.update({f"{name}.weight": 1 + 0.2 * rng.standard_normal(c),
                           f"{name}.bias": 0.1 * rng.standard_normal(c),
                           f"{name}.running_mean": np.zeros(c), f"{name}.running_var": np.ones(c)})
            out = x
        elif kind == "InnerProduct":
            k = int(np.prod(x[1:]))
            params[f"{name}.weight"] = rng.standard_normal((spec["num_output"], k)) / np.sqrt(k)
            params[f"{name}.bias"] = rng.standard_normal(spec["num_output"]) * 0.1
            out = (x[0], spec["num_output"])
        elif kind == "Pooling":
            s = spec["stride"]
            out = (x[0], x[1], x[2] // s, x[3] // s)
        elif kind == "Concat":
            out = (x[0], sum(blobs[b][1] for b in bottoms), *x[2:])
        elif kind == "Flatten":
            out = (x[0], int(np.prod(x[1:])))
        else:
            out = x
        blobs[spec["top"]] = out
    return {k: v.astype(np.float32) for k, v in params.items()}


def pool_gap(torch, x, kernel, stride):
    """Least gap between a max-pooling window's largest value and its runner-up. A window of
    exact zeros (all of it taken by a ReLU before) is a tie that cannot matter: ReLU's backward
    zeroes the gradient whichever zero receives it, and zeros stay exact in float32."""
    cols = torch.nn.functional.unfold(x.flatten(0, 1)[:, None], kernel, stride=stride)
    top2 = torch.topk(cols, 2, dim=1).values
    gap = torch.where(top2[:, 0] == 0, torch.inf, top2[:, 0] - top2[:, 1])
    return float(gap.min())


def torch_net(torch, spec_list, inputs, params):
    """Forward through the layer list in config order (an in-place top rebinds the name, which is
    what later readers of the blob see). Returns (loss, accuracy, least distance from a kink)."""
    blobs = {"data": inputs["data"], "label": inputs["label"]}
    margin, loss, accuracy = np.inf, None, None
    for spec in spec_list:
        bottoms = spec["bottom"] if isinstance(spec["bottom"], list) else [spec["bottom"]]
        options = {k: v for k, v in spec.items() if k not in ("name", "type", "bottom", "top")}
        mine = {k.split(".", 1)[1]: v for k, v in params.items()
                if k.split(".", 1)[0] == spec["name"]}
        xs = [blobs[b] for b in bottoms]
        if spec["type"] == "ReLU":
            margin = min(margin, float(xs[0].detach().abs().min()))
        if spec["type"] == "Pooling" and options["pool"] == "max":
            margin = min(margin, pool_gap(torch, xs[0].detach(), options["kernel_size"],
                                          options["stride"]))
        if spec["type"] == "Accuracy":
            z = xs[0].detach()
            label = z.gather(1, xs[1].long()[:, None])
            others = (z - label).abs() + torch.nn.functional.one_hot(xs[1].long(), z.shape[1])
            margin = min(margin, float(others.min()))
        top = torch_layer(torch, spec["type"], options, xs, mine)
        blobs[spec["top"]] = top
        if spec["type"] == "SoftmaxWithLoss":
            loss = top
        if spec["type"] == "Accuracy":
            accuracy = top
    return loss, accuracy, margin


def net_case(cases, name, solver_name, seed):
    """Train the net in PyTorch (float64) for STEPS steps from float32 values; retry with the next
    seed while any kink is nearer than MARGIN or (Adam) a gradient is nearer zero than 1e-5: float32
    rounding in minilms must not be able to take the other branch."""
    torch = cases.torch
    spec_list, shape, classes = NETS[name]
    solver = SOLVERS[solver_name]
    for attempt in range(seed, seed + 100):
        rng = np.random.default_rng(attempt)
        data = rng.standard_normal(shape).astype(np.float32)
        label = rng.integers(0, classes, shape[0]).astype(np.int32)
        params = net_params(spec_list, rng, shape)
        tensors = {k: cases.tensor(v, not k.endswith(("running_mean", "running_var")))
                   for k, v in params.items()}
        learnable = [t for t in tensors.values() if t.requires_grad]
        if solver["type"] == "SGD":
            optimizer = torch.optim.SGD(learnable, lr=solver["lr"], momentum=solver["momentum"],
                                        weight_decay=solver["weight_decay"])
        else:
            optimizer = torch.optim.Adam(learnable, lr=solver["lr"], betas=solver["betas"],
                                         eps=solver["eps"], weight_decay=solver["weight_decay"])
        inputs = {"data": cases.tensor(data), "label": torch.tensor(label)}
        arrays = {"input.data": data, "input.label": label}
        arrays.update({f"param.{k}": v for k, v in params.items()})
        losses, accuracies, margin = [], [], np.inf
        for step in range(1, STEPS + 1):
            optimizer.zero_grad()
            loss, accuracy, kink = torch_net(torch, spec_list, inputs, tensors)
            loss.sum().backward()
            margin = min(margin, kink)
            if solver["type"] == "Adam":
                margin = min(margin, 100 * min(float((t.grad + solver["weight_decay"] * t)
                                                     .detach().abs().min()) for t in learnable))
            optimizer.step()
            losses.append(float(loss.detach()))
            accuracies.append(float(accuracy.detach()))
            arrays.update({f"after{step}.{k}": t.detach().numpy().copy()
                           for k, t in tensors.items()})
        if margin >= MARGIN:
            break
    else:
        raise RuntimeError(f"{name}-{solver_name}: no seed in 100 keeps away from the kinks")
    arrays.update(loss=np.array(losses), accuracy=np.array(accuracies))
    cases.write(f"net-{name}-{solver_name}", dict(
        kind="net", layers=spec_list, solver=solver, steps=STEPS, seed=attempt,
        what=f"{name} net, {STEPS} {solver['type']} steps from float32 values"), arrays)


def main() -> int:
    try:
        import torch
    except ImportError:
        print("make_golden.py: PyTorch is not installed in this Python, and the fixtures are "
              "PyTorch's answers. Run it where torch is installed (pip install torch, or the "
              "'torch' extra): python scripts/make_golden.py", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    torch.set_num_threads(1)            # one reduction order: the same bits on every run
    torch.use_deterministic_algorithms(True)
    if GOLDEN.exists():
        shutil.rmtree(GOLDEN)            # a case removed here must not linger as a file
    GOLDEN.mkdir(parents=True)
    cases = Cases(torch)
    for seed, make in enumerate((convolution, inner_product, pooling, batch_norm, simple, dropout,
                                 losses)):
        cases.rng = np.random.default_rng(200 + seed)
        make(cases, np.random.default_rng(100 + seed))
    for i, (name, solver) in enumerate((n, s) for n in NETS for s in SOLVERS):
        net_case(cases, name, solver, seed=10 * i)
    total = sum(path.stat().st_size for path in cases.written)
    print(f"wrote {len(cases.written)} fixtures, {total / 1024:.1f} KiB, to "
          f"{GOLDEN.relative_to(ROOT)}/ (PyTorch {torch.__version__})")
    if total > BUDGET:
        print(f"make_golden.py: {total} bytes exceed the {BUDGET}-byte budget", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
