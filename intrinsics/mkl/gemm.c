/*
 * mkl/gemm.c - the oneMKL intrinsics (fp32).  A product is one cblas_sgemm (sgemv for a single
 * row), a batched one cblas_sgemm_batch_strided, and a constant weight is multiplied in MKL's
 * packed storage (cblas_sgemm_compute).  The epilogue runs after the product, on the part of the
 * output the same thread just wrote, its erf, exp and tanh from MKL's vector math.  Symbols
 * tir_byoc_mkl_<pattern>, registry keys mkl.<pattern>; calling convention and status codes as
 * in tir_byoc.h.
 *
 * Linked statically against the mkl-static wheel with its symbols hidden, so that a PyTorch in
 * the same process, which exports an MKL of its own, keeps it.
 *
 * Threads.  MKL is linked sequential, and a call shares its work among the threads of TVM's own
 * pool (TVMBackendParallelLaunch, which TVM's parallel loops use): the output's columns (a 2-D
 * product), rows (when it has too few columns, or a packed weight has many rows to serve) or
 * batch indices (a batched one), one part per thread, each part's epilogue run by the thread
 * that computed it.  With one pool for the whole model, no other pool's worker spins on a core
 * that TVM's next loop needs, and none has to be woken for the next call: with MKL's OpenMP
 * threads, 128-row products at two threads gained 1.6x over one thread, not 2x
 * (benchmarks/HISTORY.md).  Outside TVM's runtime (no TVMBackendParallelLaunch in the process)
 * the parts run one after the other.
 *
 * Packed weights.  MKL's packed storage may not move once made (up to oneMKL 2024 its manual
 * forbids copying it to another address), so it cannot be made at build time and stored in a
 * model.  tir_byoc_mkl_pack makes a block of the plain weight under a header naming the call
 * (m, n, k, layout) and a 128-bit hash of the weight's bytes; the first call that meets the
 * block packs the weight into memory this library owns, one packing per column part (one of
 * the whole weight when the rows are cut), kept for the life of the process and found again by
 * that hash, shape and number of parts, so blocks with the same weight share them.
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

/* Step 1. The epilogue: one op over part of a row, the transcendental ones through MKL's vector
 * math (VM) in chunks; the other ops, and every formula, as tir_byoc_epilogue.h has them. */
enum { VM_CHUNK = 256 };
/* High accuracy (1 ulp), denormals kept as TVM's code keeps them, no errno or callback. */
static const MKL_INT64 kVmMode = VML_HA | VML_FTZDAZ_OFF | VML_ERRMODE_IGNORE;

/* `op` over columns [j0, j0 + len) of row i of the (., n) output; `v0` points at column j0. */
static void mkl_op_span(const tir_byoc_op *op, float *v0, int64_t i, int64_t j0, int64_t len,
                        int64_t n) {
  const float c0 = (float)op->c[0], c1 = (float)op->c[1];
  float t[VM_CHUNK];
  for (int64_t c = 0; c < len; c += VM_CHUNK) {
    float *v = v0 + c;
    const int chunk = (int)(len - c < VM_CHUNK ? len - c : VM_CHUNK);
    int j;
    switch (op->code) {
      case TIR_BYOC_OP_GELU: /* z * (0.5 + erf(z * c0) * 0.5) */
        for (j = 0; j < chunk; ++j) t[j] = v[j] * c0;
        vmsErf(chunk, t, t, kVmMode);
        for (j = 0; j < chunk; ++j) v[j] = v[j] * (0.5f + t[j] * 0.5f);
        break;
      case TIR_BYOC_OP_GELU_TANH: /* 0.5 * z * (1 + tanh(c0 * (z + c1 * z^3))) */
        for (j = 0; j < chunk; ++j) t[j] = c0 * (v[j] + c1 * (v[j] * v[j] * v[j]));
        vmsTanh(chunk, t, t, kVmMode);
        for (j = 0; j < chunk; ++j) v[j] = 0.5f * v[j] * (1.0f + t[j]);
        break;
      case TIR_BYOC_OP_SILU: /* z * (1 / (1 + exp(-z))) */
        for (j = 0; j < chunk; ++j) t[j] = -v[j];
        vmsExp(chunk, t, t, kVmMode);
        for (j = 0; j < chunk; ++j) v[j] = v[j] * (1.0f / (1.0f + t[j]));
        break;
      case TIR_BYOC_OP_SWISH: /* z * (1 / (1 + exp(-(c0 * z)))) */
        for (j = 0; j < chunk; ++j) t[j] = -(c0 * v[j]);
        vmsExp(chunk, t, t, kVmMode);
        for (j = 0; j < chunk; ++j) v[j] = v[j] * (1.0f / (1.0f + t[j]));
        break;
      case TIR_BYOC_OP_SIGMOID: /* 1 / (1 + exp(-z)) */
        for (j = 0; j < chunk; ++j) t[j] = -v[j];
        vmsExp(chunk, t, t, kVmMode);
        for (j = 0; j < chunk; ++j) v[j] = 1.0f / (1.0f + t[j]);
        break;
      case TIR_BYOC_OP_TANH:
        vmsTanh(chunk, v, v, kVmMode);
        break;
      default: /* the rest is plain arithmetic: the portable loops, over the whole span */
        tir_byoc_op_span(op, v0, i, j0, len, n);
        return;
    }
  }
}

