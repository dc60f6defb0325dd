"""Configs: defaults, every check, locations (FILE:LINE:COL), overrides, round trips, and a corpus
of bad configs (``tests/config_cases/bad``) whose one-line messages are pinned word for word.

A corpus file starts with ``# expect: {file}:LINE:COL: message``; ``{file}`` stands for its path,
``{datasets}`` for the registered dataset formats (so a new format needs no edit here). Add a file
there to add a case. A case is refused when it loads or, failing that, when its net is built (a
layer's option or shape), the line the commands print either way.
"""
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from minilms.config import ConfigDumper, config_error_line, load_config
from minilms.config.build import build_net
from minilms.config.schema import SCHEMA, Section
from minilms.datasets import DATASETS
from minilms.errors import ConfigError

CASES = Path(__file__).parent / "config_cases"
BAD = sorted((CASES / "bad").glob("*.yaml"))
GOOD = sorted((CASES / "good").glob("*.yaml"))
ZOO = "model:\n  zoo: lenet\n"


def write(tmp_path, text: str, name: str = "quick.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def error_of(path, overrides=()) -> str:
    with pytest.raises(ConfigError) as error:
        load_config(path, overrides)
    message = str(error.value)
    assert "\n" not in message
    return message


def leaf_paths(section: Section, prefix: str = "") -> set:
    paths = set()
    for key, spec in section.fields.items():
        path = f"{prefix}.{key}" if prefix else key
        paths |= leaf_paths(spec, path) if isinstance(spec, Section) else {path}
    return paths


# ---- defaults, access ---------------------------------------------------------------------------

def test_a_minimal_config_gets_every_default(tmp_path):
    config = load_config(write(tmp_path, ZOO))
    assert config.to_dict() == {
        "name": "quick", "seed": 0, "run_dir": None, "init_weights": None, "trace": False,
        "model": {"zoo": "lenet", "options": {"num_classes": None, "width": 1}, "layers": None,
                  "fuse": "auto"},
        "data": {"dataset": "shapes", "root": None, "image_size": 32, "channels": 3,
                 "num_classes": None, "train_size": 2000, "val_size": 500, "batch_size": 32,
                 "augment": {"crop_padding": 0, "flip": False, "normalize": True}, "prefetch": 2},
        "device": {"kind": "auto", "memory": "auto", "link": None},
        "lms": {"enabled": True, "policy": "auto", "min_swap_bytes": 0, "limit": None,
                "start_fraction": 0.0, "prefetch": 0, "keep_state": False, "split": "auto",
                "recompute": "off", "write_back": "lazy"},
        "solver": {"type": "sgd", "lr": 0.01, "momentum": 0.9, "nesterov": False,
                   "weight_decay": 0.0, "betas": [0.9, 0.999], "eps": 1e-8,
                   "schedule": {"type": "constant", "step_size": None, "gamma": 0.1,
                                "milestones": [], "warmup_iters": 0, "min_lr": 0.0}},
        "distributed": {"lr_scaling": "none", "timeout": 300.0, "overlap": True},
        "train": {"epochs": 1, "max_iters": None, "eval_every": 1, "checkpoint_every": 1,
                  "log_every": 10, "keep_checkpoints": 3, "on_nonfinite_loss": "stop"},
    }


def test_empty_sections_mean_all_defaults(tmp_path):
    config = load_config(write(tmp_path, ZOO + "solver:\ndata:\n  augment:\n"))
    assert config.solver.lr == 0.01 and config.data.augment.normalize is True


def test_attribute_and_key_access_agree_and_the_config_is_read_only(tmp_path):
    config = load_config(write(tmp_path, ZOO + "solver:\n  betas: [0.8, 0.9]\n"))
    assert config.solver.lr == config["solver"]["lr"] == config.solver["lr"]
    assert config.data.augment.flip is config["data"]["augment"]["flip"] is False
    assert list(config) == list(SCHEMA.fields) and len(config.solver.schedule) == 6
    config.solver.betas.append(1.0)                 # a copy: the config itself does not change
    assert config.solver.betas == [0.8, 0.9]
    with pytest.raises(TypeError):
        config["seed"] = 3
    with pytest.raises(AttributeError, match="solver has no key 'lrr'; did you mean 'lr'"):
        config.solver.lrr


def test_sections_spell_out_what_they_are_for():
    sections = [SCHEMA]
    while sections:
        section = sections.pop()
        assert len(section.doc.split()) >= 5
        sections += [spec for spec in section.fields.values() if isinstance(spec, Section)]


# ---- values -------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, number", [("1e-3", 1e-3), ("5e4", 5e4), ("-2E-5", -2e-5),
                                          ("1.0e5", 1e5), ("+1e-7", 1e-7), (".5e1", 5.0)])
