/*
 * ref/gemm.c - the portable reference intrinsics: every pattern of the family
 * in fp32, written for clarity rather than speed.  They are the fallback when
 * no library backend is available and the oracle the library backends are
 * tested against.  Symbols: tir_byoc_ref_<pattern>, registry key ref.<pattern>.
 */
#include "tir_byoc.h"

enum weight_layout { LAYOUT_NK, LAYOUT_KN };

static int32_t ref_gemm(const float *x, const float *w, const float *bias, float *y, int64_t m,
                        int64_t n, int64_t k, int32_t dtypes, enum weight_layout layout,
                        int relu) {
  int32_t status;
  const int32_t flags = TIR_BYOC_FLAGS_OF(dtypes);
  const int keep_nan = (flags & TIR_BYOC_RELU_KEEPS_NAN) != 0;
  if (TIR_BYOC_SIGNATURE_OF(dtypes) != TIR_BYOC_SIG_F32) return TIR_BYOC_EDTYPE;
  if ((flags & ~TIR_BYOC_RELU_KEEPS_NAN) != 0) return TIR_BYOC_EDTYPE;
  if ((status = tir_byoc_check_shape(m, n, k)) != TIR_BYOC_OK) return status;
  if ((status = tir_byoc_check_pointers(x, w, y, m, n, k)) != TIR_BYOC_OK) return status;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int64_t r = 0; r < k; ++r) {
        float wv = layout == LAYOUT_NK ? w[j * k + r] : w[r * n + j];
        acc += x[i * k + r] * wv;
      }
      if (bias != NULL) acc += bias[j];
      /* NaN fails every comparison: acc < 0 keeps it, acc > 0 maps it to 0. */
      if (relu) acc = keep_nan ? (acc < 0.0f ? 0.0f : acc) : (acc > 0.0f ? acc : 0.0f);
      y[i * n + j] = acc;
    }
  }
  return TIR_BYOC_OK;
}

#define REF_NO_BIAS(name, layout, relu)                                                  \
  TIR_BYOC_EXPORT int32_t tir_byoc_ref_##name(const float *x, const float *w, float *y,   \
                                              int64_t m, int64_t n, int64_t k,            \
                                              int32_t dtypes) {                           \
    return ref_gemm(x, w, NULL, y, m, n, k, dtypes, layout, relu);                        \
  }

#define REF_BIAS(name, layout, relu)                                                      \
  TIR_BYOC_EXPORT int32_t tir_byoc_ref_##name(const float *x, const float *w,              \
                                              const float *bias, float *y, int64_t m,      \
                                              int64_t n, int64_t k, int32_t dtypes) {      \
    if (bias == NULL && n > 0) return TIR_BYOC_ENULL;                                      \
    return ref_gemm(x, w, bias, y, m, n, k, dtypes, layout, relu);                         \
  }

REF_NO_BIAS(dense, LAYOUT_NK, 0)
REF_BIAS(dense_bias, LAYOUT_NK, 0)
REF_NO_BIAS(dense_relu, LAYOUT_NK, 1)
REF_BIAS(dense_bias_relu, LAYOUT_NK, 1)
REF_NO_BIAS(matmul, LAYOUT_KN, 0)
REF_BIAS(matmul_bias, LAYOUT_KN, 0)
REF_NO_BIAS(matmul_relu, LAYOUT_KN, 1)
REF_BIAS(matmul_bias_relu, LAYOUT_KN, 1)
