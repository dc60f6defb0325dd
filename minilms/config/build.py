"""From a resolved config to the objects it describes: the net (zoo model or layer list, its
input shapes and class count), the LMS policy, the pool size a device would get and the cost
model of the device kind. The commands and the trainer build everything through these."""
import numpy as np

from .. import zoo
from ..datasets.registry import DATASETS, OPTIONS, make_dataset
from ..device import parse_link, resolve_kind, resolve_memory
from ..device.cpu import host_memory_info
from ..fusion import first_that_plans, fusions_for
from ..lms.cost import CostModel
from ..lms.plan import Policy
from ..net import Net
from ..sizes import parse_size
from .load import load_config


def num_classes(config) -> int:
    given = config.model.options.num_classes or config.data.num_classes
    if given:
        return given
    # A format that declares its count is planned without its files; the others are counted.
    if DATASETS[config.data.dataset].num_classes is not None:
        return DATASETS[config.data.dataset].num_classes
    options = {k: config.data[k] for k in OPTIONS if k in config.data}
    return make_dataset(config.data.dataset, "train", **options).num_classes


def model_layers(config, classes: int) -> list:
    if config.model.layers is not None:
        return config.model.layers
    build = zoo.MODELS[config.model.zoo]
    options = {"num_classes": classes}
    if config.model.zoo != "lenet":
        options["width"] = config.model.options.width
    return build(**options)


def input_shapes(config, batch: int | None = None) -> dict:
    n = batch or config.data.batch_size
    size, channels = config.data.image_size, config.data.channels
    return {"data": ((n, channels, size, size), np.float32), "label": ((n,), np.int32)}


def build_net(config, batch: int | None = None, fuse: str | None = None) -> Net:
    """The config's net, fused as ``fuse`` says (default: the first of ``fusions``, the one a
    run tries first). Its errors name the config key to change: ``model.layers[3] (conv2)
    .stride`` for a listed layer; a zoo model's layers are not in the file, so theirs name
    ``model.zoo`` (``model.zoo (lenet): layer conv2: ...``), which ``config_error_line`` locates."""
    layers, shapes = model_layers(config, num_classes(config)), input_shapes(config, batch)
    kind = device_kind(config)
    fuse = fuse or fusions(config)[0]
    if config.model.layers is not None:
        return Net(layers, shapes, where="model.layers", device_kind=kind, fuse=fuse)
    return Net(layers, shapes, where=f"model.zoo ({config.model.zoo})", listed=False,
               device_kind=kind, fuse=fuse)


def fusions(config) -> tuple[str, ...]:
    """The fusions the config's net may run with, the one to try first first
    (``fusion.fusions_for``): with LMS on and ``model.fuse: auto``, the adds' ReLUs fused where
    the pool holds that net's plan; the last is the one the least pool is the least for."""
    return fusions_for(config.model.fuse, config.lms.enabled)


def planned_net(config, plan, policy: Policy | None = None, batch: int | None = None,
                built: Net | None = None):
    """``(net, plan(net, policy))`` for the first of the config's ``fusions`` whose net ``plan``
    (a plan, or an executor, made for that net under that policy) takes without a
    ``PlanError`` (``fusion.first_that_plans``: the nets fused further with steps unsplit).
    ``policy``: the config's (``lms_policy``) where None; ``built``: a net of the config the
    caller has already (of one fusion, this batch), taken where its fusion is tried."""
    def build(fuse):
        return built if built is not None and built.fuse == fuse else \
            build_net(config, batch, fuse)
    return first_that_plans(fusions(config), build, plan, policy or lms_policy(config))


def lms_policy(config) -> Policy:
    lms = config.lms
    limit = parse_size(lms.limit, "lms.limit") if lms.limit is not None else None
    swap = parse_size(lms.min_swap_bytes, "lms.min_swap_bytes") if lms.min_swap_bytes else 0
    return Policy(enabled=lms.enabled, policy=lms.policy, min_swap_bytes=swap, limit=limit,
                  start_fraction=lms.start_fraction, prefetch=lms.prefetch,
                  keep_state=lms.keep_state, split=lms.split,
                  recompute=lms.recompute if isinstance(lms.recompute, str)
                  else tuple(lms.recompute), write_back=lms.write_back)


def device_kind(config) -> str:
    return resolve_kind(config.device.kind)


def planned_capacity(config, need: int | None = None) -> int:
    """The pool bytes ``device.memory`` asks for, without allocating or checking it is free:
    planning a 16 GiB device works on any machine. ``auto`` plans for what a device made now
    would take (no more than ``need``, what the net needs with LMS off)."""
    memory = config.device.memory
    if isinstance(memory, str) and memory.strip().lower() == "auto":
        kind = device_kind(config)
        if kind == "cuda":
            from ..device.cuda import free_gpu_memory
            free = free_gpu_memory()
        else:
            free = host_memory_info()[0]
        return resolve_memory("auto", free, kind, need=need)
    return parse_size(memory, "device.memory")


def cost_model(config, link=None) -> CostModel:
    """The typical rates of the configured device kind, with its link model (or ``link``)."""
    return CostModel.for_device(device_kind(config), link or parse_link(config.device.link))


def load(path: str, overrides) -> object:
    return load_config(path, list(overrides))
