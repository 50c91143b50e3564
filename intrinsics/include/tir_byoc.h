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

#endif /* TIR_BYOC_H_ */
