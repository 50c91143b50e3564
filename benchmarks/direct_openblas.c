/*
 * direct_openblas.c - OpenBLAS (scipy-openblas32) called directly from C, without TVM or
 * tir_byoc: the baseline for tir_byoc's OpenBLAS intrinsics (fp32).
 *
 * usage: direct_openblas WARMUP REPEATS LAYER [LAYER...]
 *   LAYER = M:N:K:f32:LAYOUT:BIAS:RELU[:BATCH], LAYOUT dense | matmul, BIAS and RELU 0 | 1,
 *   BATCH (a batched matmul, compact operands as in the oneDNN harness) 1 or more.
 * Each timed run computes every layer the way a C programmer would with cblas: the bias
 * broadcast into the output, one sgemm (sgemv for one row) with beta = 1 per batch index, a
 * relu pass.  Layers chain like the oneDNN harness.  Prints the median milliseconds of a run
 * and the OpenBLAS core in use.
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
  int m, n, k, dense, bias, relu, batch;
  float *x, *w, *b, *y;
} Layer;

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static int compare(const void *a, const void *b) {
  double d = *(const double *)a - *(const double *)b;
  return (d > 0) - (d < 0);
}

static float *filled(size_t count, int modulus) {
  /* 64-byte aligned, as TVM allocates tensors (malloc gives 16 bytes). */
  size_t bytes = (count * sizeof(float) + 63) / 64 * 64;
  float *p = aligned_alloc(64, bytes > 0 ? bytes : 64);
  for (size_t i = 0; i < count; ++i) p[i] = (float)(i % modulus) * 0.25f - 1.0f;
  return p;
}

static void run(const Layer *L) {
  const size_t rows = (size_t)L->batch * L->m;
  if (L->bias)
    for (size_t i = 0; i < rows; ++i) memcpy(L->y + i * L->n, L->b, L->n * sizeof(float));
  float beta = L->bias ? 1.0f : 0.0f;
  for (int b = 0; b < L->batch; ++b) {
    const float *x = L->x + (size_t)b * L->m * L->k, *w = L->w + (size_t)b * L->n * L->k;
    float *y = L->y + (size_t)b * L->m * L->n;
    if (L->m == 1 && L->dense)
      scipy_cblas_sgemv(CblasRowMajor, CblasNoTrans, L->n, L->k, 1.0f, w, L->k, x, 1, beta, y,
                        1);
    else if (L->m == 1)
      scipy_cblas_sgemv(CblasRowMajor, CblasTrans, L->k, L->n, 1.0f, w, L->n, x, 1, beta, y, 1);
    else
      scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, L->dense ? CblasTrans : CblasNoTrans, L->m,
                        L->n, L->k, 1.0f, x, L->k, w, L->dense ? L->k : L->n, beta, y, L->n);
  }
  if (L->relu)
    for (size_t i = 0; i < rows * L->n; ++i) L->y[i] = L->y[i] > 0.0f ? L->y[i] : 0.0f;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s WARMUP REPEATS LAYER [LAYER...]\n", argv[0]);
    return 2;
  }
  int warmup = atoi(argv[1]), repeats = atoi(argv[2]), count = argc - 3;
  Layer *layers = calloc(count, sizeof(Layer));
  for (int i = 0; i < count; ++i) {
    Layer *L = &layers[i];
    char dtypes[16], layout[16];
    int end = 0, batch_end = 0;
    const char *spec = argv[3 + i];
    L->batch = 1;
    /* The whole spec must be read: sscanf alone would ignore a field it was not asked for. */
    if (sscanf(spec, "%d:%d:%d:%15[^:]:%15[^:]:%d:%d%n", &L->m, &L->n, &L->k, dtypes, layout,
               &L->bias, &L->relu, &end) != 7 ||
        (spec[end] != '\0' &&
         (sscanf(spec + end, ":%d%n", &L->batch, &batch_end) != 1 ||
          spec[end + batch_end] != '\0' || L->batch < 1)) ||
        strcmp(dtypes, "f32") != 0) {
      fprintf(stderr, "bad layer %s: expected M:N:K:f32:LAYOUT:BIAS:RELU[:BATCH]\n", spec);
      return 2;
    }
    L->dense = strcmp(layout, "dense") == 0;
    const size_t batch = (size_t)L->batch;
    L->x = (i > 0 && layers[i - 1].m == L->m && layers[i - 1].n == L->k &&
            layers[i - 1].batch == L->batch)
               ? layers[i - 1].y
               : filled(batch * L->m * L->k, 7);
    L->w = filled(batch * L->n * L->k, 5);
    L->b = filled((size_t)L->n, 3);
    L->y = filled(batch * L->m * L->n, 2);
  }
  double *times = malloc(repeats * sizeof(double));
  for (int r = 0; r < warmup + repeats; ++r) {
    double start = now_ms();
    for (int i = 0; i < count; ++i) run(&layers[i]);
    double stop = now_ms();
    if (r >= warmup) times[r - warmup] = stop - start;
  }
  qsort(times, repeats, sizeof(double), compare);
  printf("%.6f %s\n", times[repeats / 2], scipy_openblas_get_corename());
  return 0;
}
