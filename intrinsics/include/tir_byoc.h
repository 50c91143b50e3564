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
 *
 * Epilogues as data.  Every other member (an epilogue with scale, gelu, silu, swish, clip, a
 * residual add, a gating mul, ...; tir_byoc/epilogues lists them) is called through one
 * entry point per backend that takes the weight layout, the batch and the epilogue as arguments:
 *
 *     int32_t tir_byoc_<backend>_gemm(const void *x, const void *w, void *y,
 *                                     int64_t m, int64_t n, int64_t k, int32_t dtypes,
 *                                     int32_t layout,
 *                                     int64_t batch0, int64_t batch1,
 *                                     int64_t x_stride0, int64_t x_stride1,
 *                                     int64_t w_stride0, int64_t w_stride1,
 *                                     int64_t ops,
 *                                     double c0, double c1, double c2, double c3,
 *                                     double c4, double c5,
 *                                     const void *t0, const void *t1, const void *t2,
 *                                     const void *t3);
 *
 * layout is a tir_byoc_layout; the batch is as for the bmm_ entry points (a 2-D or a
 * leading-batch call passes batch0 = batch1 = 1 and strides 0, m counting every row).  The
 * epilogue runs on the fp32 result z of the product, one op after the other, in the order
 * the TIR computes them:
 *
 *   - `ops` holds the op codes (TIR_BYOC_OP_* below), 8 bits each, the first op in the
 *     lowest byte, ended by the first 0 byte (so at most TIR_BYOC_MAX_OPS ops);
 *   - c0..c5 are the ops' constants, taken in op order, as many per op as its code says (a
 *     scale by a scalar parameter passes the parameter's value here); unused ones are 0;
 *   - t0..t3 are the ops' tensors, taken in op order: the (n,) bias vector, or a residual or
 *     gate tensor with y's shape, compact (for a batched call, y's compact batch layout);
 *     unused ones are NULL.  None shares memory with y, which the product is written to
 *     first (the matcher stops a chain before an op that reads its own output).
 *
 * The entry point returns TIR_BYOC_EEPILOGUE for an op code it does not implement (a
 * backend declares its ops when it registers; tir_byoc never sends others).  `dtypes` may
 * carry TIR_BYOC_PACKED_WEIGHT: then w is not the weight but the block that the backend's
 * pack function made of it (see below).  The macros TIR_BYOC_DEFINE_GEMM (a backend's own
 * implementation of a whole call) and TIR_BYOC_DEFINE_GEMM_FROM_FAMILY (a 2-D product per
 * batch index, then the portable epilogue of tir_byoc_epilogue.h) define this entry point.
 */
