"""Recompute: whether a layer's forward can be run again to rebuild its tops bit for bit, and how.

Issue 21 lets the planner drop an activation after its last forward use and rebuild it before its
next read by re-running the forward of the layer that made it, instead of swapping it out and in.
That is only allowed where training stays *exactly* the same: the rebuilt top must be bitwise the
value the first forward computed, and the re-run must change nothing else. Every layer type
declares its rule as the class attribute ``recompute`` (a ``Recompute``); ``Layer``'s default is
``NOT_DECLARED``, which refuses, so a new layer is never recomputed by accident.

A re-run (``rerun_forward``: the layer's ``forward`` with ``StepIO.recompute`` set) reads

* the bottoms, as the first forward read them (resident, swapped in, or rebuilt first);
* the learnable parameters, unchanged since that forward: a layer's update follows its own
  backward, and every backward that can want its top runs before that;
* its workspace (scratch, any contents);
* the saved buffers in ``saved_reads``, kept from the first forward (batch norm's ``mean`` and
  ``invstd``, dropout's ``mask``): what makes the re-run exact;

and writes the tops and the saved buffers in ``saved_rewrites`` (max pooling's ``argmax``), the
same values again. What ``untouched`` names it leaves alone: batch norm's running statistics (they
would be updated twice), the step's RNG stream (dropout draws nothing, so every later draw of the
iteration is the draw it was), a loss's accumulators.

An in-place layer (a top named as its bottom) overwrote its input: rebuilding its top means
rebuilding that input first (the chain of producers, ``in_place``), then re-running it in place.
"""
from dataclasses import dataclass, replace

from ..errors import ShapeError


@dataclass(frozen=True)
class Recompute:
    """A layer type's recompute rule. ``possible`` False: never recomputed, ``why`` says why."""
    possible: bool
    why: str                                 # how the re-run is exact, or why there is none
    saved_reads: frozenset = frozenset()     # saved buffers the re-run reads (kept from forward)
    saved_rewrites: frozenset = frozenset()  # saved buffers it writes again (if it has them)
    untouched: tuple = ()                    # what it must leave alone (running stats, the RNG)

    @classmethod
    def rerun(cls, why: str, saved_reads=(), saved_rewrites=(), untouched=()) -> "Recompute":
        return cls(True, why, frozenset(saved_reads), frozenset(saved_rewrites), tuple(untouched))

    @classmethod
    def never(cls, why: str) -> "Recompute":
        return cls(False, why)


NOT_DECLARED = Recompute.never("the layer type declares no recompute rule")

# The rule of a forward that is a pure, deterministic function of its bottoms and parameters.
DETERMINISTIC = "a deterministic function of its bottoms and parameters: run again"


def check_recomputable(layer) -> Recompute:
    """``layer``'s rule, or a ``ShapeError`` naming the layer and why it cannot be recomputed."""
    rule = type(layer).recompute
    if not rule.possible:
        raise ShapeError(layer, "recompute", "a layer whose forward can be re-run exactly",
                         f"not recomputable: {rule.why}")
    saved = {spec.name for spec in layer.saved()}
    unknown = sorted(rule.saved_reads - saved)
    if unknown:
        raise ShapeError(layer, "recompute", f"saved buffers among {sorted(saved)}", unknown)
    return rule


def in_place(layer) -> list[str]:
    """The tops ``layer`` writes over its own bottoms: to rebuild one, rebuild its input first."""
    return [top for top in layer.top if top in layer.bottom]


def recompute_reads(layer) -> dict[str, list[str]]:
    """What a re-run of ``layer`` reads, by role (names within the layer; the net prefixes
    parameters, saved and workspace buffers with ``<layer>.``): ``bottom``, ``params`` (the
    learnable ones), ``saved`` and ``workspace``."""
    rule = check_recomputable(layer)
    return {"bottom": list(layer.bottom),
            "params": [p.name for p in layer.params() if p.learnable],
            "saved": sorted(rule.saved_reads),
            "workspace": [b.name for b in layer.workspace()]}


def recompute_writes(layer) -> dict[str, list[str]]:
    """What a re-run of ``layer`` writes: its ``top``s and the ``saved`` buffers it rewrites (those
    of the rule this layer has: average pooling saves no ``argmax``)."""
    rule = check_recomputable(layer)
    saved = {spec.name for spec in layer.saved()}
    return {"top": list(layer.top), "saved": sorted(rule.saved_rewrites & saved)}


def rerun_forward(layer, io) -> None:
    """Run ``layer``'s forward again as a recompute on ``io`` (a ``StepIO`` holding the bottoms,
    parameters, saved buffers and workspace as the rule says): the tops come out bitwise as the
    first forward wrote them, and nothing in ``untouched`` changes. Raises ``ShapeError`` for a
    layer that cannot be recomputed."""
    check_recomputable(layer)
    layer.forward(replace(io, recompute=True))
