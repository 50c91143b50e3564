/*
 * tir_byoc.h - the calling convention shared by every tir_byoc intrinsic.
 *
 * The offload pass replaces a matched loop nest by one call
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
 * A backend that serves the whole family writes one function and lets
 * TIR_BYOC_DEFINE_FAMILY (at the end of this file) define its eight entry points.
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

#ifdef __cplusplus
#define TIR_BYOC_EXTERN_C extern "C"
#else
#define TIR_BYOC_EXTERN_C
#endif

/* TIR_BYOC_DEFINE_FAMILY(backend, impl) defines the eight exported entry points
 *
 *     tir_byoc_<backend>_dense            tir_byoc_<backend>_matmul
 *     tir_byoc_<backend>_dense_bias       tir_byoc_<backend>_matmul_bias
 *     tir_byoc_<backend>_dense_relu       tir_byoc_<backend>_matmul_relu
 *     tir_byoc_<backend>_dense_bias_relu  tir_byoc_<backend>_matmul_bias_relu
 *
 * with the calling convention above (void pointers; extern "C" in C++), each returning
 *
 *     impl(x, w, bias, y, m, n, k, dtypes, layout, relu)
 *
 * where `impl` is the backend's function
 *
 *     int32_t impl(const void *x, const void *w, const void *bias, void *y, int64_t m,
 *                  int64_t n, int64_t k, int32_t dtypes, tir_byoc_layout layout, int relu);
 *
 * bias is NULL for the patterns without one (and for a bias pattern with n == 0), layout is
 * TIR_BYOC_LAYOUT_NK for dense and TIR_BYOC_LAYOUT_KN for matmul, relu is 1 for the *_relu
 * patterns.  A bias pattern called with bias == NULL and n > 0 returns TIR_BYOC_ENULL before
 * `impl` runs; every other check (dtypes and flags, tir_byoc_check_shape,
 * tir_byoc_check_pointers) is `impl`'s.  Use it once per backend, at file scope:
 *
 *     static int32_t ref_gemm(const void *x, ..., tir_byoc_layout layout, int relu) { ... }
 *     TIR_BYOC_DEFINE_FAMILY(ref, ref_gemm);
 */
#define TIR_BYOC_DEFINE_FAMILY(backend, impl)                                                  \
  TIR_BYOC_ENTRY_(backend, dense, impl, TIR_BYOC_LAYOUT_NK, 0)                                 \
  TIR_BYOC_BIAS_ENTRY_(backend, dense_bias, impl, TIR_BYOC_LAYOUT_NK, 0)                       \
  TIR_BYOC_ENTRY_(backend, dense_relu, impl, TIR_BYOC_LAYOUT_NK, 1)                            \
  TIR_BYOC_BIAS_ENTRY_(backend, dense_bias_relu, impl, TIR_BYOC_LAYOUT_NK, 1)                  \
  TIR_BYOC_ENTRY_(backend, matmul, impl, TIR_BYOC_LAYOUT_KN, 0)                                \
  TIR_BYOC_BIAS_ENTRY_(backend, matmul_bias, impl, TIR_BYOC_LAYOUT_KN, 0)                      \
  TIR_BYOC_ENTRY_(backend, matmul_relu, impl, TIR_BYOC_LAYOUT_KN, 1)                           \
  TIR_BYOC_BIAS_ENTRY_(backend, matmul_bias_relu, impl, TIR_BYOC_LAYOUT_KN, 1)                 \
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

#endif /* TIR_BYOC_H_ */