def test_exponents_without_a_dot_are_floats(tmp_path, text, number):
    config = load_config(write(tmp_path, ZOO.replace("zoo: lenet", "layers:\n    - {name: a, type: "
                                                     f"ReLU, slope: {text}}}")))
    assert config.model.layers[0]["slope"] == number and type(number) is float
    assert yaml.safe_load(f"x: {text}")["x"] == text        # yaml's own loader is left alone


def test_exponent_floats_where_numbers_are_expected(tmp_path):
    config = load_config(write(tmp_path, ZOO + "solver:\n  lr: 1e-3\n  weight_decay: 5E-4\n"
                                              "  eps: 1e-7\ntrain:\n  max_iters: 5e4\n"))
    assert (config.solver.lr, config.solver.weight_decay, config.solver.eps) == (1e-3, 5e-4, 1e-7)
    assert config.train.max_iters == 50000 and type(config.train.max_iters) is int


def test_sizes_are_kept_as_written_and_choices_are_lower_case(tmp_path):
    config = load_config(write(tmp_path, ZOO + "device:\n  kind: CPU\n  memory: 1e9\n  link: 12.5\n"
                                              "lms:\n  min_swap_bytes: 64KiB\n  limit: 512MiB\n"
                                              "solver:\n  type: Adam\n"))
    assert config.device.memory == 1e9 and config.lms.limit == "512MiB"
    assert config.lms.min_swap_bytes == "64KiB" and config.device.link == 12.5
    assert (config.device.kind, config.solver.type) == ("cpu", "adam")


def test_dates_and_yes_no_read_as_people_mean_them(tmp_path):
    config = load_config(write(tmp_path, "name: 2024-01-01\n" + ZOO + "data:\n  augment:\n"
                                                                   "    flip: yes\n"))
    assert config.name == "2024-01-01" and config.data.augment.flip is True


