/*
 * mkl/gemm.c - the oneMKL intrinsics (fp32).  A product is one cblas_sgemm (sgemv for a single
 * row), a batched one cblas_sgemm_batch_strided, and a constant weight is multiplied in MKL's
 * packed storage (cblas_sgemm_compute).  The epilogue runs after the product, over the rows in
 * parallel, its erf, exp and tanh from MKL's vector math.  Symbols tir_byoc_mkl_<pattern>,
 * registry keys mkl.<pattern>; calling convention and status codes as in tir_byoc.h.
 *
 * Linked statically against the mkl-static wheel (GNU OpenMP threading layer) with its symbols
 * hidden, so that a PyTorch in the same process, which exports an MKL of its own, keeps it.
 *
 * Packed weights.  MKL's packed storage may not move once made (up to oneMKL 2024 its manual
 * forbids copying it to another address), so it cannot be made at build time and stored in a
 * model.  tir_byoc_mkl_pack makes a block of the plain weight under a header naming the call
 * (m, n, k, layout) and a 128-bit hash of the weight's bytes; the first call that meets the
 * block packs the weight into memory this library owns, kept for the life of the process and
 * found again by that hash and shape, so blocks with the same weight share one packing.
 */
#include <limits.h>
#include <mkl_cblas.h>
#include <mkl_service.h>
#include <mkl_vml_defines.h>
#include <mkl_vml_functions.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tir_byoc.h"

/* Step 1. The epilogue: one op over one row, the transcendental ones through MKL's vector
 * math (VM) in chunks; the other ops, and every formula, as tir_byoc_epilogue.h has them. */
enum { VM_CHUNK = 256 };
/* High accuracy (1 ulp), denormals kept as TVM's code keeps them, no errno or callback. */
static const MKL_INT64 kVmMode = VML_HA | VML_FTZDAZ_OFF | VML_ERRMODE_IGNORE;

static void mkl_op_row(const tir_byoc_op *op, float *row, int64_t i, int64_t n) {
  const float c0 = (float)op->c[0], c1 = (float)op->c[1];
  float t[VM_CHUNK];
  for (int64_t j0 = 0; j0 < n; j0 += VM_CHUNK) {
    float *v = row + j0;
    const int len = (int)(n - j0 < VM_CHUNK ? n - j0 : VM_CHUNK);
    int j;
    switch (op->code) {
      case TIR_BYOC_OP_GELU: /* z * (0.5 + erf(z * c0) * 0.5) */
        for (j = 0; j < len; ++j) t[j] = v[j] * c0;
        vmsErf(len, t, t, kVmMode);
        for (j = 0; j < len; ++j) v[j] = v[j] * (0.5f + t[j] * 0.5f);
        break;
      case TIR_BYOC_OP_GELU_TANH: /* 0.5 * z * (1 + tanh(c0 * (z + c1 * z^3))) */
        for (j = 0; j < len; ++j) t[j] = c0 * (v[j] + c1 * (v[j] * v[j] * v[j]));
        vmsTanh(len, t, t, kVmMode);
        for (j = 0; j < len; ++j) v[j] = 0.5f * v[j] * (1.0f + t[j]);
        break;
      case TIR_BYOC_OP_SILU: /* z * (1 / (1 + exp(-z))) */
        for (j = 0; j < len; ++j) t[j] = -v[j];
        vmsExp(len, t, t, kVmMode);
        for (j = 0; j < len; ++j) v[j] = v[j] * (1.0f / (1.0f + t[j]));
        break;
      case TIR_BYOC_OP_SIGMOID: /* 1 / (1 + exp(-z)) */
        for (j = 0; j < len; ++j) t[j] = -v[j];
        vmsExp(len, t, t, kVmMode);
        for (j = 0; j < len; ++j) v[j] = 1.0f / (1.0f + t[j]);
        break;
      case TIR_BYOC_OP_TANH:
        vmsTanh(len, v, v, kVmMode);
        break;
      default: /* the rest is plain arithmetic: the portable loops, over the whole row */
        tir_byoc_op_row(op, row, i, n);
        return;
    }
  }
}

/* The epilogue over rows [first_row, first_row + rows) of the (., n) output y; rows are
 * independent, so they are shared among the OpenMP threads when there are enough of them. */
static void mkl_epilogue(const tir_byoc_epilogue *epilogue, float *y, int64_t rows, int64_t n) {
  if (epilogue->count == 0 || rows == 0 || n == 0) return;
#pragma omp parallel for schedule(static) if (rows * n >= 16384)
  for (int64_t i = 0; i < rows; ++i)
    for (int o = 0; o < epilogue->count; ++o) mkl_op_row(&epilogue->op[o], y + i * n, i, n);
}

