/*
 * ref/gemm.c - the portable reference intrinsics: every pattern of the family
 * in fp32, written for clarity rather than speed.  They are the fallback when
 * no library backend is available and the oracle the library backends are
 * tested against.  Symbols: tir_byoc_ref_<pattern>, registry key ref.<pattern>.
 */
#include "tir_byoc.h"

static int32_t ref_gemm(const void *x_data, const void *w_data, const void *bias_data,
                        void *y_data, int64_t m, int64_t n, int64_t k, int32_t dtypes,
                        tir_byoc_layout layout, int relu) {
  const float *x = (const float *)x_data, *w = (const float *)w_data;
  const float *bias = (const float *)bias_data;
  float *y = (float *)y_data;
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
        float wv = layout == TIR_BYOC_LAYOUT_NK ? w[j * k + r] : w[r * n + j];
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

TIR_BYOC_DEFINE_FAMILY(ref, ref_gemm);
TIR_BYOC_DEFINE_GEMM_FROM_FAMILY(ref, ref_gemm);