#ifndef TIR_BYOC_H_
#define TIR_BYOC_H_

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Status codes. */
#define TIR_BYOC_OK 0
#define TIR_BYOC_EDTYPE 1   /* dtype signature not implemented by this entry point */
#define TIR_BYOC_ESHAPE 2   /* negative extent, or one the library cannot index */
#define TIR_BYOC_ENULL 3    /* a required pointer is NULL */
#define TIR_BYOC_EBACKEND 4 /* the library itself reported a failure */
#define TIR_BYOC_EEPILOGUE 5 /* an epilogue op code this entry point does not implement */
#define TIR_BYOC_EPACKED 6   /* a packed weight made for another call (TIR_BYOC_PACKED_WEIGHT) */

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
/* TIR_BYOC_PACKED_WEIGHT (the gemm entry point only, without batch): w points to the weight
 * as the backend's pack function laid it out at build time for this call,
 *
 *     int32_t tir_byoc_<backend>_pack(const void *w, int64_t m, int64_t n, int64_t k,
 *                                     int32_t dtypes, int32_t layout, int64_t ops,
 *                                     double c0, ..., double c5, int32_t *form,
 *                                     void *out, int64_t *size);
 *
 * (the call's arguments without x, y and the tensors).  `form` is one of TIR_BYOC_PACK_*
 * below.  With out == NULL the function sets *size to the bytes the block needs, and first,
 * if *form is TIR_BYOC_PACK_CHOOSE, chooses the form (the oneDNN backend times the
 * candidates on this call) and writes it to *form; TIR_BYOC_PACK_PLAIN gives *size = 0: the
 * call is best served by the plain weight.  TIR_BYOC_PACK_CHOOSE_ANY_M chooses for a call
 * whose M is only known at run time (the m passed is one example; the backend samples the
 * M it needs): the transposed weight, TIR_BYOC_PACK_LIBRARY_BY_M, a block holding the
 * weight in each distinct layout the library asks for over a range of m (a few copies, the
 * call picking the one for its m), or TIR_BYOC_PACK_LAYOUT_BY_M, the weight and its
 * transpose, the call reading the one timed faster for its range of m.  With out != NULL it
 * writes the block in *form.
 * The block names its form and layout; a GEMM call it was not made for returns
 * TIR_BYOC_EPACKED.  A call of a block by M whose m asks for a layout the block does not
 * hold (an m past the sampled range, another thread count or CPU) reorders a copy into it
 * for that call; only a block of another weight shape, or of layouts no format tag
 * describes, returns TIR_BYOC_EPACKED.  A conv block holds its weight's layout, and a call
 * whose primitive asks for another (another batch, thread count or CPU) reorders it for that
 * call; only a block of another weight shape, or of a layout no format tag describes,
 * returns TIR_BYOC_EPACKED.
 * A backend that does not pack never receives the flag and returns TIR_BYOC_EDTYPE if it
 * does. */
#define TIR_BYOC_PACKED_WEIGHT (1 << 25)
#define TIR_BYOC_PACK_CHOOSE (-1)    /* let the backend choose (and say) the form */
#define TIR_BYOC_PACK_CHOOSE_ANY_M (-2) /* ... one that serves every m */
#define TIR_BYOC_PACK_PLAIN 0        /* no block: the call keeps the plain weight */
#define TIR_BYOC_PACK_LIBRARY 1      /* the layout the library prefers for the call */
#define TIR_BYOC_PACK_TRANSPOSED 2   /* the plain weight in the other layout, NK <-> KN */
#define TIR_BYOC_PACK_LIBRARY_BY_M 4 /* the library's layout for each range of m (see above) */
#define TIR_BYOC_PACK_LAYOUT_BY_M 5  /* the plain or the transposed weight by range of m */
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

/* 1 if none of the `count` floats at `values` is an infinity or a NaN.  Branch-free, so it
 * vectorises: it runs over whole outputs and weights. */
static inline int tir_byoc_all_finite(const float *values, int64_t count) {
  uint32_t special = 0;
  for (int64_t i = 0; i < count; ++i) {
    uint32_t bits;
    memcpy(&bits, values + i, sizeof bits);
    special |= (uint32_t)((bits & 0x7f800000u) == 0x7f800000u);
  }
  return special == 0;
}

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

/* ------------------------------------------------------------------------------------------
 * Epilogues as data (the gemm entry point described at the top of this file).
 *
 * Op codes; keep in sync with tir_byoc/epilogues/table.py (OpSpec.code).  z is the value so
 * far, c the op's constants, t its tensor; every formula is the one TVM's lowering of the
 * recognised TIR computes, so a NaN or an infinity gives what the TIR gives.
 */