/* Step 2. Products.  MKL indexes with 32-bit ints (the LP64 interface). */
static int fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

/* y (m, n) = x (m, k) . w, w (n, k) for NK or (k, n) for KN, every operand compact. */
static void plain_product(const float *x, const float *w, float *y, MKL_INT m, MKL_INT n,
                          MKL_INT k, tir_byoc_layout layout) {
  const int nk = layout == TIR_BYOC_LAYOUT_NK;
  if (m == 0 || n == 0) return;
  if (k == 0) {
    memset(y, 0, sizeof(float) * (size_t)m * (size_t)n);
  } else if (m == 1) { /* y = W x for an (n, k) weight, W^T x for a (k, n) one */
    if (nk)
      cblas_sgemv(CblasRowMajor, CblasNoTrans, n, k, 1.0f, w, k, x, 1, 0.0f, y, 1);
    else
      cblas_sgemv(CblasRowMajor, CblasTrans, k, n, 1.0f, w, n, x, 1, 0.0f, y, 1);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, nk ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, x,
                k, w, nk ? k : n, 0.0f, y, n);
  }
}

/* The products of a batched call (tir_byoc.h), y compact; strides already checked to fit. */
static void batched_product(const float *x, const float *w, float *y, MKL_INT m, MKL_INT n,
                            MKL_INT k, tir_byoc_layout layout, const tir_byoc_batch *batch) {
  const int nk = layout == TIR_BYOC_LAYOUT_NK;
  const int64_t b0 = batch->count[0], b1 = batch->count[1];
  if (m == 0 || n == 0 || b0 == 0 || b1 == 0) return;
  if (k == 0) {
    memset(y, 0, sizeof(float) * (size_t)(b0 * b1 * m * n));
    return;
  }
  /* One strided batch over the dim whose index moves (both when dim 0 steps over whole
   * runs of dim 1), else one per index of dim 0.  A stride shorter than its matrix (0
   * broadcasts) is not given to MKL: those batches are a loop of plain products. */
  const int64_t *xs = batch->x_stride, *ws = batch->w_stride;
  const int flat = b0 == 1 || (xs[0] == b1 * xs[1] && ws[0] == b1 * ws[1]);
  const int64_t outer = b1 == 1 || flat ? 1 : b0, inner = b0 * b1 / outer;
  const int along = b1 == 1 ? 0 : 1; /* the dim the strided batch steps along */
  if (xs[along] < (int64_t)m * k || ws[along] < (int64_t)n * k) {
    for (int64_t i0 = 0; i0 < b0; ++i0)
      for (int64_t i1 = 0; i1 < b1; ++i1)
        plain_product(x + i0 * xs[0] + i1 * xs[1], w + i0 * ws[0] + i1 * ws[1],
                      y + (i0 * b1 + i1) * m * n, m, n, k, layout);
    return;
  }
  for (int64_t o = 0; o < outer; ++o)
    cblas_sgemm_batch_strided(CblasRowMajor, CblasNoTrans, nk ? CblasTrans : CblasNoTrans, m, n,
                              k, 1.0f, x + o * xs[0], k, (MKL_INT)xs[along], w + o * ws[0],
                              nk ? k : n, (MKL_INT)ws[along], 0.0f, y + o * b1 * m * n, n,
                              m * n, (MKL_INT)inner);
}

/* Step 3. Packed weights (see the top of this file). */
typedef struct {
  char magic[8]; /* "TBYCMKL" */
  uint64_t hash[2];
  int64_t m, n, k;
  int32_t layout, form;
  char reserved[8];
} pack_header;
_Static_assert(sizeof(pack_header) == 64, "the weight starts 64-byte aligned");
static const char kMagic[8] = "TBYCMKL";

/* A 128-bit hash of the weight's bytes: two 64-bit multiply-rotate lanes. */
static void weight_hash(const void *data, size_t bytes, uint64_t out[2]) {
  const unsigned char *p = (const unsigned char *)data;
  uint64_t a = 0x9E3779B97F4A7C15ull ^ bytes, b = 0xC2B2AE3D27D4EB4Full + bytes;
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t v;
    memcpy(&v, p + i, 8);
    a = (a ^ v) * 0xFF51AFD7ED558CCDull, a = (a << 31) | (a >> 33);
    b = (b + v) * 0xC4CEB9FE1A85EC53ull, b = (b << 29) | (b >> 35);
  }
  for (; i < bytes; ++i) a = (a ^ p[i]) * 0x100000001B3ull, b = (b + p[i]) * 0x9E3779B1ull;
  out[0] = a ^ (a >> 29), out[1] = b ^ (b >> 32);
}

