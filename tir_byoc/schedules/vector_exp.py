"""float32 ``exp`` written out in TIR arithmetic, so that a vectorised loop computes it in
vector registers.

TVM's LLVM code generator turns ``T.exp`` into ``llvm.exp``, which LLVM turns into one call of
libm's ``expf`` per vector lane: a 16-lane softmax loop makes 16 scalar calls.  With the row
reductions vectorised (:mod:`.rows`) those calls were most of what was left of a softmax.

Entry point: :func:`exp_float32` (the expression); :func:`tir_byoc.schedules.vector_math.expand`
puts it in place of every float32 ``exp`` call.

The method: ``exp(x) = 2**n * exp(r)`` with ``n = round(x / ln 2)`` and ``|r| <= ln(2) / 2``;
``r`` from ``ln 2`` in two parts (the first exact in a product with ``n``), ``exp(r)`` from a
degree-7 polynomial (Cephes' ``expf`` coefficients), ``2**n`` built in the exponent bits in two
halves so that results down to the smallest subnormal round once.  Measured against float64
``exp`` on 4 million points of float32's range (``tests/schedules/test_vector_exp.py``): within
one ulp (libm's ``expf`` is within half an ulp, so a result can differ from TVM's default in the
last bit), subnormal results within one subnormal step; ``inf``, ``-inf``, NaN and the overflow and
underflow thresholds as libm has them.
"""

from __future__ import annotations

from tvm import tirx

#: The largest float32 whose exp is finite, and the smallest whose exp rounds above zero.
OVERFLOW = 88.72283935546875
UNDERFLOW = -103.97283

#: exp(r) = 1 + r + r**2 * P(r) on |r| <= ln(2) / 2, P's coefficients from the highest power.
_POLYNOMIAL = (
    1.9875691500e-4,
    1.3981999507e-3,
    8.3334519073e-3,
    4.1665795894e-2,
    1.6666665459e-1,
    5.0000001201e-1,
)
_LN2_HIGH = 0.693359375  # 355 / 512: n * _LN2_HIGH is exact for |n| < 2**15
_LN2_LOW = -2.12194440e-4
_LOG2_E = 1.44269504088896341


def f32(value: float) -> tirx.PrimExpr:
    return tirx.const(value, "float32")


def horner(coefficients, x: tirx.PrimExpr) -> tirx.PrimExpr:
    """The polynomial of ``coefficients`` (highest power first) at ``x``, by Horner's rule."""
    result = f32(coefficients[0])
    for coefficient in coefficients[1:]:
        result = result * x + f32(coefficient)
    return result


def _i32(value: int) -> tirx.PrimExpr:
    return tirx.const(value, "int32")


def _power_of_two(exponent: tirx.PrimExpr) -> tirx.PrimExpr:
    """2**exponent as float32, for a normal exponent (-126 to 127)."""
    return tirx.reinterpret("float32", tirx.shift_left(exponent + _i32(127), _i32(23)))


def is_nan(x: tirx.PrimExpr) -> tirx.PrimExpr:
    """Whether float32 ``x`` is NaN, from its bits: without the sign they exceed infinity's (an
    exponent of all ones and a mantissa that is not zero).  Not ``isnan``: TVM's vectoriser has
    no vector form of that call and turns the whole loop back into scalar code around it.  Not
    ``x != x`` either: TVM's simplifier folds that to false."""
    magnitude = tirx.bitwise_and(tirx.reinterpret("int32", x), _i32(0x7FFFFFFF))
    return magnitude > _i32(0x7F800000)


def exp_float32(value: tirx.PrimExpr) -> tirx.PrimExpr:
    """float32 exp of ``value`` in TIR arithmetic; ``value`` is evaluated once (a Let)."""
    x, clamped, n, r = (tirx.Var(name, "float32") for name in ("x", "clamped", "n", "r"))
    n_int, half = tirx.Var("n_int", "int32"), tirx.Var("half", "int32")
    exp_r = horner(_POLYNOMIAL, r) * r * r + r + f32(1.0)
    result = exp_r * _power_of_two(half) * _power_of_two(n_int - half)
    result = tirx.Select(x > f32(OVERFLOW), f32(float("inf")), result)
    result = tirx.Select(x < f32(UNDERFLOW), f32(0.0), result)
    result = tirx.Select(is_nan(x), x, result)
    body = tirx.Let(half, tirx.shift_right(n_int, _i32(1)), result)
    body = tirx.Let(n_int, tirx.Cast("int32", n), body)
    body = tirx.Let(r, clamped - n * f32(_LN2_HIGH) - n * f32(_LN2_LOW), body)
    body = tirx.Let(n, tirx.floor(clamped * f32(_LOG2_E) + f32(0.5)), body)
    # Below UNDERFLOW the result is 0 (selected above); computing exp(0) there instead keeps
    # the products normal: a product that underflows costs a microcode assist on Intel CPUs,
    # about a hundred cycles, and a causal mask puts -inf or float32's lowest in half a row.
    below = tirx.Select(x < f32(UNDERFLOW), f32(0.0), tirx.min(x, f32(OVERFLOW + 0.1)))
    body = tirx.Let(clamped, below, body)
    return tirx.Let(x, value, body)
