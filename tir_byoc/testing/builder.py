"""Build a :class:`~.specs.ProgramSpec` into a real S-TIR PrimFunc.

Entry point: :func:`build_program`, which gives a :class:`Program`: the function and what
the matcher should report for each chain (:class:`~.labels.ExpectedChain`, from
:mod:`.labels`).  Functions are built with
the IR constructors (``s_tir.SBlock``, ``tirx.For``, ``tirx.BufferStore``...), not parsed
from TVMScript, so every spelling can be reached: loop orders, commuted operands, each relu
spelling and each spelling of the other epilogue ops (in one block or several, fused with
their neighbours or not), int32 or int64 indices, symbolic extents, batch dims each operand
carries, broadcasts or lacks, intermediates as root-block allocations or ``AllocBuffer``
statements.

The builder reads spec fields only.  A near miss is a chain whose :class:`~.knobs.Knobs` are
turned; each knob is looked up in the tables of :mod:`.spellings` or sets an extent, and no
code here asks which mutation turned it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tvm import tirx

from ..epilogues import Terms
from .blocks import FunctionBuilder, distractor, elementwise, zero
from .distractors import CUTTING_KINDS
from .labels import ExpectedChain, cut_chain, expected_chain
from .script import to_tvmscript
from .specs import ChainSpec, ProgramSpec, full_order
from .spellings import (
    BIAS_COMBINERS,
    BIAS_FORMS,
    COMBINERS,
    FIXED_CONSTANTS,
    PRODUCTS,
    RELU_FORMS,
    TAIL_FORMS,
    Relu,
    SwappedTerms,
)


@dataclass(frozen=True)
class Program:
    """A built function and what it should scan as."""

    spec: ProgramSpec
    func: tirx.PrimFunc = field(repr=False)
    chains: tuple[ExpectedChain, ...]
    bindings: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def mutated(self) -> ExpectedChain | None:
        return next((c for c in self.chains if c.mutation), None)

    def script(self) -> str:
        """The function as TVMScript that parses back (see :func:`to_tvmscript`)."""
        return to_tvmscript(self.func)


class ChainBuilder:
    """Builds the blocks of one chain into a :class:`~.blocks.FunctionBuilder`.

    ``x`` and ``batch`` are the previous chain's output and batch extents when it feeds this
    one.
    """

    def __init__(self, b: FunctionBuilder, c: int, chain: ChainSpec, x=None, batch=None):
        self.b, self.c, self.chain, self.knobs = b, c, chain, chain.knobs
        x_dtype, w_dtype, self.acc = chain.dtypes
        n, k = b.const(chain.n), b.const(chain.k)
        self.n, self.k = n, k
        self.batch = batch if batch is not None else b.batch_extents(c, chain.batch)
        alloc = chain.alloc
        # Step 1. Inputs (X may come from the previous chain; W and b may be made locally).
        if x is None:
            shape = self._operand_shape("x", (b.m, k))
            strides = self._padded_strides(shape) if self.knobs.x_row_padding else None
            view = chain.x_view and strides is None
            x = b.buffer(f"X{c}", shape, x_dtype, offset=view, strides=strides)
        self.x = x
        w_shape = self._operand_shape("w", (n, k) if chain.layout == "dense" else (k, n))
        produced = {d.kind for d in b.spec.distractors if d.chain == c}
        local_w = "transpose_w_in" in produced
        self.w = b.buffer(f"W{c}", w_shape, w_dtype, param=not local_w, alloc=alloc)
        self.bias = None
        self.bias_form = BIAS_FORMS[self.knobs.bias_form or chain.bias] if chain.bias else None
        if chain.bias:
            local_b = "bias_in" in produced
            shape = self.bias_form.shape(b.m, n)
            self.bias = b.buffer(f"b{c}", shape, self.acc, param=not local_b, alloc=alloc)
        # The scalar a scale reads, the layer scale vector, and the residual or gate tensor.
        self.tensors = {}  # op -> the buffer it reads
        for op in chain.ops:
            spelling = chain.spelling(op)
            reads = spelling.reads if spelling is not None else None
            if reads == "scalar":
                self.tensors[op] = b.buffer(f"s{c}", (1,), self.acc)
            elif reads == "vector":
                self.tensors[op] = b.buffer(f"g{c}", (n,), self.acc)
            elif reads == "tensor":
                shape = TAIL_FORMS[self.knobs.tail_form].shape(self.batch, b.m, n)
                stem = "R" if op == "add" else "G"
                self.tensors[op] = b.buffer(f"{stem}{c}", shape, self.acc)
        # Step 2. Outputs and intermediates (one buffer for all when updated in place).
        steps = len(chain.epilogue_groups)
        names = [*["Y", "T", *(f"T{s}" for s in range(2, steps))][:steps], "Z"]
        if chain.in_place:
            names = names[-1:]
        self.stages = []
        for s, stem in enumerate(names):
            last = s == len(names) - 1
            if last and self.knobs.output_is_x:
                self.stages.append(self.x)
                continue
            param = last and not chain.feeds_next
            shape = (*self.batch, b.m, n)
            self.stages.append(b.buffer(f"{stem}{c}", shape, self.acc, param=param, alloc=alloc))
        if chain.in_place:
            self.stages *= steps + 1

    # Batch dims: which axis of each operand each batch dim of the output reads.
    def _varying(self) -> tuple[int, ...]:
        return self.chain.varying_dims(self.b.spec.symbolic_batch)

    def _modes(self, operand: str) -> list[str]:
        """How ``operand`` ("x" or "w") treats each batch dim, after ``batch_unread``."""
        modes = list(self.chain.x_batch if operand == "x" else self.chain.w_batch)
        if self.knobs.batch_unread:
            unread = self._varying()[0]
            modes[unread] = "broadcast" if modes[unread] == "carry" else modes[unread]
        return modes

    def _first_carried(self, operand: str, varying: bool) -> int | None:
        """The first batch dim ``operand`` carries (of those whose extent is not a static 1,
        if ``varying``)."""
        allowed = self._varying() if varying else range(len(self.batch))
        modes = self._modes(operand)
        return next((d for d in allowed if modes[d] == "carry"), None)

    def _batch_axes(self, operand: str) -> list[tuple[object, int | None]]:
        """(extent, dim it reads or None for index 0) of each batch axis of ``operand``."""
        knobs, b = self.knobs, self.b
        longer = self._first_carried(operand, False) if knobs.batch_operand_longer else None
        at_zero = self._first_carried(operand, True) if knobs.batch_read_at_zero else None
        axes = []
        for d, mode in enumerate(self._modes(operand)):
            if mode == "lack":
                continue
            if mode == "broadcast":
                axes.append((b.const(1), None))
                continue
            extent = self.batch[d]
            if knobs.batch_operand_longer == operand and d == longer:
                extent = b.const(self.chain.batch[d] + 1)
            read_at_zero = knobs.batch_read_at_zero == operand and d == at_zero
            axes.append((extent, None if read_at_zero else d))
        return axes

    def _swapped(self, operand: str) -> bool:
        return operand == "x" and self.knobs.x_batch_swapped

    def _operand_shape(self, operand: str, matrix) -> tuple:
        shape = [extent for extent, _ in self._batch_axes(operand)] + list(matrix)
        if self._swapped(operand):
            shape[-3], shape[-2] = shape[-2], shape[-3]
        return tuple(shape)

    def _operand_indices(self, operand: str, v, matrix) -> list:
        batch_iters = self._batch_iters(v)
        indices = [
            zero(self.b.index_dtype) if d is None else batch_iters[d]
            for _, d in self._batch_axes(operand)
        ] + list(matrix)
        if self._swapped(operand):
            indices[-3], indices[-2] = indices[-2], indices[-3]
        return indices

    def _padded_strides(self, shape) -> tuple:
        """Row-major strides of ``shape`` with rows ``x_row_padding`` elements longer."""
        b = self.b
        strides = [b.const(1), shape[-1] + b.const(self.knobs.x_row_padding)]
        for extent in reversed(shape[1:-1]):
            strides.append(strides[-1] * extent)
        return tuple(reversed(strides))

    def _batch_iters(self, v) -> list:
        return [v[a] for a in self.chain.batch_axes]

    def _batch_loops(self, short_dim=None, short=0) -> list:
        """The (axis, extent, reduce) of the batch axes, dim ``short_dim`` ``short`` short."""
        return [
            (a, extent - self.b.const(short) if d == short_dim and short else extent, False)
            for d, (a, extent) in enumerate(zip(self.chain.batch_axes, self.batch))
        ]

    @property
    def out(self):
        return self.stages[-1]

    def _bias_load(self, vi, vj):
        return tirx.BufferLoad(self.bias, self.bias_form.index(vi, vj, self.b.const))

    def _rows(self, short: int):
        """M, or ``short`` rows fewer."""
        return self.b.m - self.b.const(short) if short else self.b.m

    # Step 3. The reduction.
    def reduction(self):
        chain, knobs, b = self.chain, self.knobs, self.b
        out = self.stages[0]
        dense = (chain.layout == "dense") != knobs.w_flipped
        product, combiner = PRODUCTS[knobs.product], COMBINERS[knobs.combiner]

        def operand(buffer, indices):
            load = tirx.BufferLoad(buffer, indices)
            return load if buffer.dtype == self.acc else tirx.Cast(self.acc, load)

        def out_indices(v):
            return [*self._batch_iters(v), v["i"], v["j"]]

        def store(v):
            x = operand(self.x, self._operand_indices("x", v, [v[a] for a in knobs.x_index]))
            w_matrix = [v[a] for a in ("jk" if dense else "kj")]
            w = operand(self.w, self._operand_indices("w", v, w_matrix))
            acc = tirx.BufferLoad(out, out_indices(v))
            update = product(x, w, chain.commuted)
            return tirx.BufferStore(
                out, combiner(acc, update, chain.accumulate_last), out_indices(v)
            )

        def init(v):
            if knobs.init_value is not None:
                start = tirx.const(knobs.init_value, self.acc)
            elif chain.init == "bias":
                start = self._bias_load(v["i"], v["j"])
            else:
                start = zero(self.acc)
            return tirx.BufferStore(out, start, out_indices(v))

        names = []
        if chain.init == "block":
            names.append(f"{chain.layout}{self.c}_init")
            rows = self._rows(knobs.init_rows_short)
            axes = [*self._batch_loops(), ("i", rows, False), ("j", self.n, False)]
            b.nest(names[-1], axes, init)
        k_extent = b.const(chain.k - knobs.k_short)
        short_dim = self._varying()[0] if knobs.batch_loop_short else None
        axes = [
            *self._batch_loops(short_dim, knobs.batch_loop_short),
            ("i", self._rows(knobs.reduction_rows_short), False),
            ("j", self.n, False),
        ]
        names.append(f"{chain.layout}{self.c}")
        b.nest(
            names[-1],
            [*axes, ("k", k_extent, True)],
            store,
            init=init if chain.init != "block" else None,
            loop_order=full_order(chain.loop_order, chain.batch_axes),
            iter_order=full_order(chain.iter_order, chain.batch_axes),
        )
        return tuple(names)

    # Step 4. The epilogue blocks.
    def epilogues(self) -> list[tuple[str, ...]]:
        """Build the epilogue blocks; the names of each group's blocks, in order."""
        groups = self.chain.epilogue_groups
        names = []
        for g, group in enumerate(groups):
            source, target = self.stages[g], self.stages[g + 1]
            last = g == len(groups) - 1
            if self.chain.block_count(group[0]) > 1:
                names.append(self._spelled_blocks(g, group[0], source, target, last))
            else:
                names.append((self._epilogue(g, group, source, target, last),))
        return names

    def _input(self, g, source, v):
        """The read of a group's input: the first group's reads may be transposed (a knob)."""
        index = self.knobs.first_epilogue_index if g == 0 else "ij"
        return tirx.BufferLoad(source, [*self._batch_iters(v), *(v[a] for a in index)])

    def _epilogue_nest(self, name, target, value, last):
        """One epilogue block ``target[..., i, j] = value(iterators)``."""

        def store(v):
            return tirx.BufferStore(target, value(v), [*self._batch_iters(v), v["i"], v["j"]])

        short = self.knobs.last_epilogue_columns_short if last else 0
        axes = [
            *self._batch_loops(),
            ("i", self.b.m, False),
            ("j", self.b.const(self.chain.n - short), False),
        ]
        order = full_order(self.chain.epilogue_order, self.chain.batch_axes)
        self.b.nest(name, axes, store, loop_order=order)
        return name

    def _epilogue(self, g, group, source, target, last):
        """One block computing the ops of ``group``, one after the other."""

        def value(v):
            loaded = self._input(g, source, v)
            result = loaded
            for op in group:
                result = self._op(op, result, loaded, v)
            return result

        return self._epilogue_nest(f"{'_'.join(group)}{self.c}", target, value, last)

    def _spelled_blocks(self, g, op, source, target, last):
        """The blocks of a spelling of ``op`` that takes several, intermediates between."""
        blocks = self.chain.spelling(op).blocks
        shape = (*self.batch, self.b.m, self.n)
        outs = [
            self.b.buffer(
                f"I{self.c}_{g}_{s}", shape, self.acc, param=False, alloc=self.chain.alloc
            )
            for s in range(len(blocks) - 1)
        ]
        outs.append(target)
        names = []
        for s, block in enumerate(blocks):

            def value(v, s=s, block=block):
                at = [*self._batch_iters(v), v["i"], v["j"]]
                earlier = [tirx.BufferLoad(outs[t], at) for t in range(s)]
                return block(self._input(g, source, v), earlier, self._terms(op, v))

            name = f"{op}{self.c}_{s + 1}"
            names.append(self._epilogue_nest(name, outs[s], value, last and s == len(blocks) - 1))
        return tuple(names)

    def _op(self, op, z, loaded, v):
        """``op`` applied to ``z`` in one block (``loaded``: the block's read of its input)."""
        if op == "bias":
            return self._bias(z, v["i"], v["j"])
        if op == "relu":
            return self._relu(z, loaded)
        return self.chain.spelling(op).blocks[0](z, [], self._terms(op, v))

    def _terms(self, op, v) -> Terms:
        """The constants and the operand of ``op``'s spelling, as the knobs leave them."""
        chain, knobs = self.chain, self.knobs
        values = {**FIXED_CONSTANTS, **chain.constant_values}
        if knobs.clip_swapped:
            values["lo"], values["hi"] = values["hi"], values["lo"]
        if knobs.slope is not None:
            values["slope"] = knobs.slope
        if knobs.fixed_constant is not None:
            name, changed = knobs.fixed_constant
            values[name] = changed
        operand, tensor = None, self.tensors.get(op)
        reads = chain.spelling(op).reads if tensor is not None else None
        if reads == "scalar":
            operand = tirx.BufferLoad(tensor, [self.b.const(0)])
        elif reads == "vector":
            operand = tirx.BufferLoad(tensor, [v["j"]])
        elif tensor is not None:
            index = TAIL_FORMS[knobs.tail_form].index
            at = index(self._batch_iters(v), v["i"], v["j"], self.b.const)
            operand = tirx.BufferLoad(tensor, at)
        return (SwappedTerms if knobs.functions_swapped else Terms)(self.acc, values, operand)

    def _bias(self, value, vi, vj):
        bias = self._bias_load(vi, vj)
        left, right = (bias, value) if self.chain.bias_first else (value, bias)
        return BIAS_COMBINERS[self.knobs.bias_combiner](left, right)

    def _relu(self, z, pre_bias):
        relu = Relu(z, pre_bias, self.chain.relu, self.knobs.relu_threshold, self.acc)
        return RELU_FORMS[self.knobs.relu_form](relu)

    def read_reduction(self):
        """A block copying the reduction's output elsewhere (``Knobs.reduction_read``)."""
        peek = self.b.buffer(f"P{self.c}", self.stages[0].shape, self.acc)
        elementwise(self.b, f"peek{self.c}", self.stages[0], peek)