typedef struct {
  uint64_t hash[2];
  int64_t m, n, k;
  int32_t layout;
  const float *packed;
} packing;

static pthread_mutex_t packings_lock = PTHREAD_MUTEX_INITIALIZER;
static packing *packings;
static size_t packings_count, packings_capacity;

/* MKL's packing of the block's weight, made on first use; NULL if memory ran out (the caller
 * then multiplies the plain weight the block holds). */
static const float *packed_weight(const pack_header *header) {
  const float *plain = (const float *)(header + 1);
  const float *found = NULL;
  pthread_mutex_lock(&packings_lock);
  for (size_t i = 0; i < packings_count && found == NULL; ++i) {
    const packing *p = &packings[i];
    if (memcmp(p->hash, header->hash, sizeof p->hash) == 0 && p->m == header->m &&
        p->n == header->n && p->k == header->k && p->layout == header->layout)
      found = p->packed;
  }
  if (found == NULL && packings_count == packings_capacity) {
    const size_t capacity = packings_capacity ? 2 * packings_capacity : 64;
    packing *grown = (packing *)realloc(packings, capacity * sizeof(packing));
    if (grown != NULL) packings = grown, packings_capacity = capacity;
  }
  if (found == NULL && packings_count < packings_capacity) {
    const MKL_INT m = (MKL_INT)header->m, n = (MKL_INT)header->n, k = (MKL_INT)header->k;
    const int nk = header->layout == TIR_BYOC_LAYOUT_NK;
    float *packed = (float *)mkl_malloc(cblas_sgemm_pack_get_size(CblasBMatrix, m, n, k), 64);
    if (packed != NULL) {
      cblas_sgemm_pack(CblasRowMajor, CblasBMatrix, nk ? CblasTrans : CblasNoTrans, m, n, k,
                       1.0f, plain, nk ? k : n, packed);
      packing *p = &packings[packings_count++];
      memcpy(p->hash, header->hash, sizeof p->hash);
      p->m = header->m, p->n = header->n, p->k = header->k, p->layout = header->layout;
      p->packed = found = packed;
    }
  }
  pthread_mutex_unlock(&packings_lock);
  return found;
}

/* Step 4. The gemm entry point, and the family's 2-D and batched functions through it. */
static int32_t mkl_call(const tir_byoc_call *call) {
  const int32_t flags = TIR_BYOC_FLAGS_OF(call->dtypes);
  const int packed = flags == TIR_BYOC_PACKED_WEIGHT;
  const tir_byoc_batch *batch = &call->batch;
  const int64_t count = batch->count[0] * batch->count[1];
  // Step 4.1. fp32 only; the one flag is a packed weight, for a call without batch.
  if (TIR_BYOC_SIGNATURE_OF(call->dtypes) != TIR_BYOC_SIG_F32 || (flags != 0 && !packed))
    return TIR_BYOC_EDTYPE;
  if (packed && count != 1) return TIR_BYOC_EDTYPE;
  if (!fits_int(call->m) || !fits_int(call->n) || !fits_int(call->k)) return TIR_BYOC_ESHAPE;
  if (!fits_int(call->m * call->n) || !fits_int(count)) return TIR_BYOC_ESHAPE;
  for (int d = 0; d < 2; ++d)
    if (!fits_int(batch->x_stride[d]) || !fits_int(batch->w_stride[d])) return TIR_BYOC_ESHAPE;
  const float *x = (const float *)call->x, *w = (const float *)call->w;
  float *y = (float *)call->y;
  const MKL_INT m = (MKL_INT)call->m, n = (MKL_INT)call->n, k = (MKL_INT)call->k;
  // Step 4.2. The product.
  if (packed) {
    const pack_header *header = (const pack_header *)w;
    if (memcmp(header->magic, kMagic, sizeof kMagic) != 0 ||
        header->form != TIR_BYOC_PACK_LIBRARY || header->m != m || header->n != n ||
        header->k != k || header->layout != (int32_t)call->layout)
      return TIR_BYOC_EPACKED;
    const float *library = m > 0 && n > 0 && k > 0 ? packed_weight(header) : NULL;
    if (library != NULL)
      cblas_sgemm_compute(CblasRowMajor, CblasNoTrans, CblasPacked, m, n, k, x, k, library,
                          k, 0.0f, y, n);
    else
      plain_product(x, (const float *)(header + 1), y, m, n, k, call->layout);
  } else if (count == 1) {
    plain_product(x, w, y, m, n, k, call->layout);
  } else {
    batched_product(x, w, y, m, n, k, call->layout, batch);
  }
  // Step 4.3. The epilogue, over every row of every batch index.
  mkl_epilogue(&call->epilogue, y, call->m * count, call->n);
  return TIR_BYOC_OK;
}