/* The epilogue over rows [r0, r1), columns [j0, j1) of the (., n) output y. */
static void mkl_epilogue(const tir_byoc_epilogue *epilogue, float *y, int64_t r0, int64_t r1,
                         int64_t j0, int64_t j1, int64_t n) {
  for (int64_t i = r0; i < r1; ++i)
    for (int o = 0; o < epilogue->count; ++o)
      mkl_op_span(&epilogue->op[o], y + i * n + j0, i, j0, j1 - j0, n);
}

/* Step 2. Products.  MKL indexes with 32-bit ints (the LP64 interface). */
static int fits_int(int64_t v) { return v >= 0 && v <= INT_MAX; }

/* Columns [j0, j0 + cols) of y (m, n) = x (m, k) . w, w (n, k) for NK or (k, n) for KN, every
 * operand compact. */
static void plain_product(const float *x, const float *w, float *y, MKL_INT m, MKL_INT n,
                          MKL_INT k, tir_byoc_layout layout, MKL_INT j0, MKL_INT cols) {
  const int nk = layout == TIR_BYOC_LAYOUT_NK;
  const float *b = nk ? w + (int64_t)j0 * k : w + j0;
  if (m == 0 || cols == 0) return;
  if (k == 0) {
    for (MKL_INT i = 0; i < m; ++i) memset(y + (int64_t)i * n + j0, 0, sizeof(float) * cols);
  } else if (m == 1) { /* y = W x for an (n, k) weight, W^T x for a (k, n) one */
    if (nk)
      cblas_sgemv(CblasRowMajor, CblasNoTrans, cols, k, 1.0f, b, k, x, 1, 0.0f, y + j0, 1);
    else
      cblas_sgemv(CblasRowMajor, CblasTrans, k, cols, 1.0f, b, n, x, 1, 0.0f, y + j0, 1);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, nk ? CblasTrans : CblasNoTrans, m, cols, k, 1.0f, x,
                k, b, nk ? k : n, 0.0f, y + j0, n);
  }
}

/* Batch indices [p0, p1) of a batched call (tir_byoc.h), flattened as i0 * count[1] + i1, into
 * their (m, n) matrices of the compact y; strides already checked to fit. */
