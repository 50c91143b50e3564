/* The fp32 multiply-add peak of this machine's cores, measured: the rate no fp32 GEMM can pass.
 *
 * Usage: fma_peak THREADS
 * Prints one line, the best GFLOP/s of several timed runs, each thread running CHAINS
 * independent chains of vector multiply-adds in the widest vectors the compiler targets
 * (-march=native: 16 floats with AVX-512, 8 with AVX2).  CHAINS exceeds what a core needs to
 * hide the multiply-add's latency on both of its ports, and leaves registers for the two
 * constants, so the loop is bound by the multiply-add ports alone.  Built and run by
 * benchmarks/models.py (fma_gflops), which divides a model's GEMM FLOPs by this rate.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#if defined(__AVX512F__)
#define LANES 16
#elif defined(__AVX__)
#define LANES 8
#else
#define LANES 4
#endif
#define CHAINS 12

typedef float vec __attribute__((vector_size(LANES * sizeof(float))));

static volatile float sink;

static void *run_chains(void *arg) {
  long iterations = *(const long *)arg;
  vec acc[CHAINS];
  vec scale = (vec){0} + 0.999999f, shift = (vec){0} + 1e-7f;
  for (int c = 0; c < CHAINS; c++) acc[c] = (vec){0} + (float)c;
  for (long i = 0; i < iterations; i++) {
#pragma GCC unroll 12
    for (int c = 0; c < CHAINS; c++) acc[c] = acc[c] * scale + shift;
  }
  float total = 0.0f;
  for (int c = 0; c < CHAINS; c++)
    for (int lane = 0; lane < LANES; lane++) total += acc[c][lane];
  sink = total;
  return NULL;
}

static double seconds(long iterations, int threads) {
  pthread_t ids[threads];
  struct timespec start, end;
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (int t = 0; t < threads; t++) {
    if (pthread_create(&ids[t], NULL, run_chains, &iterations) != 0) {
      fprintf(stderr, "fma_peak: could not start thread %d of %d\n", t + 1, threads);
      exit(1);
    }
  }
  for (int t = 0; t < threads; t++) pthread_join(ids[t], NULL);
  clock_gettime(CLOCK_MONOTONIC, &end);
  return (double)(end.tv_sec - start.tv_sec) + 1e-9 * (double)(end.tv_nsec - start.tv_nsec);
}

int main(int argc, char **argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 1;
  if (threads < 1 || threads > 256) {
    fprintf(stderr, "fma_peak: THREADS must be 1-256, got %s\n", argv[1]);
    return 2;
  }
  long iterations = 1L << 20;
  while (seconds(iterations, threads) < 0.05) iterations *= 2;  /* about 0.05-0.1 s a run */
  double best = 0.0;
  for (int run = 0; run < 7; run++) {
    double flops = 2.0 * CHAINS * LANES * (double)iterations * threads;
    double rate = flops / seconds(iterations, threads) / 1e9;
    if (rate > best) best = rate;
  }
  printf("%.1f\n", best);
  return 0;
}
