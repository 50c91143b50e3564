/*
 * tir_byoc_epilogue.h - the portable epilogue: the ops of a tir_byoc_epilogue run in C over an
 * fp32 output.  Included by tir_byoc.h; backends call tir_byoc_run_epilogue for the ops their
 * library does not fuse (all of them for OpenBLAS and the reference kernel).
 *
 * Each formula is written as TVM's lowering of the recognised TIR computes it (fp32
 * arithmetic, the same comparisons), so a NaN or an infinity gives what the TIR gives.  The
 * loops run one op over one row at a time: the row stays in cache across the ops, and the
 * arithmetic ones are plain loops gcc vectorises at -O3.
 */
#ifndef TIR_BYOC_EPILOGUE_H_
#define TIR_BYOC_EPILOGUE_H_

#include <math.h>

/* One op over `len` values of row i of an (., n) output, from column j0: row[0] is column j0.
 * A bias is read from column j0 on, a full tensor from element i * n + j0 on. */
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
      for (j = 0; j < len; ++j) row[j] = row[j] * (0.5f + erff(row[j] * c0) * 0.5f);
      break;
    case TIR_BYOC_OP_GELU_TANH:
      for (j = 0; j < len; ++j) {
        const float v = row[j];
        row[j] = 0.5f * v * (1.0f + tanhf(c0 * (v + c1 * (v * v * v))));
      }
      break;
    case TIR_BYOC_OP_SILU:
      for (j = 0; j < len; ++j) row[j] = row[j] * (1.0f / (1.0f + expf(-row[j])));
      break;
    case TIR_BYOC_OP_SIGMOID:
      for (j = 0; j < len; ++j) row[j] = 1.0f / (1.0f + expf(-row[j]));
      break;
    case TIR_BYOC_OP_TANH:
      for (j = 0; j < len; ++j) row[j] = tanhf(row[j]);
      break;
    case TIR_BYOC_OP_CLIP:
      for (j = 0; j < len; ++j) {
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
    default: /* tir_byoc_decode_epilogue refused every other code */
      break;
  }
}

/* One op over row i of an (., n) output, all of it. */
static inline void tir_byoc_op_row(const tir_byoc_op *op, float *row, int64_t i, int64_t n) {
  tir_byoc_op_span(op, row, i, 0, n, n);
}

/* Ops first.. of `epilogue` over the (rows, n) row-major fp32 output y. */
static inline void tir_byoc_run_epilogue(const tir_byoc_epilogue *epilogue, int first, float *y,
                                         int64_t rows, int64_t n) {
  if (first >= epilogue->count) return;
  for (int64_t i = 0; i < rows; ++i) {
    float *row = y + i * n;
    for (int o = first; o < epilogue->count; ++o) tir_byoc_op_row(&epilogue->op[o], row, i, n);
  }
}

#endif /* TIR_BYOC_EPILOGUE_H_ */