static void batched_product(const float *x, const float *w, float *y, MKL_INT m, MKL_INT n,
                            MKL_INT k, tir_byoc_layout layout, const tir_byoc_batch *batch,
                            int64_t p0, int64_t p1) {
  const int nk = layout == TIR_BYOC_LAYOUT_NK;
  const int64_t b1 = batch->count[1], *xs = batch->x_stride, *ws = batch->w_stride;
  if (k == 0) {
    memset(y + p0 * m * n, 0, sizeof(float) * (size_t)((p1 - p0) * m * n));
    return;
  }
  /* A strided batch runs along dim 1 (dim 0 when dim 1 has one index), across dim 0 too when
   * dim 0 steps over whole runs of dim 1.  A stride shorter than its matrix (0 broadcasts) is
   * not given to MKL: those batches are a loop of plain products. */
  const int along = b1 == 1 ? 0 : 1;
  const int across =
      batch->count[0] == 1 || b1 == 1 || (xs[0] == b1 * xs[1] && ws[0] == b1 * ws[1]);
  const int strided = xs[along] >= (int64_t)m * k && ws[along] >= (int64_t)n * k;
  for (int64_t p = p0, end; p < p1; p = end) {
    const int64_t i0 = p / b1, i1 = p % b1;
    const float *xp = x + i0 * xs[0] + i1 * xs[1], *wp = w + i0 * ws[0] + i1 * ws[1];
    end = !strided ? p + 1 : across ? p1 : (i0 + 1) * b1 < p1 ? (i0 + 1) * b1 : p1;
    if (!strided)
      plain_product(xp, wp, y + p * m * n, m, n, k, layout, 0, n);
    else
      cblas_sgemm_batch_strided(CblasRowMajor, CblasNoTrans, nk ? CblasTrans : CblasNoTrans, m,
                                n, k, 1.0f, xp, k, (MKL_INT)xs[along], wp, nk ? k : n,
                                (MKL_INT)ws[along], 0.0f, y + p * m * n, n, m * n,
                                (MKL_INT)(end - p));
  }
}

/* Step 3. The work of a call, cut into parts that TVM's threads share (see the top). */

/* Below this many multiply-adds (m * n * k over the whole call) one thread does the work: waking
 * another costs more than it saves. */
#define MIN_SHARED_WORK (1 << 20)
/* Rows per thread from which a packed weight's call is cut by rows (see cut_work). */
#define PACKED_ROWS 256
/* Column parts start on a multiple of this many columns (one AVX-512 register of fp32). */
enum { COLUMN_ALIGN = 16 };

typedef enum { CUT_COLUMNS, CUT_ROWS, CUT_BATCHES } cut;

typedef struct {
  const tir_byoc_call *call; /* shapes, layout, batch and epilogue */
  const float *x, *w;        /* w: the plain weight, unless `packed` is set */
  const float *const *packed; /* MKL's packing of each column part, or NULL */
  float *y;
  cut how;
  int parts;
} call_work;

/* How `work` is cut: batch indices, else columns, else rows when there are too few columns for
 * every thread.  A packed weight is cut by columns (MKL packs each part) unless the call has
 * PACKED_ROWS rows per thread: then by rows, every thread reading one packing of the whole
 * weight (two threads, 1024 rows by BERT's 768 x 3072, 3072 x 768 and 768 x 768 weights: 2-18 %
 * faster, median 4 %, in 9 alternated pairs on the Intel Xeon VM; at 128 and 256 rows no
 * better).  A call with fewer than MIN_SHARED_WORK multiply-adds is one part. */
static void cut_work(call_work *work, int packed) {
  const tir_byoc_call *call = work->call;
  const int64_t m = call->m, n = call->n, count = call->batch.count[0] * call->batch.count[1];
  const double madds = (double)m * (double)n * (double)call->k * (double)count;
  const int64_t threads = madds < MIN_SHARED_WORK ? 1 : tir_byoc_pool_threads();
  const int64_t column_parts = n / COLUMN_ALIGN < threads ? n / COLUMN_ALIGN : threads;
  work->how = count > 1 ? CUT_BATCHES : CUT_COLUMNS, work->parts = 1;
  if (threads == 1) return;
  if (count > 1)
    work->parts = (int)(count < threads ? count : threads);
  else if (packed && m >= PACKED_ROWS * threads)
    work->how = CUT_ROWS, work->parts = (int)threads;
  else if (packed || column_parts == threads || m < threads)
    work->parts = column_parts < 1 ? 1 : (int)column_parts;
  else
    work->how = CUT_ROWS, work->parts = (int)threads;
}

/* An fp32 call of `count` (m, n, k) products without epilogue: what the cut is decided on, and
 * what the packing's timing runs. */
static tir_byoc_call product_call(const float *x, const float *w, float *y, int64_t m, int64_t n,
                                  int64_t k, int64_t count, tir_byoc_layout layout) {
  tir_byoc_call call;
  memset(&call, 0, sizeof call);
  call.x = x, call.w = w, call.y = y, call.m = m, call.n = n, call.k = k;
  call.dtypes = TIR_BYOC_SIG_F32, call.layout = layout;
  call.batch.count[0] = count, call.batch.count[1] = 1;
  return call;
}