#define TIR_BYOC_OP_END 0
#define TIR_BYOC_OP_SCALE 1          /* z * c0 */
#define TIR_BYOC_OP_DIV 2            /* z / c0 */
#define TIR_BYOC_OP_BIAS 3           /* z + t[j], t an (n,) vector */
#define TIR_BYOC_OP_RELU 4           /* z > 0 ? z : 0 (a NaN becomes 0) */
#define TIR_BYOC_OP_RELU_KEEP_NAN 5  /* z < 0 ? 0 : z (a NaN stays) */
#define TIR_BYOC_OP_GELU 6           /* z * (0.5 + erf(z * c0) * 0.5), c0 = sqrt(1/2) */
#define TIR_BYOC_OP_GELU_TANH 7      /* 0.5 * z * (1 + tanh(c0 * (z + c1 * z^3))) */
#define TIR_BYOC_OP_SILU 8           /* z * (1 / (1 + exp(-z))) */
#define TIR_BYOC_OP_SIGMOID 9        /* 1 / (1 + exp(-z)) */
#define TIR_BYOC_OP_TANH 10          /* tanh(z) */
#define TIR_BYOC_OP_CLIP 11          /* NaN ? c2 : min(max(z, c0), c1) (c2: lo, hi or NaN) */
#define TIR_BYOC_OP_LEAKY_RELU 12    /* z > 0 ? z : c0 * z, 0 <= c0 <= 1 */
#define TIR_BYOC_OP_ADD 13           /* z + t[i, j], t with y's shape */
#define TIR_BYOC_OP_MUL 14           /* z * t[i, j], t with y's shape */
#define TIR_BYOC_OP_SWISH 15         /* z * (1 / (1 + exp(-(c0 * z)))) (CLIP's quick_gelu) */
#define TIR_BYOC_OP_CHANNEL_SCALE 16 /* z * t[j], t an (n,) vector (a layer scale) */
#define TIR_BYOC_OP_HARDSWISH 17     /* z * min(max(z + 3, 0), 6) / 6 (MobileNetV3) */
#define TIR_BYOC_OP_COUNT 18
#define TIR_BYOC_MAX_OPS 8
#define TIR_BYOC_MAX_CONSTANTS 6
#define TIR_BYOC_MAX_TENSORS 4

/* How many constants an op takes, and whether it takes a tensor (-1: unknown code). */
static inline int tir_byoc_op_constants(int32_t code) {
  switch (code) {
    case TIR_BYOC_OP_SCALE:
    case TIR_BYOC_OP_DIV:
    case TIR_BYOC_OP_GELU:
    case TIR_BYOC_OP_LEAKY_RELU:
    case TIR_BYOC_OP_SWISH:
      return 1;
    case TIR_BYOC_OP_GELU_TANH:
      return 2;
    case TIR_BYOC_OP_CLIP:
      return 3;
    case TIR_BYOC_OP_BIAS:
    case TIR_BYOC_OP_RELU:
    case TIR_BYOC_OP_RELU_KEEP_NAN:
    case TIR_BYOC_OP_SILU:
    case TIR_BYOC_OP_SIGMOID:
    case TIR_BYOC_OP_TANH:
    case TIR_BYOC_OP_ADD:
    case TIR_BYOC_OP_MUL:
    case TIR_BYOC_OP_CHANNEL_SCALE:
    case TIR_BYOC_OP_HARDSWISH:
      return 0;
    default:
      return -1;
  }
}

static inline int tir_byoc_op_has_tensor(int32_t code) {
  return code == TIR_BYOC_OP_BIAS || code == TIR_BYOC_OP_ADD || code == TIR_BYOC_OP_MUL ||
         code == TIR_BYOC_OP_CHANNEL_SCALE;
}

/* One op of an epilogue, with its constants and tensor. */
typedef struct {
  int32_t code;
  double c[3];
  const void *tensor;
} tir_byoc_op;

typedef struct {
  int32_t count;
  tir_byoc_op op[TIR_BYOC_MAX_OPS];
} tir_byoc_epilogue;

/* A whole call of the gemm entry point, decoded and checked (tir_byoc_decode_call). */
typedef struct {
  const void *x, *w;
  void *y;
  int64_t m, n, k;
  int32_t dtypes; /* signature and flags, as passed */
  tir_byoc_layout layout;
  tir_byoc_batch batch;
  tir_byoc_epilogue epilogue;
} tir_byoc_call;

/* Fill call->epilogue from the packed arguments; TIR_BYOC_EEPILOGUE for an unknown code, too
 * many constants or tensors, or a byte after the end marker; TIR_BYOC_ENULL for a missing
 * tensor when y is not empty. */
