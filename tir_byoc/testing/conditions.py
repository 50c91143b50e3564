"""Where a near miss applies: conditions on chain ``c`` of a spec, ``condition(spec, c)``.

Each is a function of a :class:`~.specs.ProgramSpec` and a chain's index (or makes one),
which :class:`~.mutations.Mutation` takes as ``applies``; the specs are read as they are, and
nothing of theirs is imported.
"""

from __future__ import annotations

from .spellings import ACTIVATION_SPELLINGS


def has(op):
    """The chain's epilogue has ``op``."""
    return lambda spec, c: op in spec.chains[c].ops


def in_epilogue(op):
    """An epilogue block of the chain computes ``op`` (a bias its init reads is none)."""
    return lambda spec, c: op in spec.chains[c].epilogue_ops


def not_in_place(spec, c):
    """The epilogue blocks write buffers of their own."""
    return not spec.chains[c].in_place


def float_relu(spec, c):
    """The chain takes a relu of a float value (which may be NaN)."""
    return spec.chains[c].relu is not None and spec.chains[c].dtypes[2].startswith("float")


def static_m(spec, c):
    """M is a constant."""
    return not spec.symbolic_m


def separate_epilogue(spec, c):
    """The chain has an epilogue block."""
    return spec.chains[c].epilogue_blocks > 0


def own_x(spec, c):
    """X is a parameter of the chain's own, not the previous chain's output."""
    return not (c > 0 and spec.chains[c - 1].feeds_next)


def can_alias(spec, c):
    """X may be the output: same dtype and, with every batch dim carried, the same batch."""
    chain = spec.chains[c]
    same_batch = set(chain.x_batch) <= {"carry"}
    return (
        chain.dtypes[0] == chain.dtypes[2]
        and not chain.feeds_next
        and own_x(spec, c)
        and same_batch
    )


def carries(operand, varying):
    """The operand carries a batch dim (one whose extent is not a static 1, if ``varying``)."""

    def applies(spec, c):
        chain = spec.chains[c]
        modes = chain.x_batch if operand == "x" else chain.w_batch
        dims = chain.varying_dims(spec.symbolic_batch) if varying else range(len(chain.batch))
        return any(modes[d] == "carry" for d in dims)

    return applies


def has_varying_dim(spec, c):
    """The chain has a batch dim whose extent is not a static 1."""
    return bool(spec.chains[c].varying_dims(spec.symbolic_batch))


def x_batch_last_carried(spec, c):
    """X carries the chain's last batch dim."""
    modes = spec.chains[c].x_batch
    return bool(modes) and modes[-1] == "carry"


def static_batch(spec, c):
    """The batch dims are constants."""
    return not spec.symbolic_batch


def all_of(*conditions):
    """Every one of ``conditions``."""
    return lambda spec, c: all(condition(spec, c) for condition in conditions)


def writes_param(spec, c):
    """The chain's output is a parameter, so a part left unwritten is still defined."""
    return not spec.chains[c].feeds_next


def both(a, b):
    """``a`` and ``b``."""
    return lambda spec, c: a(spec, c) and b(spec, c)


def writes_constant(name):
    """The chain's activation is spelled with the fixed constant ``name``."""

    def applies(spec, c):
        chain = spec.chains[c]
        return bool(chain.activation) and name in ACTIVATION_SPELLINGS[chain.activation].constants

    return applies


def activation(*ops):
    """The chain's activation (not a relu) is one of ``ops``."""

    def applies(spec, c):
        chain = spec.chains[c]
        return bool(chain.activation) and ACTIVATION_SPELLINGS[chain.activation].op in ops

    return applies


def tail(op):
    """The chain's tail op is ``op``."""
    return lambda spec, c: spec.chains[c].tail is not None and op in spec.chains[c].ops


def bias_then_relu_in_one_block(spec, c):
    """One block adds the bias and then takes the relu (with the relu first, as
    ``swapped_slots`` may build it, a select on the value before the bias is the relu)."""
    return any(
        "bias" in group and "relu" in group and group.index("bias") < group.index("relu")
        for group in spec.chains[c].epilogue_groups
    )


__all__ = [
    "activation",
    "all_of",
    "bias_then_relu_in_one_block",
    "both",
    "can_alias",
    "carries",
    "float_relu",
    "has",
    "has_varying_dim",
    "in_epilogue",
    "not_in_place",
    "own_x",
    "separate_epilogue",
    "static_batch",
    "static_m",
    "tail",
    "writes_constant",
    "writes_param",
    "x_batch_last_carried",
]
