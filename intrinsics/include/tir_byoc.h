/*
 * tir_byoc.h - the calling convention shared by every tir_byoc intrinsic.
 *
 * The offload pass replaces a matched loop nest by one call.  A 2-D pattern (dense,
 * matmul_bias_relu, ...) is called as
 *
 *     int32_t <symbol>(const void *x, const void *w, [const void *bias,]
 *                      void *y, int64_t m, int64_t n, int64_t k, int32_t dtypes);
 *
 * x is the (m, k) input, w the weight ((n, k) for the dense patterns, (k, n)
 * for the matmul patterns), bias the (n,) vector of the *_bias patterns and y
 * the (m, n) output; all are compact row-major.  `dtypes` packs the dtype
 * signature of the match (TIR_BYOC_SIGNATURE below) in its low 24 bits, so each
 * entry point checks that it was called with a signature it implements, and
 * epilogue flags (TIR_BYOC_RELU_KEEPS_NAN) above them.  A non-zero status makes
 * the TVM function fail with an error naming the intrinsic.
 *
 * A leading-batch pattern (batch_dense_bias: an N-D activation over a 2-D weight) is called
 * through its 2-D pattern's entry point, with m = (product of the batch dims) x M: its X and Y
 * are compact, so they are (B x M, K) and (B x M, N) matrices.
 *
 * A batched pattern (bmm_matmul, bmm_dense_bias, ...) computes one product per batch index
 * (b0, b1) in [0, batch0) x [0, batch1), and takes the batch after `dtypes`:
 *
 *     int32_t <symbol>(const void *x, const void *w, [const void *bias,]
 *                      void *y, int64_t m, int64_t n, int64_t k, int32_t dtypes,
 *                      int64_t batch0, int64_t batch1,
 *                      int64_t x_stride0, int64_t x_stride1,
 *                      int64_t w_stride0, int64_t w_stride1);
 *
 * The (m, k) matrix of X for (b0, b1) starts b0 * x_stride0 + b1 * x_stride1 elements after
 * x, W's likewise; a stride of 0 broadcasts that operand along the dim.  Y is compact: the
 * (m, n) matrix for (b0, b1) starts (b0 * batch1 + b1) * m * n elements after y.  The bias,
 * if any, is the same (n,) vector for every batch index.  One batch dim is passed as
 * batch0 = 1 with strides 0.
 *
 * A backend that serves the whole family writes one function for one 2-D product and lets
 * TIR_BYOC_DEFINE_FAMILY (at the end of this file) define its sixteen entry points; the
 * batched ones loop over the batch.  A backend with a batched kernel of its own uses
 * TIR_BYOC_DEFINE_BATCHED_FAMILY instead.
 */
#ifndef TIR_BYOC_H_
#define TIR_BYOC_H_

#include <stddef.h>
#include <stdint.h>

/* Status codes. */
#define TIR_BYOC_OK 0
#define TIR_BYOC_EDTYPE 1   /* dtype signature not implemented by this entry point */
#define TIR_BYOC_ESHAPE 2   /* negative extent, or one the library cannot index */
#define TIR_BYOC_ENULL 3    /* a required pointer is NULL */
#define TIR_BYOC_EBACKEND 4 /* the library itself reported a failure */

/* Element type codes; keep in sync with tir_byoc/registry.py (DTYPE_CODES). */
#define TIR_BYOC_FLOAT32 1
#define TIR_BYOC_FLOAT16 2
#define TIR_BYOC_BFLOAT16 3
#define TIR_BYOC_INT8 4
#define TIR_BYOC_UINT8 5
#define TIR_BYOC_INT32 6
#define TIR_BYOC_FLOAT64 7

#define TIR_BYOC_SIGNATURE(x, w, y) ((int32_t)((x) | ((w) << 8) | ((y) << 16)))

/* Epilogue flags, or-ed into `dtypes` above the signature.
 *
 * TIR_BYOC_RELU_KEEPS_NAN: the relu must keep a NaN, as TVM computes max(0, z) and
 * select(z < 0, 0, z).  Without it a NaN becomes 0, as TVM computes max(z, 0) (topi's and
 * Relax's relu) and select(z > 0, z, 0).  The flag is only passed to intrinsics registered
 * with relu_nan=("zero", "keep"); the others are never given a relu that keeps NaN. */