static inline int32_t tir_byoc_decode_epilogue(tir_byoc_call *call, int64_t ops,
                                               const double *constants,
                                               const void *const *tensors) {
  int used_c = 0, used_t = 0;
  uint64_t codes = (uint64_t)ops;
  call->epilogue.count = 0;
  for (int i = 0; i < 8; ++i, codes >>= 8) {
    const int32_t code = (int32_t)(codes & 0xFF);
    if (code == TIR_BYOC_OP_END) return codes == 0 ? TIR_BYOC_OK : TIR_BYOC_EEPILOGUE;
    const int arity = tir_byoc_op_constants(code);
    if (arity < 0 || used_c + arity > TIR_BYOC_MAX_CONSTANTS) return TIR_BYOC_EEPILOGUE;
    tir_byoc_op *op = &call->epilogue.op[call->epilogue.count++];
    op->code = code;
    op->c[0] = op->c[1] = op->c[2] = 0.0;
    for (int j = 0; j < arity; ++j) op->c[j] = constants[used_c++];
    op->tensor = NULL;
    if (tir_byoc_op_has_tensor(code)) {
      if (used_t == TIR_BYOC_MAX_TENSORS) return TIR_BYOC_EEPILOGUE;
      op->tensor = tensors[used_t++];
      if (op->tensor == NULL && call->m > 0 && call->n > 0) return TIR_BYOC_ENULL;
    }
  }
  return TIR_BYOC_OK;
}

/* A backend's implementation of a whole gemm call (see TIR_BYOC_DEFINE_GEMM). */
typedef int32_t (*tir_byoc_call_fn)(const tir_byoc_call *call);

/* TVM's thread pool: TVMParallelGroupEnv, FTVMParallelLambda and TVMBackendParallelLaunch as
 * tvm/runtime/c_backend_api.h declares them.  TVM's parallel loops run on it, and so do the
 * parts of a call that a backend shares among threads (oneMKL's products, the C epilogue), so
 * that one pool serves the whole model: no other pool's worker spins on a core TVM's next
 * loop needs.  The symbol is weak: outside TVM's runtime (a library loaded by ctypes alone) it
 * is NULL and the parts run one after the other on the calling thread.  Compiled with
 * TIR_BYOC_STANDALONE (a model built as plain C by tir_byoc.aot) there is no pool and no
 * reference to the symbol at all. */
typedef struct {
  void *sync_handle;
  int32_t num_task;
} tir_byoc_tvm_group_env;
typedef int (*tir_byoc_tvm_lambda)(int task_id, tir_byoc_tvm_group_env *env, void *data);
#ifdef TIR_BYOC_STANDALONE
#define TVMBackendParallelLaunch ((int (*)(tir_byoc_tvm_lambda, void *, int))NULL)
#else
TIR_BYOC_EXTERN_C int TVMBackendParallelLaunch(tir_byoc_tvm_lambda lambda, void *data,
                                               int num_task) __attribute__((weak));
#endif

#define TIR_BYOC_MAX_PARTS 64

static inline int tir_byoc_count_threads_(int task_id, tir_byoc_tvm_group_env *env,
                                          void *data) {
  if (task_id == 0) *(int *)data = env->num_task;
  return 0;
}

/* The number of threads of TVM's pool (1 without it, at most TIR_BYOC_MAX_PARTS), asked once
 * per library: the pool's size is fixed when it starts (TVM_NUM_THREADS, or one per core). */
static inline int tir_byoc_pool_threads(void) {
  static int threads; /* 0 until asked */
  int t = __atomic_load_n(&threads, __ATOMIC_RELAXED);
  if (t == 0) {
    t = 1;
    if (TVMBackendParallelLaunch != NULL)
      TVMBackendParallelLaunch(tir_byoc_count_threads_, &t, 0);
    if (t < 1) t = 1;
    if (t > TIR_BYOC_MAX_PARTS) t = TIR_BYOC_MAX_PARTS;
    __atomic_store_n(&threads, t, __ATOMIC_RELAXED);
  }
  return t;
}

/* Part s of `parts` of [0, total): [*lo, *hi), each part a multiple of `align` but the last. */
static inline void tir_byoc_part_range(int64_t total, int parts, int s, int64_t align,
                                       int64_t *lo, int64_t *hi) {
  int64_t size = (total + parts - 1) / parts;
  size = (size + align - 1) / align * align;
  *lo = s * size < total ? s * size : total;
  *hi = *lo + size < total ? *lo + size : total;
}

