/*
 * tir_byoc_epilogue.h - the portable epilogue: the ops of a tir_byoc_epilogue run in C over an
 * fp32 output.  Included by tir_byoc.h; backends call tir_byoc_run_epilogue for the ops their
 * library does not fuse (all of them for OpenBLAS and the reference kernel).
 *
 * Each formula is written as TVM's lowering of the recognised TIR computes it (fp32
 * arithmetic, the same comparisons), so a NaN or an infinity gives what the TIR gives.  The
 * loops run one op over one row at a time: the row stays in cache across the ops, and the
 * arithmetic ones are plain loops gcc vectorises at -O3.  The transcendental ones (the gelus,
 * silu, swish, sigmoid, tanh) call erff, tanhf or expf per value, which gcc cannot vectorise;
 * where glibc's vector math library serves this CPU they take 8 values a call (below).
 */
#ifndef TIR_BYOC_EPILOGUE_H_
#define TIR_BYOC_EPILOGUE_H_

#include <math.h>
#include <string.h>
#if defined(__SSE__)
#include <xmmintrin.h>
#endif

/* ------------------------------------------------------------------------------------------
 * glibc's vector math library (libmvec): its AVX2 variants of erff, tanhf (glibc 2.35 on) and
 * expf, found at run time with dlopen, so that a library built here and loaded on a machine
 * without them, or without AVX2, runs the scalar loops instead.  Around each call the op's
 * arithmetic is the formula of the scalar loop, in the same order and without fused
 * multiply-adds (the functions are compiled for AVX2 alone, not FMA): only the function
 * differs from libm's, by an ulp or two (glibc's tables of ulps), and both give libm's values
 * at NaN, the infinities and zeros.  They take a fraction of the scalar loops' time (make
 * bench-epilogue measures both; benchmarks/README.md).  Not with TIR_BYOC_STANDALONE (a
 * model built as plain C by tir_byoc.aot): no dlopen, no pthread, libm's functions only.
 */
#if defined(__x86_64__) && defined(__GNUC__) && defined(__GLIBC__) && \
    (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34)) && !defined(TIR_BYOC_STANDALONE)
#define TIR_BYOC_LIBMVEC 1
#include <dlfcn.h>
#include <immintrin.h>
#include <pthread.h>

/* The variants found, each NULL where absent; resolved once per library. */
typedef struct {
  void *erff, *tanhf, *expf;
} tir_byoc_libmvec_table;

static tir_byoc_libmvec_table tir_byoc_libmvec_found;

static inline void tir_byoc_libmvec_resolve(void) {
  void *library;
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2")) return;
  library = dlopen("libmvec.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == NULL) return;
  tir_byoc_libmvec_found.erff = dlsym(library, "_ZGVdN8v_erff");
  tir_byoc_libmvec_found.tanhf = dlsym(library, "_ZGVdN8v_tanhf");
  tir_byoc_libmvec_found.expf = dlsym(library, "_ZGVdN8v_expf");
}

static inline const tir_byoc_libmvec_table *tir_byoc_libmvec(void) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, tir_byoc_libmvec_resolve);
  return &tir_byoc_libmvec_found;
}

typedef __m256 (*tir_byoc_vector_fn)(__m256);

/* The leading multiple of 8 of `len` values of `row` through op `code` (a transcendental one)
 * with the variant `f`; returns how many values it did. */
