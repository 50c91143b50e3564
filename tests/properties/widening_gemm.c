/*
 * widening_gemm.c - test-only intrinsics for the property suite: every pattern for the
 * widening dtype signatures the bundled backends do not serve (fp16/bf16 inputs with fp32
 * accumulation, int8/uint8 inputs with int32 accumulation).  They let the equivalence
 * property run real numerics for every dtype the generators build.  Symbols:
 * tir_byoc_proptest_<pattern>, registry key proptest.<pattern> (tests/properties/harness.py).
 *
 * Products are formed and summed in the accumulator type in k order, as the TIR loop nest
 * does after its casts, so results match TVM's exactly for integers and to rounding for
 * floats.
 */
#include <string.h>

#include "tir_byoc.h"

static float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits;
  if (exponent == 0x1fu) {
    bits = sign | 0x7f800000u | (mantissa << 13); /* inf or nan */
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign; /* signed zero */
  } else {
    /* subnormal: normalise the mantissa */
    exponent = 113u;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    bits = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float value;
  memcpy(&value, &bits, sizeof value);
  return value;
}

static float bf16_to_float(uint16_t b) {
  uint32_t bits = (uint32_t)b << 16;
  float value;
  memcpy(&value, &bits, sizeof value);
  return value;
}

static float load_float(const void *p, int code, int64_t i) {
  if (code == TIR_BYOC_FLOAT16) return half_to_float(((const uint16_t *)p)[i]);
  if (code == TIR_BYOC_BFLOAT16) return bf16_to_float(((const uint16_t *)p)[i]);
  return ((const float *)p)[i];
}

static int32_t load_int(const void *p, int code, int64_t i) {
  if (code == TIR_BYOC_INT8) return ((const int8_t *)p)[i];
  return ((const uint8_t *)p)[i];
}

static int is_narrow_float(int code) {
  return code == TIR_BYOC_FLOAT16 || code == TIR_BYOC_BFLOAT16;
}

static int is_narrow_int(int code) { return code == TIR_BYOC_INT8 || code == TIR_BYOC_UINT8; }

static int64_t weight_index(tir_byoc_layout layout, int64_t j, int64_t r, int64_t n,
                            int64_t k) {
  return layout == TIR_BYOC_LAYOUT_NK ? j * k + r : r * n + j;
}

static int32_t widening_gemm(const void *x, const void *w, const void *bias, void *y, int64_t m,
                             int64_t n, int64_t k, int32_t dtypes, tir_byoc_layout layout,
                             int relu) {
  int x_code = dtypes & 0xff, w_code = (dtypes >> 8) & 0xff, out_code = (dtypes >> 16) & 0xff;
  int keep_nan = (TIR_BYOC_FLAGS_OF(dtypes) & TIR_BYOC_RELU_KEEPS_NAN) != 0;
  if ((TIR_BYOC_FLAGS_OF(dtypes) & ~TIR_BYOC_RELU_KEEPS_NAN) != 0) return TIR_BYOC_EDTYPE;
  int32_t status;
  if ((status = tir_byoc_check_shape(m, n, k)) != TIR_BYOC_OK) return status;
  if ((status = tir_byoc_check_pointers(x, w, y, m, n, k)) != TIR_BYOC_OK) return status;
  if (out_code == TIR_BYOC_FLOAT32 && is_narrow_float(x_code) && is_narrow_float(w_code)) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        float acc = 0.0f;
        for (int64_t r = 0; r < k; ++r) {
          float product = load_float(x, x_code, i * k + r) *
                          load_float(w, w_code, weight_index(layout, j, r, n, k));
          acc = acc + product;
        }
        if (bias != NULL) acc = acc + ((const float *)bias)[j];
        /* NaN fails every comparison: acc < 0 keeps it, acc > 0 maps it to 0. */
        if (relu) acc = keep_nan ? (acc < 0.0f ? 0.0f : acc) : (acc > 0.0f ? acc : 0.0f);
        ((float *)y)[i * n + j] = acc;
      }
    }
    return TIR_BYOC_OK;
  }
  if (out_code == TIR_BYOC_INT32 && is_narrow_int(x_code) && is_narrow_int(w_code)) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        int32_t acc = 0;
        for (int64_t r = 0; r < k; ++r) {
          acc += load_int(x, x_code, i * k + r) *
                 load_int(w, w_code, weight_index(layout, j, r, n, k));
        }
        if (bias != NULL) acc += ((const int32_t *)bias)[j];
        if (relu && acc < 0) acc = 0;
        ((int32_t *)y)[i * n + j] = acc;
      }
    }
    return TIR_BYOC_OK;
  }
  return TIR_BYOC_EDTYPE;
}

TIR_BYOC_DEFINE_FAMILY(proptest, widening_gemm);
