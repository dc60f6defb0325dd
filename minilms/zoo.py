"""The model zoo: layer lists for LeNet, ResNet-18/34/50/101/152, GoogLeNet, the
pre-activation ResNet-1001 (for CIFAR-sized images) and a plain chain of conv-BN-ReLU blocks.

Each function returns the ``model.layers`` list a config would hold, ending in a SoftmaxWithLoss
named ``loss`` and an Accuracy named ``accuracy`` over the inputs ``data`` and ``label``. ``width``
divides every channel count (at least 1 channel stays), so the same topology can be trained at
toy size under the CUDA simulator or studied at full size by the planner.

GoogLeNet is torchvision's: every convolution is followed by BatchNorm, so no LRN, and its 5x5
branch really is 5x5 (as in the paper).
"""


class _Builder:
    def __init__(self, width: int):
        self.width, self.layers = max(1, int(width)), []

    def channels(self, c: int) -> int:
        return max(1, c // self.width)

    def add(self, name, type_, bottom, top=None, **options):
        self.layers.append({"name": name, "type": type_, "bottom": bottom, "top": top or name,
                            **options})
        return top or name

    def conv_bn(self, name, bottom, out, kernel, stride=1, pad=0, relu=True, top=None):
        """Convolution, BatchNorm (its top ``top``, default its own name) and, with ``relu``,
        an in-place ReLU."""
        conv = self.add(name, "Convolution", bottom, num_output=self.channels(out),
                        kernel_size=kernel, stride=stride, pad=pad, bias=False)
        top = self.add(f"{name}_bn", "BatchNorm", conv, top=top)
        if relu:
            self.layers.append({"name": f"{name}_relu", "type": "ReLU", "bottom": top, "top": top})
        return top

    def head(self, bottom, num_classes, dropout=0.0):
        top = self.add("pool_final", "Pooling", bottom, pool="ave", global_pooling=True)
        if dropout:
            top = self.add("dropout", "Dropout", top, ratio=dropout)
        top = self.add("fc", "InnerProduct", top, num_output=num_classes)
        self.layers.append({"name": "loss", "type": "SoftmaxWithLoss", "bottom": [top, "label"],
                            "top": "loss"})
        self.layers.append({"name": "accuracy", "type": "Accuracy", "bottom": [top, "label"],
                            "top": "accuracy"})
        return self.layers


def lenet(num_classes: int = 10) -> list:
    """Caffe's LeNet for 28x28 MNIST: conv 20@5x5, max pool, conv 50@5x5, max pool, fc 500, fc."""
    b = _Builder(1)
    top = b.add("conv1", "Convolution", "data", num_output=20, kernel_size=5)
    top = b.add("pool1", "Pooling", top, pool="max", kernel_size=2, stride=2)
    top = b.add("conv2", "Convolution", top, num_output=50, kernel_size=5)
    top = b.add("pool2", "Pooling", top, pool="max", kernel_size=2, stride=2)
    top = b.add("ip1", "InnerProduct", top, num_output=500)
    b.layers.append({"name": "relu1", "type": "ReLU", "bottom": top, "top": top})
    top = b.add("ip2", "InnerProduct", top, num_output=num_classes)
    b.layers.append({"name": "loss", "type": "SoftmaxWithLoss", "bottom": [top, "label"],
                     "top": "loss"})
    b.layers.append({"name": "accuracy", "type": "Accuracy", "bottom": [top, "label"],
                     "top": "accuracy"})
    return b.layers


RESNET_BLOCKS = {18: ("basic", (2, 2, 2, 2)), 34: ("basic", (3, 4, 6, 3)),
                 50: ("bottleneck", (3, 4, 6, 3)), 101: ("bottleneck", (3, 4, 23, 3)),
                 152: ("bottleneck", (3, 8, 36, 3))}


def resnet(depth: int = 18, num_classes: int = 1000, width: int = 1,
           in_place_adds: bool = True) -> list:
    """He et al.'s ResNet (v1.5: stride in the 3x3 of a bottleneck), for 224x224 ImageNet images;
    any input of at least 32x32 works. Each block's add works in place over its branch's last
    BatchNorm output, as torchvision's ``out += identity`` (``in_place_adds=False``: a top of its
    own, as Caffe's prototxts write it; the same numbers)."""
    if depth not in RESNET_BLOCKS:
        raise ValueError(f"ResNet depth must be one of {sorted(RESNET_BLOCKS)}, found {depth}")
    kind, counts = RESNET_BLOCKS[depth]
    b = _Builder(width)
    top = b.conv_bn("conv1", "data", 64, 7, stride=2, pad=3)
    top = b.add("pool1", "Pooling", top, pool="max", kernel_size=3, stride=2, pad=1)
    in_channels = 64
    for stage, count in enumerate(counts):
        planes = 64 * 2 ** stage
        out = planes * (4 if kind == "bottleneck" else 1)
        for block in range(count):
            name = f"res{stage + 2}{chr(ord('a') + block) if count <= 26 else block}"
            stride = 2 if stage > 0 and block == 0 else 1
            shortcut = top
            if stride != 1 or in_channels != out:
                shortcut = b.conv_bn(f"{name}_proj", top, out, 1, stride=stride, relu=False)
            # in place, the branch's last BatchNorm writes the block's blob and the add sums
            # into it: one blob a block fewer, and one pass less over fresh memory each way
            # (docs/lms.md, "Residual adds in place")
            branch = name if in_place_adds else None
            if kind == "basic":
                x = b.conv_bn(f"{name}_1", top, planes, 3, stride=stride, pad=1)
                x = b.conv_bn(f"{name}_2", x, planes, 3, pad=1, relu=False, top=branch)
            else:
                x = b.conv_bn(f"{name}_1", top, planes, 1)
                x = b.conv_bn(f"{name}_2", x, planes, 3, stride=stride, pad=1)
                x = b.conv_bn(f"{name}_3", x, out, 1, relu=False, top=branch)
            top = b.add(name, "Eltwise", [shortcut, x], branch)
            b.layers.append({"name": f"{name}_relu", "type": "ReLU", "bottom": top, "top": top})
            in_channels = out
    return b.head(top, num_classes)


def preact_resnet(depth: int = 1001, num_classes: int = 10, width: int = 1,
                  in_place_adds: bool = True) -> list:
    """He et al.'s pre-activation ResNet for 32x32 CIFAR images ("Identity Mappings in Deep
    Residual Networks", 2016; their released resnet-pre-act.lua): a 3x3 convolution to 16
    channels, then three stages of ``(depth - 2) / 9`` bottleneck units (111 for ResNet-1001)
    of widths 16, 32 and 64 (outputs 64, 128 and 256, at 32x32, 16x16 and 8x8), then BN, ReLU,
    global average pooling and the classifier. A unit is BN-ReLU-conv1x1, BN-ReLU-conv3x3,
    BN-ReLU-conv1x1 added to its input unchanged; the first unit of a stage changes the width
    (and, from the second stage, halves the size in its first 1x1), so its BN-ReLU comes first
    and feeds both its convolutions and a 1x1 projection shortcut. Convolutions have no bias
    (BN follows each): ResNet-1001 has the paper's 10.2M convolution weights (10.3M learnable
    parameters with BN's scales and shifts and the classifier). The adds work in place over the
    last convolution's output, as in ``resnet``.

    Deep on purpose: 3,340 layers and 8,683 steps of small blobs, the planner's test of depth."""
    if depth < 11 or (depth - 2) % 9:
        raise ValueError(f"pre-activation ResNet depth must be 9n + 2 (164, 1001), found {depth}")
    units = (depth - 2) // 9
    b = _Builder(width)

    def bn_relu(name, bottom):
        top = b.add(name, "BatchNorm", bottom)
        b.layers.append({"name": f"{name}_relu", "type": "ReLU", "bottom": top, "top": top})
        return top

    def conv(name, bottom, out, kernel, stride=1, top=None):
        return b.add(name, "Convolution", bottom, top, num_output=b.channels(out),
                     kernel_size=kernel, stride=stride, pad=kernel // 2, bias=False)

    top = conv("conv1", "data", 16, 3)
    in_channels = 16
    for stage, out in enumerate((64, 128, 256)):
        planes = out // 4
        for unit in range(units):
            name = f"res{stage + 2}_{unit + 1}"
            stride = 2 if stage > 0 and unit == 0 else 1
            x = bn_relu(f"{name}_bn1", top)
            shortcut = top if in_channels == out else conv(f"{name}_proj", x, out, 1, stride)
            x = conv(f"{name}_1", x, planes, 1, stride)
            x = conv(f"{name}_2", bn_relu(f"{name}_bn2", x), planes, 3)
            branch = name if in_place_adds else None
            x = conv(f"{name}_3", bn_relu(f"{name}_bn3", x), out, 1, top=branch)
            top = b.add(name, "Eltwise", [shortcut, x], branch)
            in_channels = out
    return b.head(bn_relu("post_bn", top), num_classes)


def chain(depth: int = 64, num_classes: int = 10, width: int = 1, channels: int = 16) -> list:
    """``depth`` plain blocks of 3x3 convolution, BatchNorm and ReLU, at one resolution: the deep
    chain on which Chen et al. (2016) show that keeping one activation in every sqrt(N) and
    recomputing the rest holds O(sqrt(N)) of them for one extra forward."""
    b, top = _Builder(width), "data"
    for i in range(1, depth + 1):
        top = b.conv_bn(f"block{i}", top, channels, 3, pad=1)
    return b.head(top, num_classes)


# (1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool projection) per inception block
INCEPTION = {"3a": (64, 96, 128, 16, 32, 32), "3b": (128, 128, 192, 32, 96, 64),
             "4a": (192, 96, 208, 16, 48, 64), "4b": (160, 112, 224, 24, 64, 64),
             "4c": (128, 128, 256, 24, 64, 64), "4d": (112, 144, 288, 32, 64, 64),
             "4e": (256, 160, 320, 32, 128, 128), "5a": (256, 160, 320, 32, 128, 128),
             "5b": (384, 192, 384, 48, 128, 128)}


def googlenet(num_classes: int = 1000, width: int = 1) -> list:
    """Szegedy et al.'s GoogLeNet (Inception v1) with BatchNorm, for 224x224 images (the TF LMS
    document trains it at 2240x2240)."""
    b = _Builder(width)
    top = b.conv_bn("conv1", "data", 64, 7, stride=2, pad=3)
    top = b.add("pool1", "Pooling", top, pool="max", kernel_size=3, stride=2, ceil_mode=True)
    top = b.conv_bn("conv2", top, 64, 1)
    top = b.conv_bn("conv3", top, 192, 3, pad=1)
    top = b.add("pool2", "Pooling", top, pool="max", kernel_size=3, stride=2, ceil_mode=True)
    for name, (c1, c3r, c3, c5r, c5, pp) in INCEPTION.items():
        if name in ("4a", "5a"):
            top = b.add(f"pool_{name}", "Pooling", top, pool="max", kernel_size=3, stride=2,
                        ceil_mode=True)
        branches = [b.conv_bn(f"inc{name}_1x1", top, c1, 1),
                    b.conv_bn(f"inc{name}_3x3", b.conv_bn(f"inc{name}_3x3r", top, c3r, 1), c3, 3,
                              pad=1),
                    b.conv_bn(f"inc{name}_5x5", b.conv_bn(f"inc{name}_5x5r", top, c5r, 1), c5, 5,
                              pad=2),
                    b.conv_bn(f"inc{name}_pp", b.add(f"inc{name}_pool", "Pooling", top, pool="max",
                                                     kernel_size=3, stride=1, pad=1), pp, 1)]
        top = b.add(f"inc{name}", "Concat", branches)
    return b.head(top, num_classes, dropout=0.2)


MODELS = {"lenet": lenet, "resnet18": lambda **kw: resnet(18, **kw),
          "resnet34": lambda **kw: resnet(34, **kw), "resnet50": lambda **kw: resnet(50, **kw),
          "resnet101": lambda **kw: resnet(101, **kw), "resnet152": lambda **kw: resnet(152, **kw),
          "googlenet": googlenet, "resnet1001": lambda **kw: preact_resnet(1001, **kw),
          "chain64": chain}
