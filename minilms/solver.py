"""Solvers: the update step's arithmetic, with its state as blobs the executor (and LMS) manages.

A solver names its per-parameter state (``state_names``); the net declares one blob per parameter
and name, and the update step hands them over. ``begin_iteration`` is called once per iteration
before any update (Adam's step count, learning-rate schedules).
"""
from .kernels import families

(optimizers,) = families("optimizers")   # numba's: imported at the first update


class SGD:
    """``torch.optim.SGD`` (no dampening): momentum, Nesterov, L2 weight decay."""

    def __init__(self, lr: float, momentum: float = 0.0, nesterov: bool = False,
                 weight_decay: float = 0.0):
        self.lr, self.momentum = lr, momentum
        self.nesterov, self.weight_decay = nesterov, weight_decay
        self.state_names = ("momentum",) if momentum else ()

    def begin_iteration(self, iteration: int) -> None:
        pass

    def update(self, param, grad, states, stream=None) -> None:
        optimizers.sgd_step(param, grad, self.lr, momentum_buf=states[0] if states else None,
                            momentum=self.momentum, weight_decay=self.weight_decay,
                            nesterov=self.nesterov, stream=stream)


class Adam:
    """``torch.optim.Adam``: bias-corrected moments, L2 weight decay."""
    state_names = ("exp_avg", "exp_avg_sq")

    def __init__(self, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        self.lr, self.betas, self.eps, self.weight_decay = lr, tuple(betas), eps, weight_decay
        self.step = 0

    def begin_iteration(self, iteration: int) -> None:
        self.step = iteration + 1

    def update(self, param, grad, states, stream=None) -> None:
        optimizers.adam_step(param, grad, states[0], states[1], self.step, lr=self.lr,
                             beta1=self.betas[0], beta2=self.betas[1], eps=self.eps,
                             weight_decay=self.weight_decay, stream=stream)
