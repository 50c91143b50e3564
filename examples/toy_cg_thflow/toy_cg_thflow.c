/*
 * toy_cg_thflow.c - a user's own kernel for dense + bias + relu: the "toy_cg_thflow"
 * library of the forum thread, written against tir_byoc's calling convention
 * (intrinsics/include/tir_byoc.h, on the include path when tir_byoc compiles it):
 *
 *     y[i, j] = max(0, bias[j] + sum_k x[i, k] * w[j, k])
 *
 * x is (m, k), w is (n, k) as nn.Linear stores it, bias is (n,), y is (m, n); all
 * float32, compact and row-major.  The kernel counts its calls, so that the example can
 * show that it, and not TVM's generated code, computed the layer.
 */
#include "tir_byoc.h"

static int64_t toy_calls = 0;

/* How many times the kernel ran in this process. */
TIR_BYOC_EXPORT int64_t toy_cg_thflow_calls(void) { return toy_calls; }

TIR_BYOC_EXPORT int32_t toy_cg_thflow_dense_bias_relu(const float *x, const float *w,
                                                      const float *bias, float *y, int64_t m,
                                                      int64_t n, int64_t k, int32_t dtypes) {
  int32_t status;
  /* Step 1. Refuse what this kernel does not implement. */
  if (dtypes != TIR_BYOC_SIG_F32) return TIR_BYOC_EDTYPE;
  if ((status = tir_byoc_check_shape(m, n, k)) != TIR_BYOC_OK) return status;
  if ((status = tir_byoc_check_pointers(x, w, y, m, n, k)) != TIR_BYOC_OK) return status;
  if (bias == NULL && n > 0) return TIR_BYOC_ENULL;
  /* Step 2. One dot product per output; both rows are contiguous along k. */
  for (int64_t i = 0; i < m; ++i) {
    const float *x_row = x + i * k;
    for (int64_t j = 0; j < n; ++j) {
      const float *w_row = w + j * k;
      float acc = 0.0f;
      for (int64_t r = 0; r < k; ++r) acc += x_row[r] * w_row[r];
      acc += bias[j];
      y[i * n + j] = acc > 0.0f ? acc : 0.0f;
    }
  }
  ++toy_calls;
  return TIR_BYOC_OK;
}
