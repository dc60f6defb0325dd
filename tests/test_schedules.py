"""Learning-rate schedules: hand-computed values, the warm-up rule, one-line descriptions and
errors, and (where PyTorch is installed) ``torch.optim.lr_scheduler`` stepped once per iteration."""
import math

import pytest

from minilms.config.schema import SCHEMA
from minilms.errors import ConfigError
from minilms.schedules import make_schedule

DEFAULTS = SCHEMA.fields["solver"].fields["schedule"].defaults()


def section(**settings) -> dict:
    return {**DEFAULTS, **settings}


def rates(schedule, count: int) -> list:
    return [schedule(i) for i in range(count)]


def test_constant_is_the_base_rate_whatever_the_length():
    assert rates(make_schedule(section(), 0.05, 10), 12) == [0.05] * 12
    assert make_schedule({}, 0.05)(10**9) == 0.05


def test_step_multiplies_by_gamma_every_step_size_iterations():
    schedule = make_schedule(section(type="step", step_size=3, gamma=0.5), 1.0, 100)
    assert rates(schedule, 10) == [1, 1, 1, 0.5, 0.5, 0.5, 0.25, 0.25, 0.25, 0.125]


def test_multistep_multiplies_by_gamma_at_each_milestone_reached():
    schedule = make_schedule(section(type="multistep", milestones=[2, 5], gamma=0.1), 1.0, 100)
    assert rates(schedule, 7) == pytest.approx([1, 1, 0.1, 0.1, 0.1, 0.01, 0.01], abs=1e-15)


def test_cosine_goes_from_base_to_min_over_the_run_and_stays_there():
    schedule = make_schedule(section(type="cosine", min_lr=0.1), 1.0, 4)
    # 0.1 + 0.9 * (1 + cos(pi * i / 4)) / 2
    expected = [1.0, 0.1 + 0.45 * (1 + math.sqrt(0.5)), 0.55, 0.1 + 0.45 * (1 - math.sqrt(0.5)),
                0.1]
    assert rates(schedule, 5) == pytest.approx(expected, abs=1e-15)
    assert schedule(5) == schedule(1000) == 0.1    # PyTorch would climb back up; we hold min_lr


def test_cosine_min_lr_null_means_zero():
    schedule = make_schedule(section(type="cosine", min_lr=None), 0.2, 10)
    assert schedule(5) == pytest.approx(0.1, abs=1e-15) and schedule(10) == 0.0


def test_warmup_rises_linearly_then_hands_over_without_a_jump():
    schedule = make_schedule(section(warmup_iters=4), 0.8, 100)
    assert rates(schedule, 6) == pytest.approx([0.2, 0.4, 0.6, 0.8, 0.8, 0.8], abs=1e-15)


def test_warmup_multiplies_the_decay_which_keeps_absolute_iterations():
    schedule = make_schedule(section(type="step", step_size=2, gamma=0.5, warmup_iters=4), 1.0, 9)
    # decay 1, 1, .5, .5, .25 times warm-up 1/4, 2/4, 3/4, 1, 1
    assert rates(schedule, 5) == [0.25, 0.5, 0.375, 0.5, 0.25]
    cosine = make_schedule(section(type="cosine", warmup_iters=2), 1.0, 4)
    assert rates(cosine, 5) == pytest.approx(
        [0.5, (1 + math.sqrt(0.5)) / 2, 0.5, (1 - math.sqrt(0.5)) / 2, 0.0], abs=1e-15)


def test_every_default_section_from_the_config_schema_builds():
    assert make_schedule(DEFAULTS, 0.01, 10)(3) == 0.01


@pytest.mark.parametrize("settings, expected", [
    ({}, "lr 0.1, constant"),
    ({"type": "step", "step_size": 30}, "lr 0.1, x0.1 every 30 iterations"),
    ({"type": "multistep", "milestones": [10, 20], "gamma": 0.5},
     "lr 0.1, x0.5 at iterations 10, 20"),
    ({"type": "cosine", "min_lr": 0.001, "warmup_iters": 5},
     "lr 0.1, cosine to 0.001 over 100 iterations, linear warm-up over the first 5 iterations "
     "(from 0.02)"),
])
def test_describe_is_one_line_for_people(settings, expected):
    assert make_schedule(section(**settings), 0.1, 100).describe() == expected