#define TIR_BYOC_RELU_KEEPS_NAN (1 << 24)
#define TIR_BYOC_FLAGS_MASK ((int32_t)0x7F000000)
#define TIR_BYOC_SIGNATURE_OF(dtypes) ((int32_t)((dtypes) & 0x00FFFFFF))
#define TIR_BYOC_FLAGS_OF(dtypes) ((int32_t)((dtypes) & TIR_BYOC_FLAGS_MASK))
#define TIR_BYOC_SIG_F32 \
  TIR_BYOC_SIGNATURE(TIR_BYOC_FLOAT32, TIR_BYOC_FLOAT32, TIR_BYOC_FLOAT32)

#if defined(_WIN32)
#define TIR_BYOC_EXPORT __declspec(dllexport)
#else
#define TIR_BYOC_EXPORT __attribute__((visibility("default")))
#endif

/* Shape check shared by all entry points: extents must be non-negative and
 * the largest operand must be indexable with int64_t element offsets. */
static inline int32_t tir_byoc_check_shape(int64_t m, int64_t n, int64_t k) {
  if (m < 0 || n < 0 || k < 0) return TIR_BYOC_ESHAPE;
  if ((m > 0 && k > INT64_MAX / m) || (n > 0 && k > INT64_MAX / n) ||
      (m > 0 && n > INT64_MAX / m))
    return TIR_BYOC_ESHAPE;
  return TIR_BYOC_OK;
}

static inline int32_t tir_byoc_check_pointers(const void *x, const void *w, const void *y,
                                              int64_t m, int64_t n, int64_t k) {
  /* Empty operands may legitimately be NULL. */
  if (m > 0 && k > 0 && x == NULL) return TIR_BYOC_ENULL;
  if (n > 0 && k > 0 && w == NULL) return TIR_BYOC_ENULL;
  if (m > 0 && n > 0 && y == NULL) return TIR_BYOC_ENULL;
  return TIR_BYOC_OK;
}

/* Weight layouts of the family: dense patterns take an (n, k) weight, matmul ones (k, n). */
typedef enum { TIR_BYOC_LAYOUT_NK = 0, TIR_BYOC_LAYOUT_KN = 1 } tir_byoc_layout;

/* The batch of a batched call, as its arguments give it (see the top of this file). */
typedef struct {
  int64_t count[2];    /* batch0, batch1 */
  int64_t x_stride[2]; /* elements between X's matrices along each dim; 0 broadcasts */
  int64_t w_stride[2];
} tir_byoc_batch;

/* Bytes per element of a dtype code, 0 for an unknown code. */
static inline size_t tir_byoc_dtype_size(int32_t code) {
  switch (code) {
    case TIR_BYOC_INT8:
    case TIR_BYOC_UINT8:
      return 1;
    case TIR_BYOC_FLOAT16:
    case TIR_BYOC_BFLOAT16:
      return 2;
    case TIR_BYOC_FLOAT32:
    case TIR_BYOC_INT32:
      return 4;
    case TIR_BYOC_FLOAT64:
      return 8;
    default:
      return 0;
  }
}

/* Batch check shared by all batched entry points: counts and strides are non-negative, and
 * the last matrix of each operand ends at an element offset int64_t can index. */
static inline int32_t tir_byoc_check_batch(const tir_byoc_batch *batch, int64_t m, int64_t n,
                                           int64_t k) {
  int64_t count = 1;
  for (int d = 0; d < 2; ++d) {
    if (batch->count[d] < 0 || batch->x_stride[d] < 0 || batch->w_stride[d] < 0)
      return TIR_BYOC_ESHAPE;
    if (batch->count[d] > 0 && count > INT64_MAX / batch->count[d]) return TIR_BYOC_ESHAPE;
    count *= batch->count[d];
  }
  if (count == 0) return TIR_BYOC_OK;
  if (m > 0 && n > 0 && count > INT64_MAX / (m * n)) return TIR_BYOC_ESHAPE; /* y's size */
  const int64_t sizes[2] = {m * k, n * k};
  const int64_t *strides[2] = {batch->x_stride, batch->w_stride};
  for (int operand = 0; operand < 2; ++operand) {
    int64_t end = sizes[operand];
    for (int d = 0; d < 2; ++d) {
      int64_t last = batch->count[d] - 1, stride = strides[operand][d];
      if (stride > 0 && last > (INT64_MAX - end) / stride) return TIR_BYOC_ESHAPE;
      end += last * stride;
    }
  }
  return TIR_BYOC_OK;
}