TIR_BYOC_DEFINE_GEMM(mkl, mkl_call);

/* A family entry point: the gemm entry point, its bias and relu passed as epilogue ops (the
 * relu's NaN rule, a flag of the family, becomes the op that keeps NaN). */
static int32_t mkl_batched(const void *x, const void *w, const void *bias, void *y, int64_t m,
                           int64_t n, int64_t k, int32_t dtypes, tir_byoc_layout layout,
                           int relu, const tir_byoc_batch *batch) {
  const int32_t flags = TIR_BYOC_FLAGS_OF(dtypes);
  const int64_t relu_op = (flags & TIR_BYOC_RELU_KEEPS_NAN) ? TIR_BYOC_OP_RELU_KEEP_NAN
                                                            : TIR_BYOC_OP_RELU;
  int64_t ops = 0;
  if (TIR_BYOC_SIGNATURE_OF(dtypes) != TIR_BYOC_SIG_F32) return TIR_BYOC_EDTYPE;
  if ((flags & ~TIR_BYOC_RELU_KEEPS_NAN) != 0) return TIR_BYOC_EDTYPE;
  if (bias != NULL) ops = TIR_BYOC_OP_BIAS;
  if (relu) ops |= relu_op << (bias != NULL ? 8 : 0);
  return tir_byoc_mkl_gemm(x, w, y, m, n, k, TIR_BYOC_SIG_F32, layout, batch->count[0],
                           batch->count[1], batch->x_stride[0], batch->x_stride[1],
                           batch->w_stride[0], batch->w_stride[1], ops, 0.0, 0.0, 0.0, 0.0, 0.0,
                           0.0, bias, NULL, NULL, NULL);
}

static int32_t mkl_gemm(const void *x, const void *w, const void *bias, void *y, int64_t m,
                        int64_t n, int64_t k, int32_t dtypes, tir_byoc_layout layout,
                        int relu) {
  const tir_byoc_batch one = {{1, 1}, {0, 0}, {0, 0}};
  return mkl_batched(x, w, bias, y, m, n, k, dtypes, layout, relu, &one);
}

TIR_BYOC_DEFINE_BATCHED_FAMILY(mkl, mkl_gemm, mkl_batched);

/* Step 5. Packing (the protocol of tir_byoc.h, TIR_BYOC_PACKED_WEIGHT). */
static double now_seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* One run of the product with MKL's packing `library`, or with the plain weight `w` if
 * `library` is NULL; seconds. */
static double time_product(const float *x, const float *w, const float *library, float *y,
                           MKL_INT m, MKL_INT n, MKL_INT k, tir_byoc_layout layout) {
  const double start = now_seconds();
  if (library != NULL)
    cblas_sgemm_compute(CblasRowMajor, CblasNoTrans, CblasPacked, m, n, k, x, k, library, k,
                        0.0f, y, n);
  else
    plain_product(x, w, y, m, n, k, layout);
  return now_seconds() - start;
}

/* The best of TIMED_RUNS runs of each form, after one warm-up of each, the two forms
 * alternated so that a machine getting slower or faster meanwhile favours neither. */
enum { TIMED_RUNS = 5 };
static void time_forms(const float *x, const float *w, const float *library, float *y,
                       MKL_INT m, MKL_INT n, MKL_INT k, tir_byoc_layout layout, double *plain,
                       double *packed) {
  *plain = *packed = 1e30;
  for (int run = 0; run <= TIMED_RUNS; ++run) {
    const double p = time_product(x, w, NULL, y, m, n, k, layout);
    const double q = time_product(x, w, library, y, m, n, k, layout);
    if (run == 0) continue;
    if (p < *plain) *plain = p;
    if (q < *packed) *packed = q;
  }
}