@pytest.mark.parametrize("settings, base_lr, total_iters, key", [
    ({"type": "linear"}, 0.1, 10, "solver.schedule.type"),
    ({"type": "step", "step_size": None}, 0.1, 10, "solver.schedule.step_size"),
    ({"type": "step", "step_size": 0}, 0.1, 10, "solver.schedule.step_size"),
    ({"type": "multistep", "milestones": []}, 0.1, 10, "solver.schedule.milestones"),
    ({"type": "multistep", "milestones": [5, 3]}, 0.1, 10, "solver.schedule.milestones"),
    ({"gamma": 0}, 0.1, 10, "solver.schedule.gamma"),
    ({"warmup_iters": -1}, 0.1, 10, "solver.schedule.warmup_iters"),
    ({"type": "cosine", "min_lr": 0.5}, 0.1, 10, "solver.schedule.min_lr"),
    ({"type": "cosine"}, 0.1, 0, "train"),
    ({}, 0.0, 10, "solver.lr"),
])
def test_bad_settings_are_one_line_config_errors_naming_the_key(settings, base_lr, total_iters,
                                                                 key):
    with pytest.raises(ConfigError) as error:
        make_schedule(section(**settings), base_lr, total_iters)
    assert str(error.value).startswith(f"{key}: expected ") and "\n" not in str(error.value)


def test_negative_iterations_are_refused():
    with pytest.raises(ValueError, match="iteration: expected an integer >= 0, found -1"):
        make_schedule(section(), 0.1, 10)(-1)


# -- PyTorch ---------------------------------------------------------------------------------------
TORCH_CASES = {
    "step": ({"type": "step", "step_size": 7, "gamma": 0.3},
             lambda lr_scheduler, opt: lr_scheduler.StepLR(opt, step_size=7, gamma=0.3)),
    "multistep": ({"type": "multistep", "milestones": [5, 17, 40], "gamma": 0.2},
                  lambda lr_scheduler, opt: lr_scheduler.MultiStepLR(opt, [5, 17, 40], gamma=0.2)),
    "cosine": ({"type": "cosine", "min_lr": 0.003},
               lambda lr_scheduler, opt: lr_scheduler.CosineAnnealingLR(opt, T_max=60,
                                                                       eta_min=0.003)),
    "cosine-to-zero": ({"type": "cosine", "min_lr": None},
                       lambda lr_scheduler, opt: lr_scheduler.CosineAnnealingLR(opt, T_max=60)),
}


def torch_rates(make_scheduler, base_lr: float, count: int) -> list:
    torch = pytest.importorskip(
        "torch", reason="PyTorch is not installed: the schedules are not compared with "
                        "torch.optim.lr_scheduler (pip install torch)")
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=base_lr)
    scheduler = make_scheduler(torch.optim.lr_scheduler, optimizer)
    values = []
    for _ in range(count):
        values.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return values


@pytest.mark.parametrize("name", TORCH_CASES)
def test_matches_torch_lr_scheduler_stepped_per_iteration(name):
    settings, make_scheduler = TORCH_CASES[name]
    base_lr, total_iters = 0.1, 60
    expected = torch_rates(make_scheduler, base_lr, total_iters + 1)
    schedule = make_schedule(section(**settings), base_lr, total_iters)
    assert rates(schedule, total_iters + 1) == pytest.approx(expected, rel=0, abs=1e-12)


@pytest.mark.parametrize("name", TORCH_CASES)
def test_after_warmup_matches_torch_and_during_it_is_torch_times_the_ramp(name):
    settings, make_scheduler = TORCH_CASES[name]
    base_lr, total_iters, warmup = 0.1, 60, 8
    expected = torch_rates(make_scheduler, base_lr, total_iters + 1)
    schedule = make_schedule(section(**settings, warmup_iters=warmup), base_lr, total_iters)
    ramp = [min(1.0, (i + 1) / warmup) for i in range(total_iters + 1)]
    assert rates(schedule, total_iters + 1) == pytest.approx(
        [torch_lr * factor for torch_lr, factor in zip(expected, ramp)], rel=0, abs=1e-12)
