/*
 * direct_onednn.cpp - oneDNN called directly from C++, without TVM or tir_byoc: the baseline
 * the benchmark compares tir_byoc's oneDNN intrinsics against (the "bridge overhead").
 *
 * usage: direct_onednn WARMUP REPEATS MODE LAYER [LAYER...]
 *   MODE = plain | prepacked | interleaved:LIBRARY, optionally followed by ,check:DIR
 *   LAYER = M:N:K:DTYPES:LAYOUT:BIAS:EPILOGUE[:BATCH], DTYPES f32 | bf16 | u8s8 | s8s8,
 *   LAYOUT dense | matmul, BIAS 0 | 1, BATCH a count of 1 or more.  EPILOGUE is 0 (none),
 *   1 (relu) or, for f32, the post-ops after the bias joined by '+' (gelu, silu+mul, add, ...;
 *   kOps below), each one oneDNN post-op of the primitive, at most one of add and mul.
 * With BATCH the layer is a batched matmul, one product per batch index as a user of oneDNN
 * writes it: X (BATCH, M, K), the weight (BATCH, N, K) or (BATCH, K, N) and Y (BATCH, M, N),
 * all compact, described to oneDNN as 3-D tensors; the bias, if any, is one (N,) vector.  An
 * activation with leading batch dims over a 2-D weight needs no BATCH: fold them into M.
 * Primitives and memory objects are created once, as a hand-written program would; each timed
 * run executes every layer in order.  A layer reads the previous layer's output as its input
 * if it has that shape (two layers make the seed MLP), else the previous layer's input if it
 * has the same (two projections of one activation); the tensor of its add or mul post-op is
 * the previous layer's output if that has this layer's output shape (the gated MLP's up
 * projection, gating the next layer), else a buffer of its own.  "prepacked" reorders each weight once
 * to the layout oneDNN prefers (format_tag::any), as a user of oneDNN who packs does; tir_byoc's
 * own packing (tir_byoc_onednn_pack) times this, the plain and the transposed weight instead.
 * Prints the median milliseconds of a run and the implementation names.
 *
 * "interleaved:LIBRARY" measures the bridge without crossing processes: it loads tir_byoc's
 * compiled oneDNN intrinsics (LIBRARY) and, in every timed run, runs the layers once through
 * the primitives directly and once through the intrinsics (tir_byoc_onednn_<pattern>, on the
 * same buffers; a layer with post-ops beyond relu through tir_byoc_onednn_gemm, its epilogue as
 * data), alternating, so that both see the same machine; first it checks that both compute the
 * same outputs (exit status 1 if not).  Prints both medians.
 *
 * ",check:DIR" times nothing: it reads each f32 operand a layer owns from DIR/<i>.<x|w|b|t>
 * (raw float32, layer i from 0; a missing file keeps the filled values) before any weight is
 * prepacked, runs every layer once and writes each output to DIR/<i>.y, for the benchmark's
 * numerical check.
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
#include <fstream>
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

/* An epilogue op of the EPILOGUE field: its oneDNN post-op (binary ones take a tensor of the
 * output's shape) and its op code and constants in tir_byoc's gemm entry point (tir_byoc.h),
 * the fp32 constants tir_byoc passes as doubles. */
struct OpSpec {
  const char *name;
  dnnl::algorithm algorithm;
  float alpha;
  bool tensor;
  int32_t code;
  double c0, c1;
};
static const OpSpec kOps[] = {
    {"relu", dnnl::algorithm::eltwise_relu, 0.0f, false, TIR_BYOC_OP_RELU, 0.0, 0.0},
    {"gelu", dnnl::algorithm::eltwise_gelu_erf, 0.0f, false, TIR_BYOC_OP_GELU,
     static_cast<float>(0.70710678118654752440), 0.0},
    {"gelu_tanh", dnnl::algorithm::eltwise_gelu_tanh, 0.0f, false, TIR_BYOC_OP_GELU_TANH,
     static_cast<float>(0.79788456080286535588), 0.044715f},
    {"silu", dnnl::algorithm::eltwise_swish, 1.0f, false, TIR_BYOC_OP_SILU, 0.0, 0.0},
    {"sigmoid", dnnl::algorithm::eltwise_logistic, 0.0f, false, TIR_BYOC_OP_SIGMOID, 0.0, 0.0},
    {"tanh", dnnl::algorithm::eltwise_tanh, 0.0f, false, TIR_BYOC_OP_TANH, 0.0, 0.0},
    {"add", dnnl::algorithm::binary_add, 0.0f, true, TIR_BYOC_OP_ADD, 0.0, 0.0},
    {"mul", dnnl::algorithm::binary_mul, 0.0f, true, TIR_BYOC_OP_MUL, 0.0, 0.0},
};

