/*
 * direct_onednn.cpp - oneDNN called directly from C++, without TVM or tir_byoc: the baseline
 * the benchmark compares tir_byoc's oneDNN intrinsics against (the "bridge overhead").
 *
 * usage: direct_onednn WARMUP REPEATS plain|prepacked|interleaved:LIBRARY LAYER [LAYER...]
 *   LAYER = M:N:K:DTYPES:LAYOUT:BIAS:RELU[:BATCH], DTYPES f32 | bf16 | u8s8 | s8s8,
 *   LAYOUT dense | matmul, BIAS and RELU 0 | 1, BATCH a count of 1 or more.
 * With BATCH the layer is a batched matmul, one product per batch index as a user of oneDNN
 * writes it: X (BATCH, M, K), the weight (BATCH, N, K) or (BATCH, K, N) and Y (BATCH, M, N),
 * all compact, described to oneDNN as 3-D tensors; the bias, if any, is one (N,) vector.  An
 * activation with leading batch dims over a 2-D weight needs no BATCH: fold them into M.
 * Primitives and memory objects are created once, as a hand-written program would; each timed
 * run executes every layer in order (a layer whose input has the previous layer's output shape
 * reads that output, so two layers make the seed MLP).  "prepacked" reorders each weight once
 * to the layout oneDNN prefers: a best case tir_byoc cannot use, as it never copies weights.
 * Prints the median milliseconds of a run and the implementation names.
 *
 * "interleaved:LIBRARY" measures the bridge without crossing processes: it loads tir_byoc's
 * compiled oneDNN intrinsics (LIBRARY) and, in every timed run, runs the layers once through
 * the primitives directly and once through the intrinsics (tir_byoc_onednn_<pattern>, on the
 * same buffers), alternating, so that both see the same machine; first it checks that both
 * compute the same outputs (exit status 1 if not).  Prints both medians.
 */
#include <oneapi/dnnl/dnnl.hpp>

#include "tir_byoc.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <dlfcn.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <new>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

using dt = dnnl::memory::data_type;
using dims = dnnl::memory::dims;

/* 64-byte aligned storage, as TVM allocates tensors: oneDNN's AMX and AVX-512 kernels run up
 * to 1.5x slower on buffers that start inside a cache line (std::vector gives 16 bytes). */
template <typename T>
struct Aligned64 {
  using value_type = T;
  Aligned64() = default;
  template <typename U>
  Aligned64(const Aligned64<U> &) {}
  T *allocate(size_t n) {
    return static_cast<T *>(::operator new(n * sizeof(T), std::align_val_t(64)));
  }
  void deallocate(T *p, size_t) { ::operator delete(p, std::align_val_t(64)); }
  template <typename U>
  bool operator==(const Aligned64<U> &) const { return true; }
  template <typename U>
  bool operator!=(const Aligned64<U> &) const { return false; }
};
using Buffer = std::vector<char, Aligned64<char>>;

struct Layer {
  int64_t m, n, k;
  int64_t batch;  // products per run: BATCH of a batched layer, else 1
  bool integer, bias, relu, dense, batched;
  int32_t signature;  // the intrinsic's dtype code
  void *x_data;
  dnnl::matmul primitive;
  std::string implementation;
  std::unordered_map<int, dnnl::memory> args;
  Buffer x, w, b, y;

  /* The exact int32 epilogue of the integer patterns, as the intrinsic applies it. */
  void IntegerEpilogue() {
    int32_t *out = reinterpret_cast<int32_t *>(y.data());
    const int32_t *add = reinterpret_cast<const int32_t *>(b.data());
    for (int64_t i = 0; i < batch * m; ++i) {  // Y is compact: every batch's rows in turn
      int32_t *row = out + i * n;
      if (bias)
        for (int64_t j = 0; j < n; ++j) row[j] += add[j];
      if (relu)
        for (int64_t j = 0; j < n; ++j) row[j] = std::max(row[j], 0);
    }
  }
};

/* buffer[i] = (i % modulus) * 0.25 - 0.5 as floats, i % modulus as unsigned integers,
 * i % modulus - 2 as signed ones (mixed signs, as in the random data tir_byoc is timed on). */