/* A backend's function for one 2-D product (see TIR_BYOC_DEFINE_FAMILY). */
typedef int32_t (*tir_byoc_gemm_fn)(const void *x, const void *w, const void *bias, void *y,
                                    int64_t m, int64_t n, int64_t k, int32_t dtypes,
                                    tir_byoc_layout layout, int relu);

/* A batched call as a loop of 2-D products: `impl` once per batch index, on the matrices the
 * batch's strides locate.  An empty batch still calls `impl` once with m = 0, so that an
 * unsupported dtype is reported whatever the shape. */
static inline int32_t tir_byoc_each_batch(tir_byoc_gemm_fn impl, const void *x, const void *w,
                                          const void *bias, void *y, int64_t m, int64_t n,
                                          int64_t k, int32_t dtypes, tir_byoc_layout layout,
                                          int relu, const tir_byoc_batch *batch) {
  const int32_t signature = TIR_BYOC_SIGNATURE_OF(dtypes);
  const size_t x_size = tir_byoc_dtype_size(signature & 0xFF);
  const size_t w_size = tir_byoc_dtype_size((signature >> 8) & 0xFF);
  const size_t y_size = tir_byoc_dtype_size((signature >> 16) & 0xFF);
  int32_t status;
  if (x_size == 0 || w_size == 0 || y_size == 0) return TIR_BYOC_EDTYPE;
  if ((status = tir_byoc_check_shape(m, n, k)) != TIR_BYOC_OK) return status;
  if ((status = tir_byoc_check_batch(batch, m, n, k)) != TIR_BYOC_OK) return status;
  if (batch->count[0] == 0 || batch->count[1] == 0)
    return impl(x, w, bias, y, 0, n, k, dtypes, layout, relu);
  for (int64_t b0 = 0; b0 < batch->count[0]; ++b0) {
    for (int64_t b1 = 0; b1 < batch->count[1]; ++b1) {
      const int64_t x_at = b0 * batch->x_stride[0] + b1 * batch->x_stride[1];
      const int64_t w_at = b0 * batch->w_stride[0] + b1 * batch->w_stride[1];
      const int64_t y_at = (b0 * batch->count[1] + b1) * m * n;
      status = impl(x == NULL ? NULL : (const char *)x + x_at * (int64_t)x_size,
                    w == NULL ? NULL : (const char *)w + w_at * (int64_t)w_size, bias,
                    y == NULL ? NULL : (char *)y + y_at * (int64_t)y_size, m, n, k, dtypes,
                    layout, relu);
      if (status != TIR_BYOC_OK) return status;
    }
  }
  return TIR_BYOC_OK;
}

#ifdef __cplusplus
#define TIR_BYOC_EXTERN_C extern "C"
#else
#define TIR_BYOC_EXTERN_C
#endif