/* How a call of this shape is cut in the calling thread's TVM pool (tests, and reading a
 * profile): returns the cut (0 columns, 1 rows, 2 batch indices) and sets *parts. */
TIR_BYOC_EXTERN_C TIR_BYOC_EXPORT int32_t tir_byoc_mkl_cut(int64_t m, int64_t n, int64_t k,
                                                           int64_t count, int32_t packed,
                                                           int32_t *parts) {
  const tir_byoc_call call = product_call(NULL, NULL, NULL, m, n, k, count, TIR_BYOC_LAYOUT_NK);
  call_work work = {&call, NULL, NULL, NULL, NULL, CUT_COLUMNS, 1};
  cut_work(&work, packed);
  if (parts != NULL) *parts = work.parts;
  return (int32_t)work.how;
}

/* How many column parts MKL's packing of the call's weight has: one per part of a column cut,
 * one (the whole weight) otherwise. */
static int packed_parts(const call_work *work) {
  return work->how == CUT_COLUMNS ? work->parts : 1;
}

static void run_part(const call_work *work, int s) {
  const tir_byoc_call *call = work->call;
  const MKL_INT m = (MKL_INT)call->m, n = (MKL_INT)call->n, k = (MKL_INT)call->k;
  int64_t lo, hi;
  switch (work->how) {
    case CUT_COLUMNS:
      tir_byoc_part_range(n, work->parts, s, COLUMN_ALIGN, &lo, &hi);
      if (lo == hi) return;
      if (work->packed != NULL)
        cblas_sgemm_compute(CblasRowMajor, CblasNoTrans, CblasPacked, m, (MKL_INT)(hi - lo), k,
                            work->x, k, work->packed[s], k, 0.0f, work->y + lo, n);
      else
        plain_product(work->x, work->w, work->y, m, n, k, call->layout, (MKL_INT)lo,
                      (MKL_INT)(hi - lo));
      mkl_epilogue(&call->epilogue, work->y, 0, m, lo, hi, n);
      break;
    case CUT_ROWS:
      tir_byoc_part_range(m, work->parts, s, 1, &lo, &hi);
      if (lo == hi) return;
      if (work->packed != NULL)
        cblas_sgemm_compute(CblasRowMajor, CblasNoTrans, CblasPacked, (MKL_INT)(hi - lo), n, k,
                            work->x + lo * k, k, work->packed[0], k, 0.0f, work->y + lo * n, n);
      else
        plain_product(work->x + lo * k, work->w, work->y + lo * n, (MKL_INT)(hi - lo), n, k,
                      call->layout, 0, n);
      mkl_epilogue(&call->epilogue, work->y, lo, hi, 0, n, n);
      break;
    case CUT_BATCHES:
      tir_byoc_part_range(call->batch.count[0] * call->batch.count[1], work->parts, s, 1, &lo, &hi);
      if (lo == hi) return;
      batched_product(work->x, work->w, work->y, m, n, k, call->layout, &call->batch, lo, hi);
      mkl_epilogue(&call->epilogue, work->y, lo * m, hi * m, 0, n, n);
      break;
  }
}

static int run_parts(int task_id, tir_byoc_tvm_group_env *env, void *data) {
  const call_work *work = (const call_work *)data;
  for (int s = task_id; s < work->parts; s += env->num_task) run_part(work, s);
  return 0;
}

/* Every part of `work`: on TVM's pool when there is more than one and the pool is there.  A
 * launch that reports a failure is run again here: each part writes its output whole, so a
 * part run twice gives the same result. */
static void run_work(const call_work *work) {
  if (work->parts > 1 && TVMBackendParallelLaunch != NULL &&
      TVMBackendParallelLaunch(run_parts, (void *)work, 0) == 0)
    return;
  for (int s = 0; s < work->parts; ++s) run_part(work, s);
}

/* Step 4. Packed weights (see the top of this file). */
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
  int32_t layout, parts;
  float **part; /* MKL's packing of each column part; never moves, as callers hold it */
} packing;

static pthread_mutex_t packings_lock = PTHREAD_MUTEX_INITIALIZER;
static packing *packings;
static size_t packings_count, packings_capacity;

static void free_parts(float **part, int parts) {
  for (int s = 0; s < parts; ++s) mkl_free(part[s]), part[s] = NULL;
}