/* The form for a call of m rows: MKL's packing unless it is more than 2 % slower than the
 * plain weight.  Timed here, back to back, packing gained 0-5 % at 1024 rows of BERT's layers;
 * inside the model, where other products run between two calls, it gained 10-12 % (Intel Xeon
 * VM, 2026-11-26), so the rule leans to packing.  A single row, where the plain weight goes to
 * sgemv, stays plain: packed, 1 x 4096 -> 4096 took 29 % longer.  TIR_BYOC_MKL_PACK=library|plain
 * names the form instead (for tests). */
static int32_t choose_form(const float *w, MKL_INT m, MKL_INT n, MKL_INT k,
                           tir_byoc_layout layout, int any_m) {
  const char *setting = getenv("TIR_BYOC_MKL_PACK");
  if (any_m) return TIR_BYOC_PACK_PLAIN; /* MKL packs for one m */
  if (setting != NULL && strcmp(setting, "library") == 0) return TIR_BYOC_PACK_LIBRARY;
  if (setting != NULL && strcmp(setting, "plain") == 0) return TIR_BYOC_PACK_PLAIN;
  if (m == 0 || n == 0 || k == 0) return TIR_BYOC_PACK_PLAIN;
  const int nk = layout == TIR_BYOC_LAYOUT_NK;
  float *x = (float *)mkl_calloc((size_t)m * (size_t)k, sizeof(float), 64);
  float *y = (float *)mkl_malloc(sizeof(float) * (size_t)m * (size_t)n, 64);
  float *library = (float *)mkl_malloc(cblas_sgemm_pack_get_size(CblasBMatrix, m, n, k), 64);
  int32_t form = TIR_BYOC_PACK_PLAIN;
  if (x != NULL && y != NULL && library != NULL) {
    cblas_sgemm_pack(CblasRowMajor, CblasBMatrix, nk ? CblasTrans : CblasNoTrans, m, n, k, 1.0f,
                     w, nk ? k : n, library);
    double plain, packed;
    time_forms(x, w, library, y, m, n, k, layout, &plain, &packed);
    if (packed <= 1.02 * plain) form = TIR_BYOC_PACK_LIBRARY;
  }
  mkl_free(x), mkl_free(y), mkl_free(library);
  return form;
}

TIR_BYOC_EXTERN_C TIR_BYOC_EXPORT int32_t tir_byoc_mkl_pack(
    const void *w, int64_t m, int64_t n, int64_t k, int32_t dtypes, int32_t layout, int64_t ops,
    double c0, double c1, double c2, double c3, double c4, double c5, int32_t *form, void *out,
    int64_t *size) {
  (void)ops, (void)c0, (void)c1, (void)c2, (void)c3, (void)c4, (void)c5;
  if (form == NULL || size == NULL) return TIR_BYOC_ENULL;
  if (dtypes != TIR_BYOC_SIG_F32) return TIR_BYOC_EDTYPE;
  if (layout != TIR_BYOC_LAYOUT_NK && layout != TIR_BYOC_LAYOUT_KN) return TIR_BYOC_ESHAPE;
  if (!fits_int(m) || !fits_int(n) || !fits_int(k) || !fits_int(n * k)) return TIR_BYOC_ESHAPE;
  if (w == NULL && n > 0 && k > 0) return TIR_BYOC_ENULL;
  if ((*form == TIR_BYOC_PACK_CHOOSE || *form == TIR_BYOC_PACK_CHOOSE_ANY_M) && out == NULL)
    *form = choose_form((const float *)w, (MKL_INT)m, (MKL_INT)n, (MKL_INT)k,
                        (tir_byoc_layout)layout, *form == TIR_BYOC_PACK_CHOOSE_ANY_M);
  if (*form == TIR_BYOC_PACK_PLAIN) {
    if (out == NULL) *size = 0;
    return TIR_BYOC_OK;
  }
  if (*form != TIR_BYOC_PACK_LIBRARY) return TIR_BYOC_EPACKED; /* no transposed form here */
  const size_t bytes = sizeof(float) * (size_t)n * (size_t)k;
  if (out == NULL) {
    *size = (int64_t)(sizeof(pack_header) + bytes);
    return TIR_BYOC_OK;
  }
  pack_header *header = (pack_header *)out;
  memset(header, 0, sizeof *header);
  memcpy(header->magic, kMagic, sizeof kMagic);
  weight_hash(w, bytes, header->hash);
  header->m = m, header->n = n, header->k = k;
  header->layout = layout, header->form = TIR_BYOC_PACK_LIBRARY;
  if (bytes > 0) memcpy(header + 1, w, bytes);
  return TIR_BYOC_OK;
}
