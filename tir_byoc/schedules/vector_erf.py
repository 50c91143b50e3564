"""float32 ``erf`` written out in TIR arithmetic, so that a vectorised loop computes it in
vector registers.

LLVM turns ``T.erf`` into one call of libm's ``erff`` per vector lane, as it does ``T.exp``
(:mod:`.vector_exp`).  An erf that is no GEMM's epilogue stays TVM code: Wav2Vec2's first
layer is a GroupNorm and an exact GELU over 512 x 8,207 values, where those calls took most
of the function's time (benchmarks/HISTORY.md has the measurement).

Entry point: :func:`erf_float32` (the expression); :func:`tir_byoc.schedules.vector_math.expand`
puts it in place of every float32 ``erf`` call.

The method, for ``a = |x|``:

- ``a < 0.875``: ``erf(x) = x + x * Q(x**2)``, ``Q`` of degree 6 (``erf(x) / x - 1``); adding
  ``x`` last keeps the rounding of ``Q`` small beside the result;
- ``0.875 <= a``: ``erf(a) = 1 - exp(-a**2) * H(1 / a) / a``, ``H`` of degree 10 in ``1 / a``
  (scaled to [-1, 1]) approximating ``a * exp(a**2) * erfc(a)``, which varies slowly; ``a`` is
  clamped to 4, past which erf rounds to 1 in float32; the sign is put back after;
- NaN gives NaN, and ``erf(-0) = -0``.

Both polynomials are near-minimax fits of the relative error (Lawson's iteration on Chebyshev
points, in float64, then rounded to float32).  Measured against float64 ``erf`` on 4 million
points (``tests/schedules/test_vector_erf.py``, which allows two): 1.1 ulps at most, 96 % of results
correctly rounded (libm's ``erff`` is within one ulp), so a result can differ from TVM's
default in the last bits.
"""

from __future__ import annotations

from tvm import tirx

from .vector_exp import exp_float32, f32, horner, is_nan

#: Where the two forms meet, and where erf has rounded to 1 in float32.
_SMALL = 0.875
_ONE = 4.0

#: erf(x) / x - 1 on x**2 in [0, 0.875**2], from the highest power.
_Q = (
    8.675391291035339e-05,
    -0.000821110385004431,
    0.005206747446209192,
    -0.026861583814024925,
    0.11283732950687408,
    -0.37612634897232056,
    0.12837916612625122,
)
#: a * exp(a**2) * erfc(a) for a in [0.875, 4], on u = (1 / a - _CENTER) * _SCALE in [-1, 1].
_H = (
    6.367681635310873e-06,
    -2.2475198420579545e-05,
    3.559817196219228e-05,
    -1.9131513909087516e-05,
    -0.00013739730638917536,
    0.000769119942560792,
    -0.0024359270464628935,
    0.00464847544208169,
    0.0023801904171705246,
    -0.07623858749866486,
    0.4772863984107971,
)
_CENTER = 0.6964285969734192  # (1 / 0.875 + 1 / 4) / 2
_SCALE = 2.240000009536743  # 2 / (1 / 0.875 - 1 / 4)


def erf_float32(value: tirx.PrimExpr) -> tirx.PrimExpr:
    """float32 erf of ``value`` in TIR arithmetic; ``value`` is evaluated once (a Let)."""
    x, a, c, r, large = (tirx.Var(name, "float32") for name in ("x", "a", "c", "r", "large"))
    small = x + x * horner(_Q, x * x)
    tail = exp_float32(-(c * c)) * horner(_H, (r - f32(_CENTER)) * f32(_SCALE)) * r
    result = tirx.Select(a < f32(_SMALL), small, tirx.Select(x < f32(0.0), -large, large))
    result = tirx.Select(is_nan(x), x, result)
    # Each Let is read more than once (tail's exp too, a Let itself, which must not be copied).
    body = tirx.Let(large, f32(1.0) - tail, result)
    body = tirx.Let(r, f32(1.0) / c, body)
    # Clamped into the large form's range: on the small side its value is not selected, and
    # past 4 (infinity too) it is 1.
    body = tirx.Let(c, tirx.min(tirx.max(a, f32(_SMALL)), f32(_ONE)), body)
    body = tirx.Let(a, tirx.Select(x < f32(0.0), -x, x), body)
    return tirx.Let(x, value, body)