static const OpSpec *FindOp(const std::string &name) {
  for (const OpSpec &op : kOps)
    if (name == op.name) return &op;
  return nullptr;
}

struct Layer {
  int64_t m, n, k;
  int64_t batch;  // products per run: BATCH of a batched layer, else 1
  bool integer, bias, relu, dense, batched;
  std::vector<const OpSpec *> ops;  // the post-ops after the bias; relu alone sets `relu`
  int32_t signature;  // the intrinsic's dtype code
  void *x_data, *t_data;  // t: the tensor of the add or mul post-op, if any
  dnnl::matmul primitive;
  std::string implementation;
  std::unordered_map<int, dnnl::memory> args;
  Buffer x, w, b, t, y;

  /* Whether tir_byoc serves it through the gemm entry point (an epilogue beyond relu). */
  bool Gemm() const { return !ops.empty() && !relu; }

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

/* The MODE argument. */
struct Options {
  bool prepacked = false;
  std::string library;  // interleaved:LIBRARY
  std::string data;     // check:DIR
};

/* Fill the operands layer `index` owns from DIR/<index>.<x|w|b|t> where present (check:DIR);
 * exit status 2 for a file of the wrong size or for an operand read from the previous layer. */
static void Load(Layer *L, const std::string &dir, size_t index) {
  const std::pair<char, Buffer *> owned[] = {{'x', &L->x}, {'w', &L->w}, {'b', &L->b},
                                             {'t', &L->t}};
  for (const auto &[name, buffer] : owned) {
    const std::string path = dir + "/" + std::to_string(index) + "." + name;
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    if (!in) continue;
    const bool shared = (name == 'x' && L->x_data != L->x.data()) ||
                        (name == 't' && L->t_data != L->t.data());
    if (shared || L->integer || static_cast<size_t>(in.tellg()) != buffer->size()) {
      std::fprintf(stderr, "%s: expected %zu bytes of float32 that layer %zu owns\n",
                   path.c_str(), shared || L->integer ? 0 : buffer->size(), index);
      std::exit(2);
    }
    in.seekg(0);
    in.read(buffer->data(), static_cast<std::streamsize>(buffer->size()));
  }
}

static Layer Create(const std::string &spec, const Options &options, size_t index,
                    dnnl::engine &engine, dnnl::stream &stream, Layer *previous) {
  const bool prepacked = options.prepacked;
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
  // The EPILOGUE field: 0, 1 (relu), or post-op names joined by '+' (f32 only).
  std::vector<const OpSpec *> ops;
  bool ops_known = f.size() >= 7, one_tensor = true;
  if (ops_known && f[6] == "1") ops.push_back(FindOp("relu"));
  if (ops_known && f[6] != "0" && f[6] != "1") {
    std::stringstream names(f[6]);
    int tensors = 0;
    for (std::string name; std::getline(names, name, '+');) {
      const OpSpec *op = FindOp(name);
      ops_known = ops_known && op != nullptr;
      if (op != nullptr) ops.push_back(op), tensors += op->tensor;
    }
    ops_known = ops_known && !ops.empty() && f[3] == "f32";
    one_tensor = tensors <= 1;
  }
  if ((f.size() != 7 && !batched) || !one_of(f[3], {"f32", "bf16", "u8s8", "s8s8"}) ||
      !one_of(f[4], {"dense", "matmul"}) || batch < 1 || !ops_known || !one_tensor) {
    std::fprintf(stderr,
                 "bad layer %s: expected M:N:K:DTYPES:LAYOUT:BIAS:EPILOGUE[:BATCH] with DTYPES "
                 "f32, bf16, u8s8 or s8s8, LAYOUT dense or matmul, EPILOGUE 0, 1 or (f32) "
                 "post-ops joined by '+' of relu, gelu, gelu_tanh, silu, sigmoid, tanh, add, mul "
                 "(at most one of add and mul) and BATCH 1 or more\n",
                 spec.c_str());
    std::exit(2);
  }
  Layer L;
  L.ops = ops;
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
  // The post-ops, as tir_byoc fuses them: eltwise ops, and binary ones on a tensor of the
  // output's shape (dst's descriptor).
  dnnl::primitive_attr attr;
  dnnl::post_ops post_ops;
  int tensor_post = -1;
  for (size_t i = 0; i < L.ops.size() && !L.integer; ++i) {
    if (L.ops[i]->tensor) {
      post_ops.append_binary(L.ops[i]->algorithm, dst);
      tensor_post = static_cast<int>(i);
    } else {
      post_ops.append_eltwise(L.ops[i]->algorithm, L.ops[i]->alpha, 0.0f);
    }
  }
  attr.set_post_ops(post_ops);
  dnnl::matmul::primitive_desc desc(engine, src, prepacked ? any_w : plain_w, bias_md, dst, attr);
  L.primitive = dnnl::matmul(desc);
  L.implementation = desc.impl_info_str();
  // Step 2. Buffers with small deterministic values of their dtype, created once (bytes
  // i % 7 read as floats would be near-denormal, which slows some kernels down).
  L.x.resize(src.get_size()), L.w.resize(plain_w.get_size()), L.y.resize(dst.get_size());
  L.b.resize(static_cast<size_t>(L.n) * 4);
  Fill(&L.x, x_dt, 7), Fill(&L.w, w_dt, 5), Fill(&L.b, y_dt, 3);
  // Step 3. What the layer reads from the previous one (see the top of this file).
  const bool follows = previous != nullptr && previous->batch == L.batch &&
                       previous->batched == L.batched && previous->integer == L.integer &&
                       x_dt == dt::f32 && previous->m == L.m;
  void *x_data = L.x.data();
  if (follows && previous->n == L.k)
    x_data = previous->y.data();
  else if (follows && previous->k == L.k)
    x_data = previous->x_data;
  L.x_data = x_data;
  L.t_data = nullptr;
  if (tensor_post >= 0) {
    L.t.resize(dst.get_size());
    Fill(&L.t, y_dt, 11);
    L.t_data = follows && previous->n == L.n ? previous->y.data() : L.t.data();
    L.args[DNNL_ARG_ATTR_MULTIPLE_POST_OP(tensor_post) | DNNL_ARG_SRC_1] =
        dnnl::memory(dst, engine, L.t_data);
  }
  L.args[DNNL_ARG_SRC] = dnnl::memory(src, engine, x_data);
  if (!options.data.empty()) Load(&L, options.data, index);
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
/* The gemm entry point: x, w, y, m, n, k, dtypes, layout, the batch, ops, c0..c5, t0..t3. */
using GemmEntry = int32_t (*)(const void *, const void *, void *, int64_t, int64_t, int64_t,
                              int32_t, int32_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                              int64_t, int64_t, double, double, double, double, double, double,
                              const void *, const void *, const void *, const void *);

/* The intrinsic serving ``L`` in the loaded library, by the registry's naming. */
static void *Intrinsic(void *library, const Layer &L) {
  std::string name = L.Gemm() ? std::string("tir_byoc_onednn_gemm")
                              : std::string("tir_byoc_onednn_") + (L.batched ? "bmm_" : "") +
                                    (L.dense ? "dense" : "matmul") + (L.bias ? "_bias" : "") +
                                    (L.relu ? "_relu" : "");
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

/* A layer through the gemm entry point, its epilogue as data: the bias, then the post-ops,
 * each op's code in one byte, its constants and tensor in op order (tir_byoc.h). */
static int32_t RunGemm(Layer &L, void *symbol) {
  int64_t codes = 0;
  int count = 0, used_c = 0, used_t = 0;
  double c[TIR_BYOC_MAX_CONSTANTS] = {0.0};
  const void *t[TIR_BYOC_MAX_TENSORS] = {nullptr};
  if (L.bias) codes |= int64_t{TIR_BYOC_OP_BIAS} << (8 * count++), t[used_t++] = L.b.data();
  for (const OpSpec *op : L.ops) {
    codes |= int64_t{op->code} << (8 * count++);
    const int arity = tir_byoc_op_constants(op->code);
    if (arity > 0) c[used_c++] = op->c0;
    if (arity > 1) c[used_c++] = op->c1;
    if (op->tensor) t[used_t++] = L.t_data;
  }
  const int64_t batch1 = L.batched ? L.batch : 1;
  const int64_t x_stride = L.batched ? L.m * L.k : 0, w_stride = L.batched ? L.k * L.n : 0;
  const int32_t layout = L.dense ? TIR_BYOC_LAYOUT_NK : TIR_BYOC_LAYOUT_KN;
  return reinterpret_cast<GemmEntry>(symbol)(L.x_data, L.w.data(), L.y.data(), L.m, L.n, L.k,
                                             L.signature, layout, 1, batch1, 0, x_stride, 0,
                                             w_stride, codes, c[0], c[1], c[2], c[3], c[4], c[5],
                                             t[0], t[1], t[2], t[3]);
}

/* One layer through its intrinsic; a batched one as tir_byoc calls it for a single batch dim:
 * batch0 = 1 (strides 0), batch1 = BATCH with each operand's matrices back to back. */
static int32_t RunIntrinsic(Layer &L, void *symbol) {
  if (L.Gemm()) return RunGemm(L, symbol);
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

/* check:DIR: one run of every layer, each output to DIR/<i>.y (the inputs were loaded by
 * Create). */
static int Check(std::vector<Layer> &layers, dnnl::stream &stream, const std::string &dir) {
  RunDirect(layers, stream);
  for (size_t i = 0; i < layers.size(); ++i) {
    std::ofstream out(dir + "/" + std::to_string(i) + ".y", std::ios::binary);
    out.write(layers[i].y.data(), static_cast<std::streamsize>(layers[i].y.size()));
    if (!out) return 2;
  }
  return 0;
}

static double Median(std::vector<double> times) {
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

int main(int argc, char **argv) {
  if (argc < 5) {
    std::fprintf(stderr,
                 "usage: %s WARMUP REPEATS plain|prepacked|interleaved:LIBRARY[,check:DIR] "
                 "LAYER [LAYER...]\n",
                 argv[0]);
    return 2;
  }
  const int warmup = std::atoi(argv[1]), repeats = std::atoi(argv[2]);
  Options options;
  std::stringstream mode(argv[3]);
  for (std::string option; std::getline(mode, option, ',');) {
    if (option == "prepacked") {
      options.prepacked = true;
    } else if (option.rfind("interleaved:", 0) == 0) {
      options.library = option.substr(12);
    } else if (option.rfind("check:", 0) == 0) {
      options.data = option.substr(6);
    } else if (option != "plain") {
      std::fprintf(stderr, "bad mode %s: expected plain, prepacked or interleaved:LIBRARY, "
                   "optionally followed by ,check:DIR\n", argv[3]);
      return 2;
    }
  }
  const bool interleaved = !options.library.empty();
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  std::vector<Layer> layers;
  layers.reserve(argc - 4);
  for (int i = 4; i < argc; ++i)
    layers.push_back(Create(argv[i], options, layers.size(), engine, stream,
                            layers.empty() ? nullptr : &layers.back()));
  std::vector<void *> symbols;
  if (interleaved) {
    void *library = dlopen(options.library.c_str(), RTLD_NOW | RTLD_GLOBAL);
    if (library == nullptr) {
      std::fprintf(stderr, "cannot load %s: %s\n", options.library.c_str(), dlerror());
      return 2;
    }
    for (const Layer &layer : layers) symbols.push_back(Intrinsic(library, layer));
    if (!Agree(layers, stream, symbols)) return 1;
  }
  if (!options.data.empty()) return Check(layers, stream, options.data);
  // Step 4. Warm up, then time each run of all layers (interleaved: each way in turn).
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
