"""Issue 17, a hostile user's configs: each mistake is still one line naming the file and line
(or the override), what was expected and what was found, exit code 2, no traceback, nothing
written. Net build errors, blob lists, unclosed quotes, invisible characters, overrides YAML
reread, and paths that are not config files. (Located corpus cases: ``tests/config_cases/bad``.)
"""
import os
import socket
import threading
from pathlib import Path

import numpy as np
import pytest

from minilms.commands.common import run
from minilms.commands.train import main as train_main
from minilms.config import config_error_line, load_config
from minilms.config.build import build_net
from minilms.errors import ConfigError
from minilms.net import Net

QUICKSTART = Path(__file__).resolve().parent.parent / "configs" / "quickstart.yaml"
ZOO = "model:\n  zoo: lenet\n"
LAYERS = """\
model:
  layers:
    - {name: conv1, type: Convolution, bottom: data, top: conv1, num_output: 4, kernel_size: 3}
    - name: pool1
      type: Pooling
      bottom: conv1
      top: pool1
      pool: max
      kernel_size: 2
    - {name: fc, type: InnerProduct, bottom: pool1, top: fc, num_output: 4}
    - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss}
"""


def write(tmp_path, text: str, name: str = "x.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def command(capsys, *argv) -> tuple[int, str]:
    """Exit code and stderr of ``python -m minilms.train ARGV``, run in this process."""
    code = run(train_main, [str(arg) for arg in argv])
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") <= 1, err
    return code, err.removeprefix("error: ").rstrip("\n")


def net_error(path, overrides=()) -> str:
    config = load_config(path, overrides)
    with pytest.raises(ConfigError) as error:
        build_net(config)
    return config_error_line(error.value, config)


# ---- 1. a layer's complaint names the config key and its line ----------------------------------

@pytest.mark.parametrize("written, instead, message", [
    ("pool: max", "pool: maxx", "8:13: model.layers[1] (pool1).pool: expected 'max' or 'ave' "
     "(or 'avg'), found 'maxx'"),
    ("kernel_size: 2", "kernel_size: 2.5", "9:20: model.layers[1] (pool1).kernel_size: "
     "expected an int >= 1 or an (h, w) pair of them, found 2.5"),
    ("kernel_size: 2", "kernel_size: 2\n      stride: 0", "10:15: model.layers[1] (pool1)"
     ".stride: expected an int >= 1 or an (h, w) pair of them, found 0"),
    ("kernel_size: 2", "kernel_size: 40", "4:7: model.layers[1] (pool1): bottom 0 (conv1): "
     "expected H + 2*pad >= kernel_size 40, found (32, 4, 30, 30)"),
    ("bottom: conv1\n", "bottom: [conv1, conv1]\n", "6:7: model.layers[1] (pool1).bottom: "
     "expected 1 bottom blob(s), found 2"),
    ("top: pool1", "top: []", "7:7: model.layers[1] (pool1).top: expected 1 top blob(s), "
     "found 0"),
])
def test_layer_errors_point_at_the_option_or_the_layer_in_the_file(tmp_path, written, instead,
                                                                   message):
    assert LAYERS.count("      " + written) == 1
    path = write(tmp_path, LAYERS.replace("      " + written, "      " + instead))
    assert net_error(path) == f"{path}:{message}"


def test_an_option_set_by_an_override_names_the_override(capsys):
    code, err = command(capsys, QUICKSTART, "model.layers[4].stride=0", "--dry-run")
    assert (code, err) == (2, "override model.layers[4].stride=0: model.layers[4] (conv2).stride: "
                              "expected an integer >= 1 or a pair [h, w] of them, found 0")


def test_the_command_locates_a_layer_error_and_writes_nothing(tmp_path, capsys):
    path = write(tmp_path, QUICKSTART.read_text().replace("pool: max, kernel_size: 2, stride: 2}",
                                                          "pool: maxx, kernel_size: 2}", 1))
    run_dir = tmp_path / "run"
    code, err = command(capsys, path, f"run_dir={run_dir}", "train.max_iters=1", "--quiet")
    assert (code, err) == (2, f"{path}:17:67: model.layers[3] (pool1).pool: expected 'max' or "
                              "'ave' (or 'avg'), found 'maxx'")
    assert not run_dir.exists()


def test_a_zoo_models_layer_errors_name_model_zoo(tmp_path):
    path = write(tmp_path, ZOO + "data:\n  image_size: 4\n")
    assert net_error(path) == (f"{path}:2:8: model.zoo (lenet): layer conv1: bottom 0 (data): "
                               "expected an input of at least 5x5 with pad 0x0 (kernel 5x5, "
                               "dilation 1x1), found (32, 3, 4, 4)")


def test_layer_keys_still_name_the_layer_for_a_net_built_from_code():
    with pytest.raises(ConfigError, match=r"^model.layers\[0\] \(c\).stride: expected an integer "
                                          r">= 1 or a pair \[h, w\] of them, found 0$"):
        Net([{"name": "c", "type": "Convolution", "bottom": "data", "top": "c", "num_output": 2,
              "kernel_size": 1, "stride": 0}], {"data": ((1, 1, 4, 4), np.float32)})


def test_an_option_value_a_layer_cannot_convert_is_one_line():
    with pytest.raises(ConfigError, match=r"^model.layers\[0\] \(sum\).coeffs: expected a list "
                                          r"of finite numbers, one per bottom, found \['a', 'b'\]"):
        Net([{"name": "sum", "type": "Eltwise", "bottom": ["data", "data"], "top": "s",
              "coeffs": ["a", "b"]}], {"data": ((1, 4), np.float32)})


# ---- 2. bottoms and tops are blob names ---------------------------------------------------------

@pytest.mark.parametrize("key, value, found", [
    ("bottom", "7", "7"), ("bottom", "[pool1, 3]", "['pool1', 3]"), ("bottom", "true", "True"),
    ("top", "{a: fc}", "{'a': 'fc'}"),
])
def test_bottoms_and_tops_must_be_blob_names(tmp_path, key, value, found):
    text = LAYERS.replace(f"{key}: pool1, " if key == "bottom" else "top: fc,", f"{key}: {value},")
    path = write(tmp_path, text)
    line = net_error(path)
    assert line.startswith(f"{path}:10:") and line.endswith(
        f": model.layers[2] (fc).{key}: expected a blob name or a list of blob names (strings), "
        f"found {found}")


# ---- 3. an unclosed quote is reported where it opens --------------------------------------------

@pytest.mark.parametrize("quote", ['"', "'"])
def test_an_unclosed_quote_is_reported_where_it_opens(tmp_path, quote):
    path = write(tmp_path, f"name: {quote}quick\n" + ZOO + "solver:\n  lr: 0.1\n")
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert str(error.value) == (f"{path}:1:7: expected valid YAML (a closing quote for the quoted "
                                "text that starts here), found the end of the file")


def test_an_unclosed_quote_in_an_override(tmp_path):
    with pytest.raises(ConfigError) as error:
        load_config(write(tmp_path, ZOO), ['name="quick'])
    assert str(error.value) == ('override name="quick: expected valid YAML (a closing quote), '
                                "found the end of the value")


def test_an_unclosed_bracket_is_reported_where_it_opens(tmp_path):
    path = write(tmp_path, ZOO + "solver:\n  betas: [0.9, 0.999\n")
    with pytest.raises(ConfigError, match=r":4:10: expected valid YAML \(',' or '\]'\)"):
        load_config(path)


# ---- 4. invisible characters are shown ---------------------------------------------------------

@pytest.mark.parametrize("text, shown", [
    ("solver:\n  lr\u200b: 0.1\n", "solver.lr\\u200b: unknown key; did you mean 'lr'?"),
    ("solver:\n  lr\u00a0: 0.1\n", "solver.lr\\xa0: unknown key; did you mean 'lr'?"),
    ('solver:\n  "lr\\u2028": 0.1\n', "solver.lr\\u2028: unknown key; did you mean 'lr'?"),
])
def test_invisible_characters_in_keys_are_escaped(tmp_path, text, shown):
    path = write(tmp_path, ZOO + text)
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert str(error.value) == f"{path}:4:3: {shown}"


def test_invisible_characters_in_an_override_and_a_layer_are_escaped(tmp_path, capsys):
    assert command(capsys, write(tmp_path, ZOO), "solver.lr\u200b=1", "--dry-run") == (
        2, "override solver.lr\\u200b=1: expected key.path=value, like train.max_iters=20, "
           "found 'solver.lr\\u200b=1'")
    path = write(tmp_path, LAYERS.replace("name: pool1", "name: pool\u00a01").replace(
        "pool: max", "pool: maxx"))
    assert net_error(path) == (f"{path}:8:13: model.layers[1] (pool\\xa01).pool: expected 'max' "
                               "or 'ave' (or 'avg'), found 'maxx'")


# ---- 5. an override's value is shown as it was written ------------------------------------------

@pytest.mark.parametrize("override, found", [
    ("lms.prefetch=yes", "'yes'"), ("lms.prefetch=off", "'off'"), ("data.channels=on", "'on'"),
    ("train.log_every=0x0", "'0x0'"), ("solver.momentum=-1e-3", "'-1e-3'"),
    ("lms.keep_state=1", "1"), ("lms.prefetch=0.5", "0.5"), ("lms.prefetch=many", "'many'"),
    ("lms.prefetch=True", "True"), ("lms.prefetch='yes'", "'yes'"),
    ("solver.schedule.milestones=[10, no]", "'no'"),
    ("solver.nesterov=yes", "'yes'"),      # refused later, with solver.type: checked together
])
def test_an_override_value_yaml_changed_is_shown_as_written(tmp_path, override, found):
    path = write(tmp_path, ZOO + "solver:\n  type: adam\n")
    with pytest.raises(ConfigError) as error:
        load_config(path, [override])
    assert str(error.value).endswith(f", found {found}"), str(error.value)


def test_a_later_override_replaces_what_an_earlier_one_wrote(tmp_path):
    with pytest.raises(ConfigError) as error:
        load_config(write(tmp_path, ZOO), ["lms.prefetch=on", "lms.prefetch=-1"])
    assert str(error.value).endswith("expected an integer >= 0, found -1")


def test_the_command_shows_the_override_as_written(capsys):
    assert command(capsys, QUICKSTART, "lms.prefetch=yes", "--dry-run") == (
        2, "override lms.prefetch=yes: lms.prefetch: expected an integer >= 0, found 'yes'")


# ---- 6. only a config-sized file is read --------------------------------------------------------

def test_a_huge_file_is_refused_without_reading_it(tmp_path):
    path = tmp_path / "huge.yaml"
    with open(path, "wb") as file:
        file.truncate(11 * 2**30)                   # sparse: no disk used, nothing read
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert str(error.value) == (f"{path}: expected a YAML config file of at most 1 MiB, found a "
                                "file of 11.00 GiB")


def test_a_config_just_under_the_limit_is_read(tmp_path):
    path = write(tmp_path, ZOO + "#" * (2**20 - len(ZOO) - 1) + "\n")
    assert path.stat().st_size == 2**20 and load_config(path).model.zoo == "lenet"


@pytest.mark.parametrize("path, found", [("/dev/zero", "a character device"),
                                         ("/dev/null", "a character device")])
def test_devices_are_refused_by_name(path, found, capsys):
    assert command(capsys, path, "--dry-run") == (
        2, f"{path}: expected a YAML config file, found {found}")


def test_a_socket_is_refused_by_name(tmp_path):
    path = tmp_path / "s.yaml"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        with pytest.raises(ConfigError, match="expected a YAML config file, found a socket$"):
            load_config(path)


def feed(path, data: bytes) -> threading.Thread:
    """Write ``data`` into the FIFO at ``path`` from a thread (the reader may stop early)."""
    def write_all():
        try:
            with open(path, "wb") as pipe:
                pipe.write(data)
        except BrokenPipeError:
            pass
    thread = threading.Thread(target=write_all, daemon=True)
    thread.start()
    return thread


def test_a_pipe_is_read_up_to_the_limit(tmp_path):
    """A shell's ``<(...)`` is a pipe: a config from one is fine, an endless one is cut off."""
    small, endless = tmp_path / "small", tmp_path / "endless"
    os.mkfifo(small)
    os.mkfifo(endless)
    feed(small, ZOO.encode())
    assert load_config(small).model.zoo == "lenet"
    writer = feed(endless, b"#" * (3 * 2**20))
    with pytest.raises(ConfigError) as error:
        load_config(endless)
    assert str(error.value) == (f"{endless}: expected a YAML config file of at most 1 MiB, found "
                                "more than 1 MiB")
    writer.join(5)
