/*
 * openblas/gemm.c - the OpenBLAS intrinsics (fp32): one cblas sgemm per call (sgemv for a
 * single row, which OpenBLAS's sgemm runs several times slower), with the bias broadcast into
 * the output first (the product is then added, beta = 1) and the relu applied in one pass
 * afterwards.  Symbols tir_byoc_openblas_<pattern>, registry keys
 * openblas.<pattern>; calling convention and status codes as in tir_byoc.h.
 *
 * Linked against the scipy-openblas32 wheel: 32-bit BLAS integers, symbols prefixed `scipy_`.
 */
#include <cblas.h>
#include <limits.h>

#include "tir_byoc.h"

static void broadcast_bias(float *y, const float *bias, int64_t m, int64_t n) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) y[i * n + j] = bias[j];
}

/* NaN fails every comparison: y > 0 maps it to 0 (TVM's max(z, 0)), y < 0 keeps it. */
static void relu(float *y, int64_t count, int keep_nan) {
  if (keep_nan)
    for (int64_t i = 0; i < count; ++i) y[i] = y[i] < 0.0f ? 0.0f : y[i];
  else
    for (int64_t i = 0; i < count; ++i) y[i] = y[i] > 0.0f ? y[i] : 0.0f;
}

static int32_t openblas_gemm(const void *x_data, const void *w_data, const void *bias_data,
                             void *y_data, int64_t m, int64_t n, int64_t k, int32_t dtypes,
                             tir_byoc_layout layout, int apply_relu) {
  const float *x = (const float *)x_data, *w = (const float *)w_data;
  const float *bias = (const float *)bias_data;
  float *y = (float *)y_data;
  int32_t status;
  const int32_t flags = TIR_BYOC_FLAGS_OF(dtypes);
  // Step 1. Checks at entry: dtypes, flags, shape (BLAS indexes with 32-bit ints), pointers.
  if (TIR_BYOC_SIGNATURE_OF(dtypes) != TIR_BYOC_SIG_F32) return TIR_BYOC_EDTYPE;
  if ((flags & ~TIR_BYOC_RELU_KEEPS_NAN) != 0) return TIR_BYOC_EDTYPE;
  if ((status = tir_byoc_check_shape(m, n, k)) != TIR_BYOC_OK) return status;
  if (m > INT_MAX || n > INT_MAX || k > INT_MAX) return TIR_BYOC_ESHAPE;
  if ((status = tir_byoc_check_pointers(x, w, y, m, n, k)) != TIR_BYOC_OK) return status;
  if (m == 0 || n == 0) return TIR_BYOC_OK;
  // Step 2. y = bias (or 0), then y += x . w, then relu.
  if (bias != NULL) broadcast_bias(y, bias, m, n);
  if (k > 0 && m == 1) {
    // y = W x for an N x K weight, y = W^T x for a K x N one.
    float beta = bias != NULL ? 1.0f : 0.0f;
    if (layout == TIR_BYOC_LAYOUT_NK)
      scipy_cblas_sgemv(CblasRowMajor, CblasNoTrans, (blasint)n, (blasint)k, 1.0f, w,
                        (blasint)k, x, 1, beta, y, 1);
    else
      scipy_cblas_sgemv(CblasRowMajor, CblasTrans, (blasint)k, (blasint)n, 1.0f, w,
                        (blasint)n, x, 1, beta, y, 1);
  } else if (k > 0) {
    enum CBLAS_TRANSPOSE w_op = layout == TIR_BYOC_LAYOUT_NK ? CblasTrans : CblasNoTrans;
    blasint ldw = (blasint)(layout == TIR_BYOC_LAYOUT_NK ? k : n);
    scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, w_op, (blasint)m, (blasint)n, (blasint)k,
                      1.0f, x, (blasint)k, w, ldw, bias != NULL ? 1.0f : 0.0f, y, (blasint)n);
  } else if (bias == NULL) {
    for (int64_t i = 0; i < m * n; ++i) y[i] = 0.0f;
  }
  if (apply_relu) relu(y, m * n, (flags & TIR_BYOC_RELU_KEEPS_NAN) != 0);
  return TIR_BYOC_OK;
}

TIR_BYOC_DEFINE_FAMILY(openblas, openblas_gemm);
TIR_BYOC_DEFINE_GEMM_FROM_FAMILY(openblas, openblas_gemm);