#include "tir_byoc_epilogue.h"

/* TIR_BYOC_DEFINE_GEMM(backend, impl) defines tir_byoc_<backend>_gemm, which decodes its
 * arguments into a tir_byoc_call, checks the layout, shape, batch, pointers and epilogue, and
 * returns impl(&call).  impl checks the dtypes and flags. */
#define TIR_BYOC_DEFINE_GEMM(backend, impl)                                                    \
  TIR_BYOC_EXTERN_C TIR_BYOC_EXPORT int32_t tir_byoc_##backend##_gemm(                         \
      const void *x, const void *w, void *y, int64_t m, int64_t n, int64_t k, int32_t dtypes,  \
      int32_t layout, TIR_BYOC_BATCH_PARAMS_, int64_t ops, double c0, double c1, double c2,    \
      double c3, double c4, double c5, const void *t0, const void *t1, const void *t2,         \
      const void *t3) {                                                                        \
    const double constants[TIR_BYOC_MAX_CONSTANTS] = {c0, c1, c2, c3, c4, c5};                 \
    const void *const tensors[TIR_BYOC_MAX_TENSORS] = {t0, t1, t2, t3};                        \
    const tir_byoc_batch batch = TIR_BYOC_BATCH_OF_PARAMS_;                                    \
    tir_byoc_call call;                                                                        \
    int32_t status;                                                                            \
    call.x = x, call.w = w, call.y = y, call.m = m, call.n = n, call.k = k;                    \
    call.dtypes = dtypes, call.layout = (tir_byoc_layout)layout, call.batch = batch;           \
    if (layout != TIR_BYOC_LAYOUT_NK && layout != TIR_BYOC_LAYOUT_KN) return TIR_BYOC_ESHAPE;  \
    if ((status = tir_byoc_check_shape(m, n, k)) != TIR_BYOC_OK) return status;                \
    if ((status = tir_byoc_check_batch(&call.batch, m, n, k)) != TIR_BYOC_OK) return status;   \
    if ((status = tir_byoc_check_pointers(x, w, y, m, n, k)) != TIR_BYOC_OK) return status;    \
    if ((status = tir_byoc_decode_epilogue(&call, ops, constants, tensors)) != TIR_BYOC_OK)    \
      return status;                                                                           \
    return impl(&call);                                                                        \
  }

/* TIR_BYOC_DEFINE_GEMM_FROM_FAMILY(backend, impl): the gemm entry point of a backend that
 * has only a 2-D product (the `impl` of TIR_BYOC_DEFINE_FAMILY): the product per batch index,
 * then tir_byoc_run_epilogue over the whole output.  fp32 only; no packed weights.  Also
 * defines tir_byoc_<backend>_vector_math and _epilogue_parts (tir_byoc_epilogue.h). */