__attribute__((target("avx2"))) static inline int64_t tir_byoc_vector_span(
    int32_t code, void *f, float c0, float c1, float *row, int64_t len) {
  const tir_byoc_vector_fn fn = (tir_byoc_vector_fn)f;
  const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
  const __m256 a = _mm256_set1_ps(c0), b = _mm256_set1_ps(c1);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  int64_t j;
  for (j = 0; j + 8 <= len; j += 8) {
    const __m256 v = _mm256_loadu_ps(row + j);
    __m256 r;
    switch (code) {
      case TIR_BYOC_OP_GELU: /* v * (0.5 + erf(v * c0) * 0.5) */
        r = _mm256_mul_ps(v, _mm256_add_ps(half, _mm256_mul_ps(fn(_mm256_mul_ps(v, a)), half)));
        break;
      case TIR_BYOC_OP_GELU_TANH: { /* 0.5 * v * (1 + tanh(c0 * (v + c1 * (v * v * v)))) */
        const __m256 cube = _mm256_mul_ps(_mm256_mul_ps(v, v), v);
        const __m256 u = _mm256_mul_ps(a, _mm256_add_ps(v, _mm256_mul_ps(b, cube)));
        r = _mm256_mul_ps(_mm256_mul_ps(half, v), _mm256_add_ps(one, fn(u)));
        break;
      }
      case TIR_BYOC_OP_SILU: /* v * (1 / (1 + exp(-v))) */
        r = _mm256_mul_ps(v, _mm256_div_ps(one, _mm256_add_ps(one, fn(_mm256_xor_ps(v, sign)))));
        break;
      case TIR_BYOC_OP_SIGMOID: /* 1 / (1 + exp(-v)) */
        r = _mm256_div_ps(one, _mm256_add_ps(one, fn(_mm256_xor_ps(v, sign))));
        break;
      case TIR_BYOC_OP_SWISH: { /* v * (1 / (1 + exp(-(c0 * v)))) */
        const __m256 e = fn(_mm256_xor_ps(_mm256_mul_ps(a, v), sign));
        r = _mm256_mul_ps(v, _mm256_div_ps(one, _mm256_add_ps(one, e)));
        break;
      }
      default: /* TIR_BYOC_OP_TANH */
        r = fn(v);
        break;
    }
    _mm256_storeu_ps(row + j, r);
  }
  return j;
}
#endif

/* How many leading values of `row` the vector variants computed through the transcendental op
 * `op` (0 where this build or machine has none; the scalar loop does the rest). */
static inline int64_t tir_byoc_vector_op(const tir_byoc_op *op, float *row, int64_t len) {
#ifdef TIR_BYOC_LIBMVEC
  const tir_byoc_libmvec_table *found = tir_byoc_libmvec();
  void *f = found->expf; /* silu, swish, sigmoid */
  if (op->code == TIR_BYOC_OP_GELU) f = found->erff;
  if (op->code == TIR_BYOC_OP_GELU_TANH || op->code == TIR_BYOC_OP_TANH) f = found->tanhf;
  if (f == NULL) return 0;
  return tir_byoc_vector_span(op->code, f, (float)op->c[0], (float)op->c[1], row, len);
#else
  (void)op, (void)row, (void)len;
  return 0;
#endif
}

/* The leading multiple of 4 of `len` values of `row` through the clip (lo c0, hi c1, NaN to
 * c2) with SSE's minps and maxps; returns how many values it did (0 where the compiler does
 * not target SSE, or the bounds are swapped).  gcc vectorises the scalar loop's nested
 * comparisons only into masks and blends, about twice the work of these.  minps(c1, v) is
 * `c1 < v ? c1 : v` and maxps(c0, t) is `c0 > t ? c0 : t`, as the instructions are defined for
 * NaN and signed zeros (the second operand when they do not compare), so with c0 <= c1 (or a
 * NaN bound, which every comparison fails) they give the scalar loop's value for every v;
 * a NaN v, which passes through both, is then replaced by c2. */
static inline int64_t tir_byoc_clip_span(float *row, int64_t len, float c0, float c1,
                                         float c2) {
#if defined(__SSE__)
  const __m128 lo = _mm_set1_ps(c0), hi = _mm_set1_ps(c1), nan = _mm_set1_ps(c2);
  int64_t j = 0;
  if (c0 > c1) return 0;
  for (; j + 4 <= len; j += 4) {
    const __m128 v = _mm_loadu_ps(row + j);
    const __m128 clipped = _mm_max_ps(lo, _mm_min_ps(hi, v));
    const __m128 unordered = _mm_cmpunord_ps(v, v);
    _mm_storeu_ps(row + j,
                  _mm_or_ps(_mm_and_ps(unordered, nan), _mm_andnot_ps(unordered, clipped)));
  }
  return j;
#else
  (void)row, (void)len, (void)c0, (void)c1, (void)c2;
  return 0;
#endif
}

/* Which functions the loops below call through the vector variants on this machine: bit 0
 * erff, bit 1 tanhf, bit 2 expf (tir_byoc_<backend>_vector_math, for reports and tests). */