/* MKL's packing of each of `parts` column parts of the plain weight w (see run_part); false,
 * with nothing left allocated, if memory ran out. */
static int pack_parts(const float *w, MKL_INT m, MKL_INT n, MKL_INT k, tir_byoc_layout layout,
                      int parts, float **part) {
  const int nk = layout == TIR_BYOC_LAYOUT_NK;
  for (int s = 0; s < parts; ++s) part[s] = NULL;
  for (int s = 0; s < parts; ++s) {
    int64_t lo, hi;
    tir_byoc_part_range(n, parts, s, COLUMN_ALIGN, &lo, &hi);
    const MKL_INT cols = (MKL_INT)(hi - lo);
    if (cols == 0) continue;
    part[s] = (float *)mkl_malloc(cblas_sgemm_pack_get_size(CblasBMatrix, m, cols, k), 64);
    if (part[s] == NULL) {
      free_parts(part, s);
      return 0;
    }
    cblas_sgemm_pack(CblasRowMajor, CblasBMatrix, nk ? CblasTrans : CblasNoTrans, m, cols, k,
                     1.0f, nk ? w + lo * k : w + lo, nk ? k : n, part[s]);
  }
  return 1;
}

/* MKL's packing of the block's weight in `parts` column parts, made on first use; NULL if
 * memory ran out (the caller then multiplies the plain weight the block holds). */
static const float *const *packed_weight(const pack_header *header, int parts) {
  const float *plain = (const float *)(header + 1);
  const float *const *found = NULL;
  pthread_mutex_lock(&packings_lock);
  for (size_t i = 0; i < packings_count && found == NULL; ++i) {
    const packing *p = &packings[i];
    if (memcmp(p->hash, header->hash, sizeof p->hash) == 0 && p->m == header->m &&
        p->n == header->n && p->k == header->k && p->layout == header->layout &&
        p->parts == parts)
      found = (const float *const *)p->part;
  }
  if (found == NULL && packings_count == packings_capacity) {
    const size_t capacity = packings_capacity ? 2 * packings_capacity : 64;
    packing *grown = (packing *)realloc(packings, capacity * sizeof(packing));
    if (grown != NULL) packings = grown, packings_capacity = capacity;
  }
  if (found == NULL && packings_count < packings_capacity) {
    packing *p = &packings[packings_count];
    p->part = (float **)malloc(sizeof(float *) * (size_t)parts);
    if (p->part != NULL &&
        !pack_parts(plain, (MKL_INT)header->m, (MKL_INT)header->n, (MKL_INT)header->k,
                    (tir_byoc_layout)header->layout, parts, p->part))
      free(p->part), p->part = NULL;
    if (p->part != NULL) {
      memcpy(p->hash, header->hash, sizeof p->hash);
      p->m = header->m, p->n = header->n, p->k = header->k;
      p->layout = header->layout, p->parts = parts;
      found = (const float *const *)p->part;
      ++packings_count;
    }
  }
  pthread_mutex_unlock(&packings_lock);
  return found;
}