# Every leaf of the schema, with a value it rejects: (key path, YAML value, expected, found).
TYPE_CASES = [
    ("name", "12", "a non-empty name without '/' (it names the run's folder), or null", "12"),
    ("seed", "1.5", "an integer >= 0", "1.5"),
    ("run_dir", "3", "a non-empty string, or null", "3"),
    ("init_weights", "true", "a non-empty string, or null", "True"),
    ("trace", "1", "true or false", "1"),
    ("model.zoo", "vgg", "one of lenet, resnet18, resnet34, resnet50, resnet101, resnet152, "
     "googlenet, resnet1001, chain64, or null", "'vgg'"),
    ("model.options.num_classes", "1", "an integer >= 2, or null", "1"),
    ("model.fuse", "maybe", "one of auto, all, none", "'maybe'"),
    ("model.options.width", "0", "an integer >= 1", "0"),
    ("model.layers", "5", "a non-empty list of layers, each a mapping with a name and a type, "
     "or null", "5"),
    ("data.dataset", "7", f"one of {', '.join(DATASETS)}", "7"),
    ("data.root", "false", "a non-empty string, or null", "False"),
    ("data.image_size", "0", "an integer >= 1", "0"),
    ("data.channels", "rgb", "1 or 3", "'rgb'"),
    ("data.num_classes", "1", "an integer >= 2, or null", "1"),
    ("data.train_size", "0", "an integer >= 1", "0"),
    ("data.val_size", "-1", "an integer >= 0", "-1"),
    ("data.batch_size", "big", "an integer >= 1", "'big'"),
    ("data.augment.crop_padding", "-2", "an integer >= 0", "-2"),
    ("data.augment.flip", "sometimes", "true or false", "'sometimes'"),
    ("data.augment.normalize", "0", "true or false", "0"),
    ("data.prefetch", "-1", "an integer >= 0", "-1"),
    ("device.kind", "gpu", "one of auto, cpu, cuda", "'gpu'"),
    ("device.memory", "0", "a size like '512MiB', '2GiB' or '1048576', or 'auto'", "0"),
    ("device.link", "0", "null, one of pcie3, pcie4, pcie5, nvlink2, or a bandwidth in GB/s > 0",
     "0"),
    ("lms.enabled", "2", "true or false", "2"),
    ("lms.policy", "fastest", "auto or manual", "'fastest'"),
    ("lms.min_swap_bytes", "12 parsecs", "a size like '512MiB', '2GiB' or '1048576', or 0",
     "'12 parsecs'"),
    ("lms.limit", "auto", "a size like '512MiB', '2GiB' or '1048576', or null", "'auto'"),
    ("lms.start_fraction", "-0.1", "a number in [0, 1]", "-0.1"),
    ("lms.prefetch", "0.5", "an integer >= 0", "0.5"),
    ("lms.keep_state", "sometimes", "true or false", "'sometimes'"),
    ("lms.split", 0, "auto, off, or a chunk count >= 1", "0"),
    ("lms.recompute", 3, "auto, off, or a list of layer types", "3"),
    ("lms.write_back", "sometimes", "lazy or early", "'sometimes'"),
    ("solver.type", "rmsprop", "sgd or adam", "'rmsprop'"),
    ("solver.lr", "0", "a number > 0", "0"),
    ("solver.momentum", "-0.9", "a number >= 0", "-0.9"),
    ("solver.nesterov", "yes please", "true or false", "'yes please'"),
    ("solver.weight_decay", "-1e-4", "a number >= 0", "-0.0001"),
    ("solver.betas", "0.9", "a pair of numbers in [0, 1), like [0.9, 0.999]", "0.9"),
    ("solver.eps", "0", "a number > 0", "0"),
    ("solver.schedule.type", "exponential", "one of constant, step, multistep, cosine",
     "'exponential'"),
    ("solver.schedule.step_size", "0", "an integer >= 1, or null", "0"),
    ("solver.schedule.gamma", "0", "a number > 0", "0"),
    ("solver.schedule.milestones", "10", "a list of increasing integers >= 1 (iterations)", "10"),
    ("solver.schedule.warmup_iters", "-5", "an integer >= 0", "-5"),
    ("solver.schedule.min_lr", "-1", "a number >= 0", "-1"),
    ("distributed.lr_scaling", "sqrt", "none or linear", "'sqrt'"),
    ("distributed.timeout", "0", "a number > 0", "0"),
    ("distributed.overlap", "maybe", "true or false", "'maybe'"),
    ("train.epochs", "0", "an integer >= 1, or null", "0"),
    ("train.max_iters", "1.5", "an integer >= 1, or null", "1.5"),
    ("train.eval_every", "daily", "an integer >= 0", "'daily'"),
    ("train.checkpoint_every", "-1", "an integer >= 0", "-1"),
    ("train.log_every", "0", "an integer >= 1", "0"),
    ("train.keep_checkpoints", "0", "an integer >= 1", "0"),
    ("train.on_nonfinite_loss", "ignore", "stop or continue", "'ignore'"),
]


def test_every_setting_has_a_type_case():
    assert {case[0] for case in TYPE_CASES} == leaf_paths(SCHEMA)


@pytest.mark.parametrize("key, value, expected, found", TYPE_CASES, ids=[c[0] for c in TYPE_CASES])
def test_every_type_check_names_expected_and_found_at_the_value(tmp_path, key, value, expected,
                                                                 found):
    *sections, last = key.split(".")
    lines = [f"{'  ' * depth}{section}:" for depth, section in enumerate(sections)]
    lines.append(f"{'  ' * len(sections)}{last}: {value}")
    line, column = len(lines), 2 * len(sections) + len(last) + 3
    path = write(tmp_path, "\n".join(lines) + "\n" + ("" if key.startswith("model.") else ZOO))
    message = error_of(path)
    assert message.startswith(f"{path}:{line}:{column}: {key}: expected {expected}, found {found}")


# ---- unknown keys, locations --------------------------------------------------------------------

@pytest.mark.parametrize("text, location, key, meant", [
    ("sovler:\n  lr: 0.1\n", "1:1", "sovler", "solver"),
    ("solver:\n  lrr: 0.1\n", "2:3", "solver.lrr", "lr"),
    ("solver:\n  schedule:\n    gama: 0.5\n", "3:5", "solver.schedule.gama", "gamma"),
    ("data:\n  augment:\n    flpi: true\n", "3:5", "data.augment.flpi", "flip"),
    ("model:\n  zoo: resnet18\n  option:\n    width: 2\n", "3:3", "model.option", "options"),
])
def test_misspelt_keys_at_every_depth(tmp_path, text, location, key, meant):
    path = write(tmp_path, text + ("" if text.startswith("model") else ZOO))
    assert error_of(path) == f"{path}:{location}: {key}: unknown key; did you mean {meant!r}?"