static inline int32_t tir_byoc_vector_math(void) {
#ifdef TIR_BYOC_LIBMVEC
  const tir_byoc_libmvec_table *found = tir_byoc_libmvec();
  return (found->erff != NULL) | (found->tanhf != NULL) << 1 | (found->expf != NULL) << 2;
#else
  return 0;
#endif
}

/* One op over `len` values of row i of an (., n) output, from column j0: row[0] is column j0.
 * A bias or a layer scale is read from column j0 on, a full tensor from element i * n + j0 on. */
static inline void tir_byoc_op_span(const tir_byoc_op *op, float *row, int64_t i, int64_t j0,
                                    int64_t len, int64_t n) {
  const float c0 = (float)op->c[0], c1 = (float)op->c[1], c2 = (float)op->c[2];
  const float *t = (const float *)op->tensor;
  int64_t j;
  switch (op->code) {
    case TIR_BYOC_OP_SCALE:
      for (j = 0; j < len; ++j) row[j] = row[j] * c0;
      break;
    case TIR_BYOC_OP_DIV:
      for (j = 0; j < len; ++j) row[j] = row[j] / c0;
      break;
    case TIR_BYOC_OP_BIAS:
      for (j = 0; j < len; ++j) row[j] = row[j] + t[j0 + j];
      break;
    case TIR_BYOC_OP_RELU: /* NaN fails every comparison: v > 0 maps it to 0 */
      for (j = 0; j < len; ++j) row[j] = row[j] > 0.0f ? row[j] : 0.0f;
      break;
    case TIR_BYOC_OP_RELU_KEEP_NAN: /* ... and v < 0 keeps it */
      for (j = 0; j < len; ++j) row[j] = row[j] < 0.0f ? 0.0f : row[j];
      break;
    case TIR_BYOC_OP_GELU:
      for (j = tir_byoc_vector_op(op, row, len); j < len; ++j)
        row[j] = row[j] * (0.5f + erff(row[j] * c0) * 0.5f);
      break;
    case TIR_BYOC_OP_GELU_TANH:
      for (j = tir_byoc_vector_op(op, row, len); j < len; ++j) {
        const float v = row[j];
        row[j] = 0.5f * v * (1.0f + tanhf(c0 * (v + c1 * (v * v * v))));
      }
      break;
    case TIR_BYOC_OP_SILU:
      for (j = tir_byoc_vector_op(op, row, len); j < len; ++j)
        row[j] = row[j] * (1.0f / (1.0f + expf(-row[j])));
      break;
    case TIR_BYOC_OP_SIGMOID:
      for (j = tir_byoc_vector_op(op, row, len); j < len; ++j)
        row[j] = 1.0f / (1.0f + expf(-row[j]));
      break;
    case TIR_BYOC_OP_SWISH:
      for (j = tir_byoc_vector_op(op, row, len); j < len; ++j)
        row[j] = row[j] * (1.0f / (1.0f + expf(-(c0 * row[j]))));
      break;
    case TIR_BYOC_OP_TANH:
      for (j = tir_byoc_vector_op(op, row, len); j < len; ++j) row[j] = tanhf(row[j]);
      break;
    case TIR_BYOC_OP_CLIP:
      for (j = tir_byoc_clip_span(row, len, c0, c1, c2); j < len; ++j) {
        const float v = row[j];
        row[j] = v != v ? c2 : (v < c0 ? c0 : (v > c1 ? c1 : v));
      }
      break;
    case TIR_BYOC_OP_LEAKY_RELU:
      for (j = 0; j < len; ++j) row[j] = row[j] > 0.0f ? row[j] : c0 * row[j];
      break;
    case TIR_BYOC_OP_ADD:
      for (j = 0; j < len; ++j) row[j] = row[j] + t[i * n + j0 + j];
      break;
    case TIR_BYOC_OP_MUL:
      for (j = 0; j < len; ++j) row[j] = row[j] * t[i * n + j0 + j];
      break;
    case TIR_BYOC_OP_CHANNEL_SCALE:
      for (j = 0; j < len; ++j) row[j] = row[j] * t[j0 + j];
      break;
    case TIR_BYOC_OP_HARDSWISH: /* (z * clip(z + 3, 0, 6)) / 6; a NaN z gives NaN either way */
      for (j = 0; j < len; ++j) {
        const float v = row[j], s = v + 3.0f;
        row[j] = v * (s > 0.0f ? (s < 6.0f ? s : 6.0f) : 0.0f) / 6.0f;
      }
      break;
    default: /* tir_byoc_decode_epilogue refused every other code */
      break;
  }
}