static void Fill(Buffer *buffer, dt type, int modulus) {
  const size_t size = dnnl::memory::data_type_size(type);
  for (size_t i = 0; i < buffer->size() / size; ++i) {
    const float value = static_cast<float>(i % modulus) * 0.25f - 0.5f;
    char *at = buffer->data() + i * size;
    if (type == dt::f32) {
      std::memcpy(at, &value, 4);
    } else if (type == dt::bf16) {
      uint32_t bits;
      std::memcpy(&bits, &value, 4);
      const uint16_t high = static_cast<uint16_t>(bits >> 16);  // exact: value has 3 bits
      std::memcpy(at, &high, 2);
    } else if (type == dt::s32) {
      const int32_t integer = static_cast<int32_t>(i % modulus) - 2;
      std::memcpy(at, &integer, 4);
    } else if (type == dt::s8) {
      *at = static_cast<char>(static_cast<int>(i % modulus) - 2);
    } else {
      *at = static_cast<char>(i % modulus);
    }
  }
}

static Layer Create(const std::string &spec, bool prepacked, dnnl::engine &engine,
                    dnnl::stream &stream, Layer *previous) {
  std::vector<std::string> f;
  std::stringstream in(spec);
  for (std::string part; std::getline(in, part, ':');) f.push_back(part);
  const auto one_of = [](const std::string &v, std::initializer_list<const char *> choices) {
    for (const char *choice : choices)
      if (v == choice) return true;
    return false;
  };
  const bool batched = f.size() == 8;
  const int64_t batch = batched ? std::atoll(f[7].c_str()) : 1;
  if ((f.size() != 7 && !batched) || !one_of(f[3], {"f32", "bf16", "u8s8", "s8s8"}) ||
      !one_of(f[4], {"dense", "matmul"}) || batch < 1) {
    std::fprintf(stderr,
                 "bad layer %s: expected M:N:K:DTYPES:LAYOUT:BIAS:RELU[:BATCH] with DTYPES f32, "
                 "bf16, u8s8 or s8s8, LAYOUT dense or matmul and BATCH 1 or more\n",
                 spec.c_str());
    std::exit(2);
  }
  Layer L;
  L.m = std::atoll(f[0].c_str()), L.n = std::atoll(f[1].c_str()), L.k = std::atoll(f[2].c_str());
  L.batch = batch, L.batched = batched;
  dt x_dt = dt::f32, w_dt = dt::f32, y_dt = dt::f32;
  if (f[3] == "bf16") x_dt = w_dt = dt::bf16;
  if (f[3] == "u8s8") x_dt = dt::u8, w_dt = dt::s8, y_dt = dt::s32;
  if (f[3] == "s8s8") x_dt = dt::s8, w_dt = dt::s8, y_dt = dt::s32;
  const bool dense = f[4] == "dense";
  L.bias = f[5] == "1", L.relu = f[6] == "1", L.integer = y_dt == dt::s32, L.dense = dense;
  const int32_t code_x = x_dt == dt::bf16 ? TIR_BYOC_BFLOAT16
                         : x_dt == dt::u8 ? TIR_BYOC_UINT8
                         : x_dt == dt::s8 ? TIR_BYOC_INT8
                                          : TIR_BYOC_FLOAT32;
  const int32_t code_w = w_dt == dt::bf16 ? TIR_BYOC_BFLOAT16
                         : w_dt == dt::s8 ? TIR_BYOC_INT8
                                          : TIR_BYOC_FLOAT32;
  L.signature = TIR_BYOC_SIGNATURE(code_x, code_w, L.integer ? TIR_BYOC_INT32 : TIR_BYOC_FLOAT32);
  // Step 1. Descriptors as the intrinsic builds them (the weight by strides, not copied); a
  // batched layer's are 3-D, each (rows, cols) matrix after the previous one.
  const auto matrix = [&](int64_t rows, int64_t cols, dt type, dims strides) {
    if (!batched) return dnnl::memory::desc({rows, cols}, type, strides);
    return dnnl::memory::desc({L.batch, rows, cols}, type,
                              dims{rows * cols, strides[0], strides[1]});
  };
  dnnl::memory::desc src = matrix(L.m, L.k, x_dt, dims{L.k, 1});
  dnnl::memory::desc plain_w = matrix(L.k, L.n, w_dt, dense ? dims{1, L.k} : dims{L.n, 1});
  dnnl::memory::desc any_w =
      batched ? dnnl::memory::desc({L.batch, L.k, L.n}, w_dt, dnnl::memory::format_tag::any)
              : dnnl::memory::desc({L.k, L.n}, w_dt, dnnl::memory::format_tag::any);
  dnnl::memory::desc dst = matrix(L.m, L.n, y_dt, dims{L.n, 1});
  dnnl::memory::desc bias_md;
  if (L.bias && !L.integer)
    bias_md = batched ? dnnl::memory::desc({1, 1, L.n}, y_dt, dims{L.n, L.n, 1})
                      : dnnl::memory::desc({1, L.n}, y_dt, dims{L.n, 1});
  dnnl::primitive_attr attr;
  if (L.relu && !L.integer) {
    dnnl::post_ops ops;
    ops.append_eltwise(dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    attr.set_post_ops(ops);
  }
  dnnl::matmul::primitive_desc desc(engine, src, prepacked ? any_w : plain_w, bias_md, dst, attr);
  L.primitive = dnnl::matmul(desc);
  L.implementation = desc.impl_info_str();
  // Step 2. Buffers with small deterministic values of their dtype, created once (bytes
  // i % 7 read as floats would be near-denormal, which slows some kernels down).
  L.x.resize(src.get_size()), L.w.resize(plain_w.get_size()), L.y.resize(dst.get_size());
  L.b.resize(static_cast<size_t>(L.n) * 4);
  Fill(&L.x, x_dt, 7), Fill(&L.w, w_dt, 5), Fill(&L.b, y_dt, 3);
  void *x_data = L.x.data();
  if (previous != nullptr && previous->m == L.m && previous->n == L.k &&
      previous->batch == L.batch && previous->batched == L.batched &&
      previous->integer == L.integer && x_dt == dt::f32)
    x_data = previous->y.data();
  L.x_data = x_data;
  L.args[DNNL_ARG_SRC] = dnnl::memory(src, engine, x_data);
  dnnl::memory weights(plain_w, engine, L.w.data());
  if (prepacked) {
    dnnl::memory packed(desc.weights_desc(), engine);
    dnnl::reorder(weights, packed).execute(stream, weights, packed);
    stream.wait();
    weights = packed;
  }
  L.args[DNNL_ARG_WEIGHTS] = weights;
  L.args[DNNL_ARG_DST] = dnnl::memory(dst, engine, L.y.data());
  if (L.bias && !L.integer) L.args[DNNL_ARG_BIAS] = dnnl::memory(bias_md, engine, L.b.data());
  return L;
}

using NoBias = int32_t (*)(const void *, const void *, void *, int64_t, int64_t, int64_t,
                          int32_t);
using WithBias = int32_t (*)(const void *, const void *, const void *, void *, int64_t, int64_t,
                             int64_t, int32_t);
/* The bmm_ entry points: the same, then batch0, batch1, x_stride0, x_stride1, w_stride0,
 * w_stride1 (tir_byoc.h). */
using BatchedNoBias = int32_t (*)(const void *, const void *, void *, int64_t, int64_t, int64_t,
                                  int32_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                                  int64_t);
using BatchedWithBias = int32_t (*)(const void *, const void *, const void *, void *, int64_t,
                                    int64_t, int64_t, int32_t, int64_t, int64_t, int64_t,
                                    int64_t, int64_t, int64_t);

/* The intrinsic serving ``L`` in the loaded library, by the registry's naming. */
static void *Intrinsic(void *library, const Layer &L) {
  std::string name = std::string("tir_byoc_onednn_") + (L.batched ? "bmm_" : "") +
                     (L.dense ? "dense" : "matmul") +
                     (L.bias ? "_bias" : "") + (L.relu ? "_relu" : "");
  void *symbol = dlsym(library, name.c_str());
  if (symbol == nullptr) {
    std::fprintf(stderr, "%s not found in the intrinsic library\n", name.c_str());
    std::exit(2);
  }
  return symbol;
}

static void RunDirect(std::vector<Layer> &layers, dnnl::stream &stream) {
  for (Layer &layer : layers) {
    layer.primitive.execute(stream, layer.args);
    stream.wait();
    if (layer.integer && (layer.bias || layer.relu)) layer.IntegerEpilogue();
  }
}

/* One layer through its intrinsic; a batched one as tir_byoc calls it for a single batch dim:
 * batch0 = 1 (strides 0), batch1 = BATCH with each operand's matrices back to back. */
static int32_t RunIntrinsic(Layer &L, void *symbol) {
  if (!L.batched)
    return L.bias ? reinterpret_cast<WithBias>(symbol)(L.x_data, L.w.data(), L.b.data(),
                                                       L.y.data(), L.m, L.n, L.k, L.signature)
                  : reinterpret_cast<NoBias>(symbol)(L.x_data, L.w.data(), L.y.data(), L.m, L.n,
                                                     L.k, L.signature);
  const int64_t x_stride = L.m * L.k, w_stride = L.k * L.n;
  return L.bias ? reinterpret_cast<BatchedWithBias>(symbol)(
                      L.x_data, L.w.data(), L.b.data(), L.y.data(), L.m, L.n, L.k, L.signature,
                      1, L.batch, 0, x_stride, 0, w_stride)
                : reinterpret_cast<BatchedNoBias>(symbol)(L.x_data, L.w.data(), L.y.data(), L.m,
                                                          L.n, L.k, L.signature, 1, L.batch, 0,
                                                          x_stride, 0, w_stride);
}

static void RunIntrinsics(std::vector<Layer> &layers, const std::vector<void *> &symbols) {
  for (size_t i = 0; i < layers.size(); ++i) {
    const int32_t status = RunIntrinsic(layers[i], symbols[i]);
    if (status != TIR_BYOC_OK) {
      std::fprintf(stderr, "intrinsic returned status %d\n", status);
      std::exit(1);
    }
  }
}

/* Whether the intrinsics compute what the primitives do, layer by layer (outputs within a
 * relative 1e-4 of each other; integer ones equal): a bridge timing compares like with like
 * only then.  Prints the first difference. */
static bool Agree(std::vector<Layer> &layers, dnnl::stream &stream,
                  const std::vector<void *> &symbols) {
  RunDirect(layers, stream);
  std::vector<Buffer> direct;
  for (const Layer &layer : layers) direct.push_back(layer.y);
  RunIntrinsics(layers, symbols);
  for (size_t i = 0; i < layers.size(); ++i) {
    const Layer &L = layers[i];
    for (size_t e = 0; e < L.y.size() / 4; ++e) {  // f32 or s32 outputs: 4 bytes each
      bool same;
      double expected, found;
      if (L.integer) {
        int32_t a, b;
        std::memcpy(&a, direct[i].data() + 4 * e, 4), std::memcpy(&b, L.y.data() + 4 * e, 4);
        same = a == b, expected = a, found = b;
      } else {
        float a, b;
        std::memcpy(&a, direct[i].data() + 4 * e, 4), std::memcpy(&b, L.y.data() + 4 * e, 4);
        same = std::abs(b - a) <= 1e-4f * std::max(1.0f, std::abs(a)), expected = a, found = b;
      }
      if (!same) {
        std::fprintf(stderr, "layer %zu, element %zu: the intrinsic gave %g, oneDNN %g\n", i,
                     e, found, expected);
        return false;
      }
    }
  }
  return true;
}

static double Median(std::vector<double> times) {
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

int main(int argc, char **argv) {
  if (argc < 5) {
    std::fprintf(stderr,
                 "usage: %s WARMUP REPEATS plain|prepacked|interleaved:LIBRARY LAYER [LAYER...]\n",
                 argv[0]);
    return 2;
  }
  const int warmup = std::atoi(argv[1]), repeats = std::atoi(argv[2]);
  const std::string mode = argv[3];
  const bool prepacked = mode == "prepacked";
  const bool interleaved = mode.rfind("interleaved:", 0) == 0;
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  std::vector<Layer> layers;
  layers.reserve(argc - 4);
  for (int i = 4; i < argc; ++i)
    layers.push_back(Create(argv[i], prepacked, engine, stream,
                            layers.empty() ? nullptr : &layers.back()));
  std::vector<void *> symbols;
  if (interleaved) {
    void *library = dlopen(mode.substr(12).c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (library == nullptr) {
      std::fprintf(stderr, "cannot load %s: %s\n", mode.substr(12).c_str(), dlerror());
      return 2;
    }
    for (const Layer &layer : layers) symbols.push_back(Intrinsic(library, layer));
    if (!Agree(layers, stream, symbols)) return 1;
  }
  // Step 3. Warm up, then time each run of all layers (interleaved: each way in turn).
  std::vector<double> direct, bridged;
  using clock = std::chrono::steady_clock;
  for (int r = 0; r < warmup + repeats; ++r) {
    const bool bridged_first = interleaved && r % 2 == 1;  // neither always runs second
    auto start = clock::now();
    bridged_first ? RunIntrinsics(layers, symbols) : RunDirect(layers, stream);
    auto middle = clock::now();
    if (interleaved) bridged_first ? RunDirect(layers, stream) : RunIntrinsics(layers, symbols);
    auto stop = clock::now();
    if (r < warmup) continue;
    const double first = std::chrono::duration<double, std::milli>(middle - start).count();
    const double second = std::chrono::duration<double, std::milli>(stop - middle).count();
    direct.push_back(bridged_first ? second : first);
    bridged.push_back(bridged_first ? first : second);
  }
  std::printf("%.6f", Median(direct));
  if (interleaved) std::printf(" %.6f", Median(bridged));
  for (const Layer &layer : layers) std::printf(" %s", layer.implementation.c_str());
  std::printf("\n");
  return 0;
}