WHERE = """\
name: where
model:
  layers:
    - name: conv1
      type: Convolution
      num_output: 8
    - {name: relu1, type: ReLU}
solver:
  lr: 1e-3
  schedule:
    milestones: [10, 20]
"""


@pytest.mark.parametrize("key, location", [
    ("name", "1:1"), ("model", "2:1"), ("model.layers", "3:3"), ("model.layers[0]", "4:7"),
    ("model.layers[0].num_output", "6:7"), ("model.layers[1]", "7:7"),
    ("model.layers[1].name", "7:8"), ("solver.lr", "9:3"),
    ("solver.schedule.milestones[1]", "11:22"),
    ("model.layers[1].num_output", "7:7"),   # not in the config: the nearest key above it
    ("model.layers[1].bottom[0]", "7:7"),
])
def test_where_gives_the_line_and_column_of_a_key(tmp_path, key, location):
    path = write(tmp_path, WHERE)
    assert load_config(path).where(key) == f"{path}:{location}"


def test_where_gives_just_the_file_for_defaults_and_overrides(tmp_path):
    path = write(tmp_path, WHERE)
    config = load_config(path, ["solver.lr=0.1", "model.layers[0].num_output=4"])
    for key in ("solver.lr", "solver.momentum", "data", "data.augment.flip",
                "model.layers[0].num_output", "not a key path", ""):
        assert config.where(key) == str(path), key
    assert config.solver.where("schedule.milestones[0]") == f"{path}:11:18"
    assert config.model.where("layers[0]") == f"{path}:4:7"
    assert config.locations["solver.schedule.milestones[1]"] == (11, 22)
    assert "solver.lr" not in config.locations          # the override replaced what was written


def test_config_error_line_locates_later_errors(tmp_path):
    path = write(tmp_path, WHERE)
    config = load_config(path, ["train.max_iters=3"])
    line = config_error_line(ConfigError("model.layers[0].num_output", "an integer >= 1", "eight"),
                             config)
    assert line == (f"{path}:6:19: model.layers[0].num_output: expected an integer >= 1, "
                    "found 'eight'")
    assert config_error_line(ConfigError("layer relu1.top", "a new blob", "x"), config) \
        == f"{path}: layer relu1.top: expected a new blob, found 'x'"
    assert config_error_line(ConfigError("train.max_iters", "fewer", 3), config) \
        == "override train.max_iters=3: train.max_iters: expected fewer, found 3"
    already = ConfigError("solver.lr", "less", 1.0, source="other.yaml:1:1")
    assert config_error_line(already, config) == str(already)
    assert config_error_line(RuntimeError("two\nlines"), config) == "two lines"


def test_net_builder_errors_are_located_in_the_file(tmp_path):
    from minilms.net import Net
    path = write(tmp_path, "model:\n  layers:\n    - {name: ip1, type: InnerProduct, bottom: data, "
                           "top: ip1, num_outptu: 10}\n")
    config = load_config(path)
    with pytest.raises(ConfigError) as error:
        Net(config.model.layers, {"data": ((2, 4), "float32")})
    line = config_error_line(error.value, config)
    assert line.startswith(f"{path}:3:75: model.layers[0] (ip1).num_outptu: expected an option of "
                           "InnerProduct") and line.endswith("did you mean 'num_output'?")


def test_merge_keys_and_anchors(tmp_path):
    path = write(tmp_path, "model:\n  layers:\n"
                           "    - &conv {name: c1, type: Convolution, num_output: 8}\n"
                           "    - {<<: *conv, name: c2}\n")
    config = load_config(path)
    assert config.model.layers[1] == {"name": "c2", "type": "Convolution", "num_output": 8}
    assert config.where("model.layers[1].num_output") == f"{path}:3:43"   # where it was written


def test_tags_never_build_objects(tmp_path):
    marker = tmp_path / "ran"
    for tag in ("!!python/object/apply:os.system", "!!python/object/apply:subprocess.call"):
        path = write(tmp_path, f"name: {tag} [[touch, '{marker}']]\n" + ZOO)
        assert "name: expected a plain YAML value (no tags)" in error_of(path)
    assert not marker.exists()