/* One op over row i of an (., n) output, all of it. */
static inline void tir_byoc_op_row(const tir_byoc_op *op, float *row, int64_t i, int64_t n) {
  tir_byoc_op_span(op, row, i, 0, n, n);
}

/* Ops first.. of `epilogue` over rows [r0, r1) of the (., n) row-major fp32 output y. */
static inline void tir_byoc_epilogue_rows(const tir_byoc_epilogue *epilogue, int first, float *y,
                                          int64_t r0, int64_t r1, int64_t n) {
  for (int64_t i = r0; i < r1; ++i) {
    float *row = y + i * n;
    for (int o = first; o < epilogue->count; ++o) tir_byoc_op_row(&epilogue->op[o], row, i, n);
  }
}

/* Sharing the epilogue among TVM's threads (tir_byoc.h): each thread takes a block of rows,
 * and every value is computed by the same code whatever the split, so the result does not
 * depend on the number of threads.  Work is counted per value and op, a transcendental op as
 * TIR_BYOC_TRANSCENDENTAL_COST; below TIR_BYOC_SHARED_EPILOGUE one thread does it all: there
 * starting a second thread costs about what it saves.  A transcendental op gains from a
 * second thread at sizes where an add does not (make bench-epilogue measures where;
 * benchmarks/README.md). */
#define TIR_BYOC_TRANSCENDENTAL_COST 12
#define TIR_BYOC_SHARED_EPILOGUE (1 << 19)

typedef struct {
  const tir_byoc_epilogue *epilogue;
  int first, parts;
  float *y;
  int64_t rows, n;
  unsigned char done[TIR_BYOC_MAX_PARTS]; /* part s written */
} tir_byoc_epilogue_work;

static inline int tir_byoc_epilogue_part_(int task_id, tir_byoc_tvm_group_env *env,
                                          void *data) {
  tir_byoc_epilogue_work *work = (tir_byoc_epilogue_work *)data;
  for (int s = task_id; s < work->parts; s += env->num_task) {
    int64_t lo, hi;
    tir_byoc_part_range(work->rows, work->parts, s, 1, &lo, &hi);
    tir_byoc_epilogue_rows(work->epilogue, work->first, work->y, lo, hi, work->n);
    __atomic_store_n(&work->done[s], 1, __ATOMIC_RELEASE);
  }
  return 0;
}

/* How many parts ops first.. of `epilogue` over a (rows, n) output are cut into (1: not
 * shared). */
static inline int tir_byoc_epilogue_parts(const tir_byoc_epilogue *epilogue, int first,
                                          int64_t rows, int64_t n) {
  double work = 0;
  int threads;
  for (int o = first; o < epilogue->count; ++o) {
    const int32_t code = epilogue->op[o].code;
    const int transcendental = code == TIR_BYOC_OP_GELU || code == TIR_BYOC_OP_GELU_TANH ||
                               code == TIR_BYOC_OP_SILU || code == TIR_BYOC_OP_SWISH ||
                               code == TIR_BYOC_OP_SIGMOID || code == TIR_BYOC_OP_TANH;
    work += (double)rows * (double)n * (transcendental ? TIR_BYOC_TRANSCENDENTAL_COST : 1);
  }
  if (work < TIR_BYOC_SHARED_EPILOGUE) return 1;
  threads = tir_byoc_pool_threads();
  return rows < threads ? (int)(rows > 1 ? rows : 1) : threads;
}

/* Ops first.. of `epilogue` over the (rows, n) row-major fp32 output y, shared among TVM's
 * threads when it is large enough (above).  The ops are not idempotent (an add applied twice
 * is wrong), so after a launch that reports a failure only the parts it did not write are run
 * here; the launch has returned, so none is still running. */