/* TIR_BYOC_DEFINE_FAMILY(backend, impl) defines the sixteen exported entry points
 *
 *     tir_byoc_<backend>_dense            tir_byoc_<backend>_matmul
 *     tir_byoc_<backend>_dense_bias       tir_byoc_<backend>_matmul_bias
 *     tir_byoc_<backend>_dense_relu       tir_byoc_<backend>_matmul_relu
 *     tir_byoc_<backend>_dense_bias_relu  tir_byoc_<backend>_matmul_bias_relu
 *
 * and the same eight prefixed bmm_ (tir_byoc_<backend>_bmm_dense, ...), with the calling
 * conventions above (void pointers; extern "C" in C++).  A 2-D entry point returns
 *
 *     impl(x, w, bias, y, m, n, k, dtypes, layout, relu)
 *
 * where `impl` is the backend's function for one 2-D product (a tir_byoc_gemm_fn)
 *
 *     int32_t impl(const void *x, const void *w, const void *bias, void *y, int64_t m,
 *                  int64_t n, int64_t k, int32_t dtypes, tir_byoc_layout layout, int relu);
 *
 * and a bmm_ entry point calls it once per batch index (tir_byoc_each_batch).  bias is NULL
 * for the patterns without one (and for a bias pattern with n == 0), layout is
 * TIR_BYOC_LAYOUT_NK for dense and TIR_BYOC_LAYOUT_KN for matmul, relu is 1 for the *_relu
 * patterns.  A bias pattern called with bias == NULL and n > 0 returns TIR_BYOC_ENULL before
 * `impl` runs; every other check (dtypes and flags, tir_byoc_check_shape,
 * tir_byoc_check_pointers) is `impl`'s.  Use it once per backend, at file scope:
 *
 *     static int32_t ref_gemm(const void *x, ..., tir_byoc_layout layout, int relu) { ... }
 *     TIR_BYOC_DEFINE_FAMILY(ref, ref_gemm);
 *
 * TIR_BYOC_DEFINE_BATCHED_FAMILY(backend, impl, batched) is the same, except that the bmm_
 * entry points return batched(x, w, bias, y, m, n, k, dtypes, layout, relu, &batch), a
 * backend's own batched kernel (`batch` as tir_byoc_batch above; it checks it itself).
 */
#define TIR_BYOC_DEFINE_FAMILY(backend, impl)                                                  \
  static int32_t tir_byoc_##backend##_each_batch_(                                             \
      const void *x, const void *w, const void *bias, void *y, int64_t m, int64_t n,           \
      int64_t k, int32_t dtypes, tir_byoc_layout layout, int relu,                             \
      const tir_byoc_batch *batch) {                                                           \
    return tir_byoc_each_batch(impl, x, w, bias, y, m, n, k, dtypes, layout, relu, batch);     \
  }                                                                                            \
  TIR_BYOC_DEFINE_BATCHED_FAMILY(backend, impl, tir_byoc_##backend##_each_batch_)

#define TIR_BYOC_DEFINE_BATCHED_FAMILY(backend, impl, batched)                                 \
  TIR_BYOC_ENTRY_(backend, dense, impl, TIR_BYOC_LAYOUT_NK, 0)                                 \
  TIR_BYOC_BIAS_ENTRY_(backend, dense_bias, impl, TIR_BYOC_LAYOUT_NK, 0)                       \
  TIR_BYOC_ENTRY_(backend, dense_relu, impl, TIR_BYOC_LAYOUT_NK, 1)                            \
  TIR_BYOC_BIAS_ENTRY_(backend, dense_bias_relu, impl, TIR_BYOC_LAYOUT_NK, 1)                  \
  TIR_BYOC_ENTRY_(backend, matmul, impl, TIR_BYOC_LAYOUT_KN, 0)                                \
  TIR_BYOC_BIAS_ENTRY_(backend, matmul_bias, impl, TIR_BYOC_LAYOUT_KN, 0)                      \
  TIR_BYOC_ENTRY_(backend, matmul_relu, impl, TIR_BYOC_LAYOUT_KN, 1)                           \
  TIR_BYOC_BIAS_ENTRY_(backend, matmul_bias_relu, impl, TIR_BYOC_LAYOUT_KN, 1)                 \
  TIR_BYOC_BMM_ENTRY_(backend, bmm_dense, batched, TIR_BYOC_LAYOUT_NK, 0)                      \
  TIR_BYOC_BMM_BIAS_ENTRY_(backend, bmm_dense_bias, batched, TIR_BYOC_LAYOUT_NK, 0)            \
  TIR_BYOC_BMM_ENTRY_(backend, bmm_dense_relu, batched, TIR_BYOC_LAYOUT_NK, 1)                 \
  TIR_BYOC_BMM_BIAS_ENTRY_(backend, bmm_dense_bias_relu, batched, TIR_BYOC_LAYOUT_NK, 1)       \
  TIR_BYOC_BMM_ENTRY_(backend, bmm_matmul, batched, TIR_BYOC_LAYOUT_KN, 0)                     \
  TIR_BYOC_BMM_BIAS_ENTRY_(backend, bmm_matmul_bias, batched, TIR_BYOC_LAYOUT_KN, 0)           \
  TIR_BYOC_BMM_ENTRY_(backend, bmm_matmul_relu, batched, TIR_BYOC_LAYOUT_KN, 1)                \
  TIR_BYOC_BMM_BIAS_ENTRY_(backend, bmm_matmul_bias_relu, batched, TIR_BYOC_LAYOUT_KN, 1)      \
  /* A redeclaration, so that the use takes a semicolon in C and C++ alike. */                 \
  TIR_BYOC_EXTERN_C TIR_BYOC_EXPORT int32_t tir_byoc_##backend##_dense(                        \
      const void *, const void *, void *, int64_t, int64_t, int64_t, int32_t)