def test_aliases_that_explode_are_stopped(tmp_path):
    lines = ["a: &a [1, 2, 3, 4, 5, 6, 7, 8, 9]"]
    for level in "bcdefghij":
        previous = chr(ord(level) - 1)
        lines.append(f"{level}: &{level} [{', '.join(['*' + previous] * 9)}]")
    message = error_of(write(tmp_path, "\n".join(lines) + "\n"))
    assert "expected at most 100000 values, found more" in message


@pytest.mark.parametrize("content, found", [
    (b"", "found an empty file"),
    (b"  \n\n", "found an empty file"),
    (b"\xff\xfemodel: 1\n", "expected UTF-8 text, found byte 0xff at offset 0"),
    (b"model: {zoo: lenet}\nname: a\x00b\n", "2:8: expected valid YAML, found character #x0000"),
    (b"model:\n\tzoo: lenet\n", "2:1: expected valid YAML, found character '\\t' that cannot"),
    (b"solver:\n  betas: [0.9, 0.999\nmodel: {zoo: lenet}\n",
     "3:6: expected valid YAML (',' or ']'), found ':'"),
    (b"model: " + b"[" * 5000 + b"]" * 5000, "expected valid YAML nested a few hundred levels at "
                                                "most, found deeper nesting"),
    (b"just words\n", "expected a mapping of settings (model, data, solver, ...) at the top level, "
                      "found 'just words'"),
])
def test_files_that_are_not_configs(tmp_path, content, found):
    path = tmp_path / "odd.yaml"
    path.write_bytes(content)
    message = error_of(path)
    assert message.startswith(str(path)) and found in message


def test_missing_files_and_directories(tmp_path):
    assert error_of(tmp_path / "nope.yaml") == \
        f"{tmp_path / 'nope.yaml'}: expected a YAML config file, found no such file"
    assert error_of(tmp_path) == f"{tmp_path}: expected a YAML config file, found a directory"
    assert error_of("a\0b.yaml") == \
        "a\\x00b.yaml: expected a path to a YAML config file, found a path with a NUL character"


# ---- the corpus of bad configs ------------------------------------------------------------------

def test_the_corpus_is_big_enough():
    assert len(BAD) >= 30


def refusal(path) -> str:
    """The line a command prints for the config at ``path``: its load error or, if it loads,
    the net builder's, located in the file."""
    try:
        config = load_config(path)
    except ConfigError as error:
        return str(error)
    with pytest.raises(ConfigError) as error:
        build_net(config)
    return config_error_line(error.value, config)


@pytest.mark.parametrize("path", BAD, ids=[path.stem for path in BAD])
def test_bad_config_corpus(path):
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: {file}"), "a corpus file starts with its expected message"
    expected = first.removeprefix("# expect: ").replace("{file}", str(path))
    assert refusal(path) == expected.replace("{datasets}", ", ".join(DATASETS))


# ---- overrides ----------------------------------------------------------------------------------

@pytest.mark.parametrize("override, key, value", [
    ("train.max_iters=20", "train.max_iters", 20),
    ("lms.limit=2GiB", "lms.limit", "2GiB"),
    ("lms.limit=", "lms.limit", None),
    ("solver.lr=1e-3", "solver.lr", 1e-3),
    ("solver.lr = 5E-4", "solver.lr", 5e-4),
    ("model.zoo=resnet18", "model.zoo", "resnet18"),
    ("model.options.width=4", "model.options.width", 4),
    ("data.augment.flip=true", "data.augment.flip", True),
    ("solver.schedule.milestones=[10, 20]", "solver.schedule.milestones", [10, 20]),
    ("solver.betas[0]=0.5", "solver.betas", [0.5, 0.999]),
    ("data.augment={flip: true}", "data.augment", {"crop_padding": 0, "flip": True,
                                                   "normalize": True}),
    ("name=long=name", "name", "long=name"),
])
def test_overrides_at_every_depth(tmp_path, override, key, value):
    path = write(tmp_path, "model:\n  zoo: resnet34\ndata:\n  augment:\n    crop_padding: 4\n")
    resolved = load_config(path, [override])
    for part in key.split("."):
        resolved = resolved[part]
    assert resolved == value


def test_overrides_reach_into_layers_and_later_ones_win(tmp_path):
    path = write(tmp_path, WHERE)
    config = load_config(path, ["model.layers[0].num_output=16", "model.layers[1].slope=1e-2",
                                "solver.lr=0.5", "solver.lr=0.25"])
    assert config.model.layers[0]["num_output"] == 16 and config.model.layers[1]["slope"] == 0.01
    assert config.solver.lr == 0.25 and config.where("solver.lr") == str(path)