def build_program(spec: ProgramSpec) -> Program:
    """Build ``spec`` into a PrimFunc and the report expected for each of its chains."""
    b = FunctionBuilder(spec)
    expected = []
    x = batch = None
    for c, chain in enumerate(spec.chains):
        around = [(n, d) for n, d in enumerate(spec.distractors) if d.chain == c]
        built = ChainBuilder(b, c, chain, x, batch)
        # Step 1. Producers and distractors placed before the chain.
        for n, d in around:
            if d.placement == "before":
                distractor(b, d, built, f"{c}_{n}")
        # Step 2. The chain, maybe cut after its reduction by blocks placed inside it.
        reduction = built.reduction()
        inside = [(n, d) for n, d in around if d.placement == "inside"]
        for n, d in inside:
            distractor(b, d, built, f"{c}_{n}")
        if chain.knobs.reduction_read == "between":
            built.read_reduction()
        groups = built.epilogues()
        if chain.knobs.reduction_read == "after":
            built.read_reduction()
        # Step 3. Distractors after it.
        for n, d in around:
            if d.placement == "after":
                distractor(b, d, built, f"{c}_{n}")
        if any(d.kind in CUTTING_KINDS for _, d in inside):
            expected.append(cut_chain(spec, c, built, reduction))
        else:
            expected.append(expected_chain(spec, c, built, reduction, groups))
        x, batch = (built.out, built.batch) if chain.feeds_next else (None, None)
    return Program(spec, b.finish(), tuple(expected), b.bindings)


__all__ = ["ChainBuilder", "Program", "build_program"]