/* One entry point of TIR_BYOC_DEFINE_FAMILY: a pattern without bias. */
#define TIR_BYOC_ENTRY_(backend, pattern, impl, layout, relu)                                  \
  TIR_BYOC_EXTERN_C TIR_BYOC_EXPORT int32_t tir_byoc_##backend##_##pattern(                    \
      const void *x, const void *w, void *y, int64_t m, int64_t n, int64_t k, int32_t dtypes) { \
    return impl(x, w, NULL, y, m, n, k, dtypes, layout, relu);                                 \
  }

/* One entry point of TIR_BYOC_DEFINE_FAMILY: a pattern with bias. */
#define TIR_BYOC_BIAS_ENTRY_(backend, pattern, impl, layout, relu)                             \
  TIR_BYOC_EXTERN_C TIR_BYOC_EXPORT int32_t tir_byoc_##backend##_##pattern(                    \
      const void *x, const void *w, const void *bias, void *y, int64_t m, int64_t n,           \
      int64_t k, int32_t dtypes) {                                                             \
    if (bias == NULL && n > 0) return TIR_BYOC_ENULL;                                          \
    return impl(x, w, bias, y, m, n, k, dtypes, layout, relu);                                 \
  }

/* The batch arguments of a bmm_ entry point, after `dtypes`. */
#define TIR_BYOC_BATCH_PARAMS_                                                                 \
  int64_t batch0, int64_t batch1, int64_t x_stride0, int64_t x_stride1, int64_t w_stride0,     \
      int64_t w_stride1

#define TIR_BYOC_BATCH_OF_PARAMS_                                                              \
  {{batch0, batch1}, {x_stride0, x_stride1}, {w_stride0, w_stride1}}

/* One bmm_ entry point of TIR_BYOC_DEFINE_FAMILY: a pattern without bias. */
#define TIR_BYOC_BMM_ENTRY_(backend, pattern, batched, layout, relu)                           \
  TIR_BYOC_EXTERN_C TIR_BYOC_EXPORT int32_t tir_byoc_##backend##_##pattern(                    \
      const void *x, const void *w, void *y, int64_t m, int64_t n, int64_t k, int32_t dtypes,  \
      TIR_BYOC_BATCH_PARAMS_) {                                                                \
    const tir_byoc_batch batch = TIR_BYOC_BATCH_OF_PARAMS_;                                    \
    return batched(x, w, NULL, y, m, n, k, dtypes, layout, relu, &batch);                      \
  }

/* One bmm_ entry point of TIR_BYOC_DEFINE_FAMILY: a pattern with bias. */
#define TIR_BYOC_BMM_BIAS_ENTRY_(backend, pattern, batched, layout, relu)                      \
  TIR_BYOC_EXTERN_C TIR_BYOC_EXPORT int32_t tir_byoc_##backend##_##pattern(                    \
      const void *x, const void *w, const void *bias, void *y, int64_t m, int64_t n,           \
      int64_t k, int32_t dtypes, TIR_BYOC_BATCH_PARAMS_) {                                     \
    const tir_byoc_batch batch = TIR_BYOC_BATCH_OF_PARAMS_;                                    \
    if (bias == NULL && n > 0) return TIR_BYOC_ENULL;                                          \
    return batched(x, w, bias, y, m, n, k, dtypes, layout, relu, &batch);                      \
  }

#endif /* TIR_BYOC_H_ */