OVERRIDE_CASES = [
    ("train.max_itrs=20", "override train.max_itrs=20: unknown key; did you mean 'max_iters'?"),
    ("sovler.lr=0.1", "override sovler.lr=0.1: sovler: unknown key; did you mean 'solver'?"),
    ("solver.schedule.gama=0.5",
     "override solver.schedule.gama=0.5: unknown key; did you mean 'gamma'?"),
    ("data.augment.flp=true", "override data.augment.flp=true: unknown key; did you mean 'flip'?"),
    ("data.augment={flp: true}",
     "override data.augment={flp: true}: data.augment.flp: unknown key; did you mean 'flip'?"),
    ("solver.lr=fast", "override solver.lr=fast: solver.lr: expected a number > 0, found 'fast'"),
    ("solver.schedule.milestones=[10, x]", "override solver.schedule.milestones=[10, x]: "
     "solver.schedule.milestones[1]: expected an integer >= 1, found 'x'"),
    ("lms.limit=lots", "override lms.limit=lots: lms.limit: expected a size like '512MiB', '2GiB' "
     "or '1048576', or null, found 'lots'"),
    ("train.epochs=null", "override train.epochs=null: train.epochs: expected train.epochs or "
     "train.max_iters set (both null: the run never ends), found None"),
    ("train.max_iters", "override train.max_iters: expected key.path=value, like "
     "train.max_iters=20, found 'train.max_iters'"),
    ("=3", "override =3: expected key.path=value, like train.max_iters=20, found '=3'"),
    ("solver..lr=1", "override solver..lr=1: expected key.path=value, like train.max_iters=20, "
     "found 'solver..lr=1'"),
    ("solver.betas=[0.9", "override solver.betas=[0.9: expected valid YAML (',' or ']'), "
     "found '<stream end>'"),
    ("solver.lr=!!python/name:os.system", "override solver.lr=!!python/name:os.system: solver.lr: "
     "expected a plain YAML value (no tags), found !!python/name:os.system ''"),
    ("model.layers[0].num_output=10", "override model.layers[0].num_output=10: model.layers: "
     "expected a list with an item 0, found None"),
    ("solver.lr.x=1",
     "override solver.lr.x=1: solver.lr: expected a mapping with a key 'x', found 0.01"),
    ("solver[0]=1", "override solver[0]=1: solver: expected a key, not an index (keys: type, lr, "
     "momentum, nesterov, weight_decay, betas, eps, schedule), found 0"),
]


@pytest.mark.parametrize("override, message", OVERRIDE_CASES, ids=[c[0] for c in OVERRIDE_CASES])
def test_bad_overrides_name_the_override(tmp_path, override, message):
    assert error_of(write(tmp_path, ZOO), [override]) == message


def test_an_override_below_a_bad_section_reports_the_file(tmp_path):
    path = write(tmp_path, ZOO + "solver: 0.1\n")
    assert error_of(path, ["solver.lr=0.5"]) == \
        f"{path}:3:9: solver: expected a mapping of settings, found 0.1"


# ---- round trips --------------------------------------------------------------------------------

@pytest.mark.parametrize("source", GOOD + ["zoo-with-overrides"],
                         ids=lambda source: getattr(source, "stem", source))
def test_the_resolved_config_round_trips(tmp_path, source):
    if source == "zoo-with-overrides":
        config = load_config(write(tmp_path, ZOO), ["name='1e-3'", "solver.lr=1e-3",
                                                    "lms.limit=1e6", "init_weights='5e4'"])
    else:
        config = load_config(source)
    saved = write(tmp_path, config.to_yaml(), "saved.yaml")
    again = load_config(saved)
    assert again.to_dict() == config.to_dict() and again == config
    assert again.to_yaml().splitlines()[1:] == config.to_yaml().splitlines()[1:]


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12),
       lr=st.floats(min_value=1e-300, max_value=1e300))
def test_any_name_and_learning_rate_round_trip(tmp_path, name, lr):
    assume(name.strip() and "/" not in name and "\\" not in name)
    text = yaml.dump({"name": name, "model": {"zoo": "lenet"}}, Dumper=ConfigDumper)
    config = load_config(write(tmp_path, text), [f"solver.lr={lr!r}"])
    assert (config.name, config.solver.lr) == (name, lr)
    assert load_config(write(tmp_path, config.to_yaml(), "saved.yaml")) == config