#define TIR_BYOC_DEFINE_GEMM_FROM_FAMILY(backend, impl)                                        \
  static int32_t tir_byoc_##backend##_call_(const tir_byoc_call *call) {                       \
    int32_t status;                                                                            \
    if (call->dtypes != TIR_BYOC_SIG_F32) return TIR_BYOC_EDTYPE;                              \
    status = tir_byoc_each_batch(impl, call->x, call->w, NULL, call->y, call->m, call->n,      \
                                 call->k, call->dtypes, call->layout, 0, &call->batch);        \
    if (status != TIR_BYOC_OK) return status;                                                  \
    tir_byoc_run_epilogue(&call->epilogue, 0, (float *)call->y,                                \
                          call->m * call->batch.count[0] * call->batch.count[1], call->n);     \
    return TIR_BYOC_OK;                                                                        \
  }                                                                                            \
  TIR_BYOC_DEFINE_GEMM(backend, tir_byoc_##backend##_call_)                                    \
  TIR_BYOC_DEFINE_EPILOGUE_INFO(backend)

/* ------------------------------------------------------------------------------------------
 * Convolutions.  A matched convolution (1-, 2- or 3-D, any groups, stride, dilation and
 * padding) with its epilogue is called through one entry point per backend:
 *
 *     int32_t tir_byoc_<backend>_conv(const void *x, const void *w, void *y, int32_t dtypes,
 *                                     int32_t layout, int32_t weight_layout,
 *                                     int64_t n, int64_t c, int64_t o, int64_t groups,
 *                                     int64_t i0, int64_t i1, int64_t i2,
 *                                     int64_t o0, int64_t o1, int64_t o2,
 *                                     int64_t k0, int64_t k1, int64_t k2,
 *                                     int64_t s0, int64_t s1, int64_t s2,
 *                                     int64_t d0, int64_t d1, int64_t d2,
 *                                     int64_t p0, int64_t p1, int64_t p2,
 *                                     int64_t ops, double c0, ..., double c5,
 *                                     const void *t0, ..., const void *t3);
 *
 * x is the (n, c, i0, i1, i2) input and y the (n, o, o0, o1, o2) output, compact, in
 * `layout` (a tir_byoc_conv_layout: channels first, NC[spatial], or last, N[spatial]C).  The
 * spatial dims are outermost first; a convolution over fewer than three passes 1 for the
 * extents, kernel, stride and dilation and 0 for the padding of the dims it lacks (the last
 * ones).  w is the weight in `weight_layout` (a tir_byoc_conv_weight_layout): (o, c/groups,
 * k0, k1, k2) or (k0, k1, k2, c/groups, o), compact.  Output channel oc belongs to group
 * g = oc / (o/groups), which reads the input channels g*(c/groups) .. (g+1)*(c/groups) - 1; a
 * depthwise convolution has groups = c.  p0..p2 are the low paddings: output position q of
 * spatial dim a reads input position q*s_a + r*d_a - p_a for kernel offset r, and a
 * position outside [0, i_a) reads 0 (so the high padding follows from the sizes).  The
 * epilogue is encoded as for the gemm entry point (ops, c0..c5, t0..t3) and runs on the fp32
 * result, in the order given: a per-channel tensor (bias, channel_scale) is an (o,) vector, a
 * residual or gate tensor has y's shape and layout.  `dtypes` may carry
 * TIR_BYOC_PACKED_WEIGHT: w is then the block tir_byoc_<backend>_conv_pack made of the
 * weight for this call, whose arguments are the conv entry point's without x, y and the
 * tensors, then the form, the block and its size as for tir_byoc_<backend>_pack:
 *
 *     int32_t tir_byoc_<backend>_conv_pack(const void *w, int32_t dtypes, int32_t layout,
 *                                          int32_t weight_layout, int64_t n, ... int64_t p2,
 *                                          int64_t ops, double c0, ..., double c5,
 *                                          int32_t *form, void *out, int64_t *size);
 *
 * Besides TIR_BYOC_PACK_PLAIN and TIR_BYOC_PACK_LIBRARY (the weight in the layout the
 * library's convolution asks for), a conv block may hold TIR_BYOC_PACK_CONV_BLOCKED: that
 * weight for a primitive that also runs on its own activation layouts, x and y reordered
 * around it inside the call.
 *
 * TIR_BYOC_DEFINE_CONV(backend, impl) defines the entry point: it decodes and checks the
 * arguments into a tir_byoc_conv and returns impl(&conv); impl checks dtypes and flags.
 */
#define TIR_BYOC_PACK_CONV_BLOCKED 3 /* see above */

typedef enum {
  TIR_BYOC_CONV_CHANNELS_FIRST = 0, /* NCW, NCHW, NCDHW */
  TIR_BYOC_CONV_CHANNELS_LAST = 1   /* NWC, NHWC, NDHWC */
} tir_byoc_conv_layout;

typedef enum {
  TIR_BYOC_CONV_WEIGHT_OIK = 0, /* (o, c/groups, k0, k1, k2): OIW, OIHW, OIDHW */
  TIR_BYOC_CONV_WEIGHT_KIO = 1  /* (k0, k1, k2, c/groups, o): WIO, HWIO, DHWIO */
} tir_byoc_conv_weight_layout;

/* A whole conv call, decoded and checked (TIR_BYOC_DEFINE_CONV). */
typedef struct {
  const void *x, *w;
  void *y;
  int32_t dtypes; /* signature and flags, as passed */
  tir_byoc_conv_layout layout;
  tir_byoc_conv_weight_layout weight_layout;
  int64_t n, c, o, groups;
  int64_t in[3], out[3], kernel[3], stride[3], dilation[3], pad[3];
  tir_byoc_epilogue epilogue;
} tir_byoc_conv;

/* Elements of the output positions of one image (o0 * o1 * o2), of the kernel window, ... */
static inline int64_t tir_byoc_conv_volume(const int64_t *dims) {
  return dims[0] * dims[1] * dims[2];
}

/* Layouts, extents and groups valid, every operand's size indexable with int64_t. */
static inline int32_t tir_byoc_check_conv(const tir_byoc_conv *conv) {
  const double limit = 9.0e18;
  if ((unsigned)conv->layout > 1u || (unsigned)conv->weight_layout > 1u) return TIR_BYOC_ESHAPE;
  if (conv->n < 0 || conv->c < 1 || conv->o < 1 || conv->groups < 1) return TIR_BYOC_ESHAPE;
  if (conv->c % conv->groups != 0 || conv->o % conv->groups != 0) return TIR_BYOC_ESHAPE;
  for (int a = 0; a < 3; ++a) {
    if (conv->in[a] < 1 || conv->out[a] < 1 || conv->kernel[a] < 1) return TIR_BYOC_ESHAPE;
    if (conv->stride[a] < 1 || conv->dilation[a] < 1 || conv->pad[a] < 0) return TIR_BYOC_ESHAPE;
    if ((double)conv->in[a] + conv->pad[a] > limit ||
        ((double)conv->out[a] - 1) * conv->stride[a] + ((double)conv->kernel[a] - 1) *
            conv->dilation[a] > limit)
      return TIR_BYOC_ESHAPE;
  }
  if ((double)conv->n * conv->c * conv->in[0] * conv->in[1] * conv->in[2] > limit ||
      (double)conv->n * conv->o * conv->out[0] * conv->out[1] * conv->out[2] > limit ||
      (double)conv->o * (conv->c / conv->groups) * conv->kernel[0] * conv->kernel[1] *
              conv->kernel[2] > limit)
    return TIR_BYOC_ESHAPE;
  return TIR_BYOC_OK;
}

/* Ops first.. of `epilogue` over the fp32 output y of `conv`, in place: for channels last the
 * gemm epilogue over (n * positions, o) rows; for channels first one (n, o) plane of positions
 * at a time, the per-channel ops reading the plane's channel. */
static inline void tir_byoc_conv_epilogue(const tir_byoc_epilogue *epilogue, int first,
                                          const tir_byoc_conv *conv) {
  const int64_t plane = tir_byoc_conv_volume(conv->out);
  float *y = (float *)conv->y;
  if (first >= epilogue->count) return;
  if (conv->layout == TIR_BYOC_CONV_CHANNELS_LAST) {
    tir_byoc_run_epilogue(epilogue, first, y, conv->n * plane, conv->o);
    return;
  }
  for (int64_t p = 0; p < conv->n * conv->o; ++p) {
    float *row = y + p * plane;
    const int64_t channel = p % conv->o;
    for (int i = first; i < epilogue->count; ++i) {
      const tir_byoc_op *op = &epilogue->op[i];
      if (op->code == TIR_BYOC_OP_BIAS || op->code == TIR_BYOC_OP_CHANNEL_SCALE) {
        const float t = ((const float *)op->tensor)[channel];
        if (op->code == TIR_BYOC_OP_BIAS)
          for (int64_t j = 0; j < plane; ++j) row[j] = row[j] + t;
        else
          for (int64_t j = 0; j < plane; ++j) row[j] = row[j] * t;
      } else {
        tir_byoc_op_span(op, row, p, 0, plane, plane); /* a residual: t[p * plane + j] */
      }
    }
  }
}

/* The conv entry point's shape arguments, after weight_layout. */
#define TIR_BYOC_CONV_SHAPE_PARAMS_                                                            \
  int64_t n, int64_t c, int64_t o, int64_t groups, int64_t i0, int64_t i1, int64_t i2,         \
      int64_t o0, int64_t o1, int64_t o2, int64_t k0, int64_t k1, int64_t k2, int64_t s0,      \
      int64_t s1, int64_t s2, int64_t d0, int64_t d1, int64_t d2, int64_t p0, int64_t p1,      \
      int64_t p2

/* Fill `conv` (not its pointers and epilogue) from the shape arguments. */
#define TIR_BYOC_CONV_OF_PARAMS_(conv)                                                         \
  do {                                                                                         \
    const int64_t shape_[6][3] = {{i0, i1, i2}, {o0, o1, o2}, {k0, k1, k2},                     \
                                  {s0, s1, s2}, {d0, d1, d2}, {p0, p1, p2}};                    \
    int64_t *fields_[6] = {(conv).in, (conv).out, (conv).kernel,                               \
                           (conv).stride, (conv).dilation, (conv).pad};                         \
    for (int f_ = 0; f_ < 6; ++f_) memcpy(fields_[f_], shape_[f_], sizeof shape_[f_]);         \
    (conv).dtypes = dtypes, (conv).layout = (tir_byoc_conv_layout)layout;                      \
    (conv).weight_layout = (tir_byoc_conv_weight_layout)weight_layout;                          \
    (conv).n = n, (conv).c = c, (conv).o = o, (conv).groups = groups;                          \
  } while (0)

/* Decode the epilogue of a conv call (the gemm entry point's decoding, rows = n * positions). */
static inline int32_t tir_byoc_conv_decode_epilogue(tir_byoc_conv *conv, int64_t ops,
                                                    const double *constants,
                                                    const void *const *tensors) {
  tir_byoc_call call;
  int32_t status;
  memset(&call, 0, sizeof call);
  call.m = conv->n * tir_byoc_conv_volume(conv->out), call.n = conv->o;
  status = tir_byoc_decode_epilogue(&call, ops, constants, tensors);
  conv->epilogue = call.epilogue;
  return status;
}

typedef int32_t (*tir_byoc_conv_fn)(const tir_byoc_conv *conv);

#define TIR_BYOC_DEFINE_CONV(backend, impl)                                                    \
  TIR_BYOC_EXTERN_C TIR_BYOC_EXPORT int32_t tir_byoc_##backend##_conv(                         \
      const void *x, const void *w, void *y, int32_t dtypes, int32_t layout,                   \
      int32_t weight_layout, TIR_BYOC_CONV_SHAPE_PARAMS_, int64_t ops, double c0, double c1,   \
      double c2, double c3, double c4, double c5, const void *t0, const void *t1,              \
      const void *t2, const void *t3) {                                                        \
    const double constants[TIR_BYOC_MAX_CONSTANTS] = {c0, c1, c2, c3, c4, c5};                 \
    const void *const tensors[TIR_BYOC_MAX_TENSORS] = {t0, t1, t2, t3};                        \
    tir_byoc_conv conv;                                                                        \
    int32_t status;                                                                            \
    memset(&conv, 0, sizeof conv);                                                             \
    TIR_BYOC_CONV_OF_PARAMS_(conv);                                                            \
    conv.x = x, conv.w = w, conv.y = y;                                                        \
    if ((status = tir_byoc_check_conv(&conv)) != TIR_BYOC_OK) return status;                   \
    if (n > 0 && (x == NULL || w == NULL || y == NULL)) return TIR_BYOC_ENULL;                 \
    if ((status = tir_byoc_conv_decode_epilogue(&conv, ops, constants, tensors)) !=            \
        TIR_BYOC_OK)                                                                           \
      return status;                                                                           \
    return impl(&conv);                                                                        \
  }

#endif /* TIR_BYOC_H_ */