static inline void tir_byoc_run_epilogue(const tir_byoc_epilogue *epilogue, int first, float *y,
                                         int64_t rows, int64_t n) {
  tir_byoc_epilogue_work work;
  if (first >= epilogue->count) return;
  memset(&work, 0, sizeof work);
  work.epilogue = epilogue, work.first = first, work.y = y, work.rows = rows, work.n = n;
  work.parts = tir_byoc_epilogue_parts(epilogue, first, rows, n);
  if (work.parts > 1 && TVMBackendParallelLaunch != NULL &&
      TVMBackendParallelLaunch(tir_byoc_epilogue_part_, &work, 0) == 0)
    return;
  for (int s = 0; s < work.parts; ++s) {
    int64_t lo, hi;
    if (__atomic_load_n(&work.done[s], __ATOMIC_ACQUIRE)) continue;
    tir_byoc_part_range(rows, work.parts, s, 1, &lo, &hi);
    tir_byoc_epilogue_rows(epilogue, first, y, lo, hi, n);
  }
}

/* TIR_BYOC_DEFINE_EPILOGUE_INFO(backend), in a backend whose epilogue ops run here (some or
 * all), exports for reports, tests and benchmarks
 *   tir_byoc_<backend>_vector_math(): tir_byoc_vector_math();
 *   tir_byoc_<backend>_epilogue_parts(ops, rows, n): how many parts tir_byoc_run_epilogue cuts
 *     the ops `ops` (codes as the gemm entry point takes them) over a (rows, n) output into,
 *     in the calling thread's TVM pool; minus the status for codes the gemm entry point
 *     refuses;
 *   tir_byoc_<backend>_epilogue(y, rows, n, ops, c0..c5, t0..t3): the whole epilogue in C
 *     (tir_byoc_run_epilogue) over the (rows, n) fp32 output y in place, its arguments as the
 *     gemm entry point takes them, and its status codes. */
#define TIR_BYOC_DEFINE_EPILOGUE_INFO(backend)                                                \
  TIR_BYOC_EXTERN_C TIR_BYOC_EXPORT int32_t tir_byoc_##backend##_vector_math(void) {          \
    return tir_byoc_vector_math();                                                            \
  }                                                                                           \
  TIR_BYOC_EXTERN_C TIR_BYOC_EXPORT int32_t tir_byoc_##backend##_epilogue_parts(              \
      int64_t ops, int64_t rows, int64_t n) {                                                 \
    const double constants[TIR_BYOC_MAX_CONSTANTS] = {0};                                     \
    const void *const tensors[TIR_BYOC_MAX_TENSORS] = {NULL};                                 \
    tir_byoc_call call; /* m = n = 0: the ops' tensors may be NULL */                         \
    int32_t status;                                                                           \
    memset(&call, 0, sizeof call);                                                            \
    if ((status = tir_byoc_decode_epilogue(&call, ops, constants, tensors)) != TIR_BYOC_OK)   \
      return -status;                                                                         \
    return tir_byoc_epilogue_parts(&call.epilogue, 0, rows, n);                               \
  }                                                                                           \
  TIR_BYOC_EXTERN_C TIR_BYOC_EXPORT int32_t tir_byoc_##backend##_epilogue(                    \
      void *y, int64_t rows, int64_t n, int64_t ops, double c0, double c1, double c2,         \
      double c3, double c4, double c5, const void *t0, const void *t1, const void *t2,        \
      const void *t3) {                                                                       \
    const double constants[TIR_BYOC_MAX_CONSTANTS] = {c0, c1, c2, c3, c4, c5};                \
    const void *const tensors[TIR_BYOC_MAX_TENSORS] = {t0, t1, t2, t3};                       \
    tir_byoc_call call;                                                                       \
    int32_t status;                                                                           \
    memset(&call, 0, sizeof call);                                                            \
    call.y = y, call.m = rows, call.n = n;                                                    \
    if (rows < 0 || n < 0) return TIR_BYOC_ESHAPE;                                            \
    if (y == NULL && rows > 0 && n > 0) return TIR_BYOC_ENULL;                                \
    if ((status = tir_byoc_decode_epilogue(&call, ops, constants, tensors)) != TIR_BYOC_OK)   \
      return status;                                                                          \
    tir_byoc_run_epilogue(&call.epilogue, 0, (float *)y, rows, n);                            \
    return TIR_BYOC_OK;                                                                       \
  }

#endif /* TIR_BYOC_EPILOGUE_H_ */