/* Step 5. The gemm entry point, and the family's 2-D and batched functions through it. */
static int32_t mkl_call(const tir_byoc_call *call) {
  const int32_t flags = TIR_BYOC_FLAGS_OF(call->dtypes);
  const int packed = flags == TIR_BYOC_PACKED_WEIGHT;
  const tir_byoc_batch *batch = &call->batch;
  const int64_t count = batch->count[0] * batch->count[1];
  // Step 5.1. fp32 only; the one flag is a packed weight, for a call without batch.
  if (TIR_BYOC_SIGNATURE_OF(call->dtypes) != TIR_BYOC_SIG_F32 || (flags != 0 && !packed))
    return TIR_BYOC_EDTYPE;
  if (packed && count != 1) return TIR_BYOC_EDTYPE;
  if (!fits_int(call->m) || !fits_int(call->n) || !fits_int(call->k)) return TIR_BYOC_ESHAPE;
  if (!fits_int(call->m * call->n) || !fits_int(count)) return TIR_BYOC_ESHAPE;
  for (int d = 0; d < 2; ++d)
    if (!fits_int(batch->x_stride[d]) || !fits_int(batch->w_stride[d])) return TIR_BYOC_ESHAPE;
  const int64_t m = call->m, n = call->n, k = call->k;
  call_work work = {call, (const float *)call->x, (const float *)call->w, NULL,
                    (float *)call->y, CUT_COLUMNS, 1};
  if (packed) {
    const pack_header *header = (const pack_header *)call->w;
    if (memcmp(header->magic, kMagic, sizeof kMagic) != 0 ||
        header->form != TIR_BYOC_PACK_LIBRARY || header->m != m || header->n != n ||
        header->k != k || header->layout != (int32_t)call->layout)
      return TIR_BYOC_EPACKED;
    work.w = (const float *)(header + 1);
  }
  if (m == 0 || n == 0 || count == 0) return TIR_BYOC_OK;
  // Step 5.2. The parts, and for a packed weight MKL's packing made for them.
  cut_work(&work, packed);
  if (packed && k > 0)
    work.packed = packed_weight((const pack_header *)call->w, packed_parts(&work));
  // Step 5.3. The products and their epilogues.
  run_work(&work);
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

/* Step 6. Packing (the protocol of tir_byoc.h, TIR_BYOC_PACKED_WEIGHT). */
static double now_seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* One run of `work`, cut and shared as a call would run it; seconds. */
static double time_work(const call_work *work) {
  const double start = now_seconds();
  run_work(work);
  return now_seconds() - start;
}

/* The best of TIMED_RUNS runs of each form, after one warm-up of each, the two forms
 * alternated so that a machine getting slower or faster meanwhile favours neither. */
enum { TIMED_RUNS = 5 };
static void time_forms(const call_work *plain_work, const call_work *packed_work, double *plain,
                       double *packed) {
  *plain = *packed = 1e30;
  for (int run = 0; run <= TIMED_RUNS; ++run) {
    const double p = time_work(plain_work), q = time_work(packed_work);
    if (run == 0) continue;
    if (p < *plain) *plain = p;
    if (q < *packed) *packed = q;
  }
}

/* The form for a call of m rows: MKL's packing unless it is more than 2 % slower than the
 * plain weight, each form cut into parts as a call would cut it.  Timed here, back to back,
 * packing gained 0-5 % at 1024 rows of BERT's layers; inside the model, where other products run
 * between two calls, it gained 10-12 % (Intel Xeon VM, 2026-11-26), so the rule leans to
 * packing.  A single row, where the plain weight goes to sgemv, stays plain: packed, 1 x 4096 ->
 * 4096 took 29 % longer.  TIR_BYOC_MKL_PACK=library|plain names the form instead (for tests). */
static int32_t choose_form(const float *w, MKL_INT m, MKL_INT n, MKL_INT k,
                           tir_byoc_layout layout, int any_m) {
  const char *setting = getenv("TIR_BYOC_MKL_PACK");
  if (any_m) return TIR_BYOC_PACK_PLAIN; /* MKL packs for one m */
  if (setting != NULL && strcmp(setting, "library") == 0) return TIR_BYOC_PACK_LIBRARY;
  if (setting != NULL && strcmp(setting, "plain") == 0) return TIR_BYOC_PACK_PLAIN;
  if (m == 0 || n == 0 || k == 0) return TIR_BYOC_PACK_PLAIN;
  float *x = (float *)mkl_calloc((size_t)m * (size_t)k, sizeof(float), 64);
  float *y = (float *)mkl_malloc(sizeof(float) * (size_t)m * (size_t)n, 64);
  const tir_byoc_call call = product_call(x, w, y, m, n, k, 1, layout);
  call_work plain = {&call, x, w, NULL, y, CUT_COLUMNS, 1}, packed = plain;
  cut_work(&plain, 0), cut_work(&packed, 1);
  float *part[TIR_BYOC_MAX_PARTS];
  int32_t form = TIR_BYOC_PACK_PLAIN;
  if (x != NULL && y != NULL && pack_parts(w, m, n, k, layout, packed_parts(&packed), part)) {
    packed.packed = (const float *const *)part;
    double plain_time, packed_time;
    time_forms(&plain, &packed, &plain_time, &packed_time);
    if (packed_time <= 1.02 * plain_time) form = TIR_BYOC_PACK_LIBRARY;
    free_parts(part, packed_parts(&packed));
  }
  mkl_free(x), mkl_free(y);
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
