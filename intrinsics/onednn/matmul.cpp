/*
 * onednn/matmul.cpp - the oneDNN intrinsics: every pattern of the family as one oneDNN matmul
 * primitive.  Symbols tir_byoc_onednn_<pattern>, registry keys onednn.<pattern>; calling
 * convention and status codes as in tir_byoc.h.
 *
 * - The weight is described to oneDNN by strides, never copied: a dense weight (N x K,
 *   row-major) is the (K, N) matrix with strides {1, K}, a matmul weight (K x N) has strides
 *   {N, 1}.
 * - Batched patterns (bmm_*) are one batched oneDNN matmul: each operand is a 4-D tensor
 *   (batch0, batch1, rows, cols) with the batch strides of the call; a dim along which an
 *   operand is broadcast (stride 0) has size 1, which oneDNN broadcasts.
 * - Floating point (fp32, and bf16 / fp16 inputs accumulated in fp32): the bias and the relu
 *   are fused into the primitive (bias argument, eltwise_relu post-op, which maps NaN to 0 as
 *   TVM's max(z, 0) does); a relu that must keep NaN (TIR_BYOC_RELU_KEEPS_NAN) is applied
 *   afterwards, in one pass.
 * - Integer (u8 / s8 inputs, s32 output): oneDNN applies biases and post-ops of an integer
 *   matmul in fp32, which rounds sums above 2^24; the primitive computes the exact s32
 *   product and the bias and relu are applied afterwards in int32, as the TIR does.
 * - Primitives are created once per (shape, dtypes, layout, epilogue) and kept in a bounded,
 *   thread-safe LRU cache (capacity $TIR_BYOC_ONEDNN_CACHE_CAPACITY, default 256).
 */
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "tir_byoc.h"

namespace {

using dt = dnnl::memory::data_type;

/* The dtype signatures this file implements, decoded from the packed code. */
struct Dtypes {
  dt x, w, y;
  bool integer;
};

/* Bits of oneDNN's dnnl_cpu_isa_t (a bit mask of instruction-set features) that a dtype needs
 * to be computed exactly: without VNNI oneDNN's int8 kernels sum pairs in saturating int16,
 * and bf16 / fp16 fall back to conversions tir_byoc does not vouch for.  The same policy as
 * DTYPE_CPU_FLAGS in tir_byoc/backends/onednn.py, checked here too so that a library built on
 * one machine and loaded on a lesser one refuses instead of computing a wrong result. */
constexpr uint32_t kIsaAny = 0;
constexpr uint32_t kIsaVnni = 0x8 | 0x40;  // avx2_vnni, avx512_core_vnni
constexpr uint32_t kIsaBf16 = 0x80;        // avx512_core_bf16 (and AMX)
constexpr uint32_t kIsaFp16 = 0x100;       // avx512_core_fp16

bool Decode(int32_t signature, Dtypes *out) {
  const int32_t f32 = TIR_BYOC_FLOAT32;
  struct Known {
    int32_t x, w, y;
    Dtypes dtypes;
    uint32_t isa;
  };
  static const Known kKnown[] = {
      {f32, f32, f32, {dt::f32, dt::f32, dt::f32, false}, kIsaAny},
      {TIR_BYOC_BFLOAT16, TIR_BYOC_BFLOAT16, f32, {dt::bf16, dt::bf16, dt::f32, false}, kIsaBf16},
      {TIR_BYOC_FLOAT16, TIR_BYOC_FLOAT16, f32, {dt::f16, dt::f16, dt::f32, false}, kIsaFp16},
      {TIR_BYOC_UINT8, TIR_BYOC_INT8, TIR_BYOC_INT32, {dt::u8, dt::s8, dt::s32, true}, kIsaVnni},
      {TIR_BYOC_INT8, TIR_BYOC_INT8, TIR_BYOC_INT32, {dt::s8, dt::s8, dt::s32, true}, kIsaVnni},
  };
  for (const Known &known : kKnown) {
    if (TIR_BYOC_SIGNATURE(known.x, known.w, known.y) == signature) {
      if (known.isa != kIsaAny &&
          (static_cast<uint32_t>(dnnl_get_effective_cpu_isa()) & known.isa) == 0)
        return false;
      *out = known.dtypes;
      return true;
    }
  }
  return false;
}

/* What a primitive is specialised for; `relu` is a fused relu post-op.  A 2-D product has
 * the batch {1, 1} with strides 0. */
struct Key {
  int64_t m, n, k;
  int32_t signature;
  tir_byoc_layout layout;
  bool bias, relu;
  tir_byoc_batch batch;

  bool operator==(const Key &o) const {
    return m == o.m && n == o.n && k == o.k && signature == o.signature && layout == o.layout &&
           bias == o.bias && relu == o.relu &&
           std::memcmp(&batch, &o.batch, sizeof batch) == 0;
  }
};

struct KeyHash {
  size_t operator()(const Key &key) const {
    uint64_t h = 1469598103934665603ull;
    const uint64_t parts[] = {static_cast<uint64_t>(key.m), static_cast<uint64_t>(key.n),
                              static_cast<uint64_t>(key.k), static_cast<uint64_t>(key.signature),
                              static_cast<uint64_t>(key.layout),
                              static_cast<uint64_t>(key.bias) << 1 | key.relu,
                              static_cast<uint64_t>(key.batch.count[0]),
                              static_cast<uint64_t>(key.batch.count[1]),
                              static_cast<uint64_t>(key.batch.x_stride[0]),
                              static_cast<uint64_t>(key.batch.x_stride[1]),
                              static_cast<uint64_t>(key.batch.w_stride[0]),
                              static_cast<uint64_t>(key.batch.w_stride[1])};
    for (uint64_t part : parts) h = (h ^ part) * 1099511628211ull;
    return static_cast<size_t>(h);
  }
};

/* A created primitive with the memory descriptors its arguments are wrapped in. */
struct Entry {
  dnnl::matmul primitive;
  dnnl::memory::desc src, weights, bias, dst;
  std::string implementation;  // oneDNN's name for the kernel it chose
  uint64_t id;                 // unique per creation, keys the per-thread argument cache
};

std::atomic<uint64_t> next_entry_id{1};

dnnl::engine &Engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::stream &Stream() {
  thread_local dnnl::stream stream(Engine());
  return stream;
}

using dims = dnnl::memory::dims;

bool IsBatched(const Key &key) { return key.batch.count[0] * key.batch.count[1] != 1; }

/* A (batch0, batch1, rows, cols) descriptor of an operand with the given batch strides; a
 * batch dim with stride 0 has size 1 (oneDNN broadcasts it).  2-D for a batch of one. */
dnnl::memory::desc Operand(const Key &key, const int64_t *batch_strides, int64_t rows,
                           int64_t cols, dt type, const dims &matrix_strides) {
  if (!IsBatched(key)) return dnnl::memory::desc({rows, cols}, type, matrix_strides);
  dims shape{1, 1, rows, cols}, strides{rows * cols, rows * cols, matrix_strides[0],
                                        matrix_strides[1]};
  for (int d = 0; d < 2; ++d) {
    if (batch_strides[d] != 0) {
      shape[d] = key.batch.count[d];
      strides[d] = batch_strides[d];
    }
  }
  return dnnl::memory::desc(shape, type, strides);
}

std::shared_ptr<const Entry> Create(const Key &key, const Dtypes &dtypes) {
  // Step 1. Plain row-major descriptors; the weight's layout is carried by its strides.
  dnnl::memory::desc src = Operand(key, key.batch.x_stride, key.m, key.k, dtypes.x, {key.k, 1});
  dims weight_strides = key.layout == TIR_BYOC_LAYOUT_NK ? dims{1, key.k} : dims{key.n, 1};
  dnnl::memory::desc weights =
      Operand(key, key.batch.w_stride, key.k, key.n, dtypes.w, weight_strides);
  const int64_t b1 = key.batch.count[1];
  dnnl::memory::desc dst =
      IsBatched(key) ? dnnl::memory::desc({key.batch.count[0], b1, key.m, key.n}, dtypes.y,
                                          dims{b1 * key.m * key.n, key.m * key.n, key.n, 1})
                     : dnnl::memory::desc({key.m, key.n}, dtypes.y, dims{key.n, 1});
  // Step 2. Fuse the epilogue (floating point only; see the file comment for integers).
  const bool fuse = !dtypes.integer;
  dnnl::memory::desc bias;
  if (fuse && key.bias)
    bias = IsBatched(key)
               ? dnnl::memory::desc({1, 1, 1, key.n}, dtypes.y, dims{key.n, key.n, key.n, 1})
               : dnnl::memory::desc({1, key.n}, dtypes.y, dims{key.n, 1});
  dnnl::primitive_attr attr;
  if (fuse && key.relu) {
    dnnl::post_ops ops;
    ops.append_eltwise(dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    attr.set_post_ops(ops);
  }
  dnnl::matmul::primitive_desc desc(Engine(), src, weights, bias, dst, attr);
  return std::make_shared<const Entry>(Entry{dnnl::matmul(desc), src, weights, bias, dst,
                                               desc.impl_info_str(), next_entry_id++});
}

/* A bounded LRU map Key -> Entry.  Entries are shared pointers, so an entry evicted while
 * another thread executes it stays alive until that execution ends. */
class PrimitiveCache {
 public:
  PrimitiveCache() : capacity_(InitialCapacity()) {}

  std::shared_ptr<const Entry> Get(const Key &key, const Dtypes &dtypes) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto found = index_.find(key);
      if (found != index_.end()) {
        ++hits_;
        order_.splice(order_.begin(), order_, found->second);
        return found->second->second;
      }
      ++misses_;
    }
    // Created outside the lock: creation takes ~0.1-1 ms and must not stall cache hits.
    std::shared_ptr<const Entry> entry = Create(key, dtypes);
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = index_.find(key);
    if (found != index_.end()) return found->second->second;  // another thread won the race
    order_.emplace_front(key, entry);
    index_[key] = order_.begin();
    Trim();
    return entry;
  }

  int64_t Capacity() const { return capacity_.load(std::memory_order_relaxed); }

  void SetCapacity(int64_t capacity) {
    std::lock_guard<std::mutex> lock(mutex_);
    capacity_ = capacity;
    Trim();
  }

  void Info(int64_t *out) {
    std::lock_guard<std::mutex> lock(mutex_);
    out[0] = static_cast<int64_t>(index_.size());
    out[1] = capacity_.load();
    out[2] = hits_;
    out[3] = misses_;
  }

 private:
  static int64_t InitialCapacity() {
    const char *text = std::getenv("TIR_BYOC_ONEDNN_CACHE_CAPACITY");
    if (text != nullptr) {
      char *end = nullptr;
      long long value = std::strtoll(text, &end, 10);
      if (end != text && *end == '\0' && value >= 0) return value;
    }
    return 256;
  }

  void Trim() {
    while (static_cast<int64_t>(index_.size()) > capacity_.load()) {
      index_.erase(order_.back().first);
      order_.pop_back();
    }
  }

  std::mutex mutex_;
  std::list<std::pair<Key, std::shared_ptr<const Entry>>> order_;  // most recent first
  std::unordered_map<Key, decltype(order_)::iterator, KeyHash> index_;
  std::atomic<int64_t> capacity_;
  int64_t hits_ = 0, misses_ = 0;
};

PrimitiveCache &Cache() {
  static PrimitiveCache cache;
  return cache;
}

/* The memory objects of one entry's arguments, created once per thread and re-pointed at the
 * caller's buffers on each call, so a call allocates nothing. */
struct BoundArgs {
  dnnl::memory src, weights, bias, dst;
  dnnl_exec_arg_t args[4];
  int count = 0;

  explicit BoundArgs(const Entry &entry) {
    dnnl::engine &engine = Engine();
    src = dnnl::memory(entry.src, engine, DNNL_MEMORY_NONE);
    weights = dnnl::memory(entry.weights, engine, DNNL_MEMORY_NONE);
    dst = dnnl::memory(entry.dst, engine, DNNL_MEMORY_NONE);
    args[count++] = {DNNL_ARG_SRC, src.get()};
    args[count++] = {DNNL_ARG_WEIGHTS, weights.get()};
    args[count++] = {DNNL_ARG_DST, dst.get()};
    if (!entry.bias.is_zero()) {
      bias = dnnl::memory(entry.bias, engine, DNNL_MEMORY_NONE);
      args[count++] = {DNNL_ARG_BIAS, bias.get()};
    }
  }
};

/* This thread's BoundArgs by entry id; cleared when it outgrows the primitive cache (entries
 * evicted there leave stale ids here). */
BoundArgs &Bind(const Entry &entry, int64_t capacity) {
  thread_local std::unordered_map<uint64_t, std::unique_ptr<BoundArgs>> bound;
  auto found = bound.find(entry.id);
  if (found != bound.end()) return *found->second;
  if (static_cast<int64_t>(bound.size()) >= 2 * capacity + 8) bound.clear();
  auto inserted = bound.emplace(entry.id, std::make_unique<BoundArgs>(entry));
  return *inserted.first->second;
}

dnnl_status_t Point(const dnnl::memory &memory, const void *data) {
  return dnnl_memory_set_data_handle(memory.get(), const_cast<void *>(data));
}

/* y = relu?(y + bias?) over an (m, n) row-major output; also the whole result when k == 0.
 * One branch-free pass per step, so the compiler vectorises them: a relu that branched per
 * element mispredicted on outputs of mixed sign and took longer than the int8 matmul itself. */
template <typename T>
void Epilogue(T *y, const T *bias, int64_t m, int64_t n, bool relu, bool keep_nan,
              bool from_zero) {
  for (int64_t i = 0; i < m; ++i) {
    T *row = y + i * n;
    if (from_zero) std::fill(row, row + n, T(0));
    if (bias != nullptr)
      for (int64_t j = 0; j < n; ++j) row[j] += bias[j];
    // NaN fails every comparison: v < 0 keeps it, v > 0 maps it to 0.
    if (relu && keep_nan)
      for (int64_t j = 0; j < n; ++j) row[j] = row[j] < T(0) ? T(0) : row[j];
    else if (relu)
      for (int64_t j = 0; j < n; ++j) row[j] = row[j] > T(0) ? row[j] : T(0);
  }
}

void ApplyEpilogue(const Dtypes &dtypes, void *y, const void *bias, int64_t m, int64_t n,
                   bool relu, bool keep_nan, bool from_zero) {
  if (dtypes.integer) {
    Epilogue(static_cast<int32_t *>(y), static_cast<const int32_t *>(bias), m, n, relu,
             keep_nan, from_zero);
  } else {
    Epilogue(static_cast<float *>(y), static_cast<const float *>(bias), m, n, relu, keep_nan,
             from_zero);
  }
}

constexpr tir_byoc_batch kNoBatch = {{1, 1}, {0, 0}, {0, 0}};

/* The whole family, batched or not (TIR_BYOC_DEFINE_BATCHED_FAMILY below); a NULL bias is a
 * pattern without one. */
int32_t BatchedGemm(const void *x, const void *w, const void *bias, void *y, int64_t m,
                    int64_t n, int64_t k, int32_t signature, tir_byoc_layout layout, int relu,
                    const tir_byoc_batch *batch) {
  // Step 1. Checks at entry: dtypes, flags, shape, batch, pointers (the entry point of a
  // bias pattern has refused a NULL bias already).
  const bool has_bias = bias != nullptr;
  const int32_t flags = TIR_BYOC_FLAGS_OF(signature);
  const bool keep_nan = (flags & TIR_BYOC_RELU_KEEPS_NAN) != 0;
  signature = TIR_BYOC_SIGNATURE_OF(signature);
  Dtypes dtypes;
  if (!Decode(signature, &dtypes) || (flags & ~TIR_BYOC_RELU_KEEPS_NAN) != 0)
    return TIR_BYOC_EDTYPE;
  int32_t status = tir_byoc_check_shape(m, n, k);
  if (status != TIR_BYOC_OK) return status;
  if ((status = tir_byoc_check_batch(batch, m, n, k)) != TIR_BYOC_OK) return status;
  status = tir_byoc_check_pointers(x, w, y, m, n, k);
  if (status != TIR_BYOC_OK) return status;
  const int64_t count = batch->count[0] * batch->count[1];
  if (m == 0 || n == 0 || count == 0) return TIR_BYOC_OK;
  // The epilogue passes below run over every batch's output at once: Y is compact.
  const int64_t rows = count * m;
  if (k == 0) {  // an empty sum: the epilogue of 0 (oneDNN rejects zero-sized K)
    ApplyEpilogue(dtypes, y, bias, rows, n, relu, keep_nan, true);
    return TIR_BYOC_OK;
  }
  try {
    // Step 2. The cached primitive, executed on the caller's buffers.
    const bool fused_relu = relu && !dtypes.integer && !keep_nan;
    // A batch of one is a 2-D product, whatever its strides: one cache entry for both.
    const tir_byoc_batch &key_batch = count == 1 ? kNoBatch : *batch;
    std::shared_ptr<const Entry> entry =
        Cache().Get(Key{m, n, k, signature, layout, has_bias, fused_relu, key_batch}, dtypes);
    BoundArgs &bound = Bind(*entry, Cache().Capacity());
    dnnl_status_t status_x = Point(bound.src, x), status_w = Point(bound.weights, w);
    dnnl_status_t status_y = Point(bound.dst, y);
    dnnl_status_t status_b = bound.count == 4 ? Point(bound.bias, bias) : dnnl_success;
    if (status_x != dnnl_success || status_w != dnnl_success || status_y != dnnl_success ||
        status_b != dnnl_success)
      return TIR_BYOC_EBACKEND;
    dnnl::stream &stream = Stream();
    if (dnnl_primitive_execute(entry->primitive.get(), stream.get(), bound.count, bound.args) !=
            dnnl_success ||
        dnnl_stream_wait(stream.get()) != dnnl_success)
      return TIR_BYOC_EBACKEND;
    // Step 3. The exact int32 epilogue of the integer patterns; a relu that keeps NaN.
    if (dtypes.integer && (has_bias || relu)) {
      ApplyEpilogue(dtypes, y, bias, rows, n, relu, keep_nan, false);
    } else if (relu && !fused_relu) {
      ApplyEpilogue(dtypes, y, nullptr, rows, n, true, keep_nan, false);
    }
  } catch (...) {
    return TIR_BYOC_EBACKEND;
  }
  return TIR_BYOC_OK;
}

/* One 2-D product: the batched primitive with a batch of one. */
int32_t Gemm(const void *x, const void *w, const void *bias, void *y, int64_t m, int64_t n,
             int64_t k, int32_t signature, tir_byoc_layout layout, int relu) {
  return BatchedGemm(x, w, bias, y, m, n, k, signature, layout, relu, &kNoBatch);
}

}  // namespace

TIR_BYOC_DEFINE_BATCHED_FAMILY(onednn, Gemm, BatchedGemm);

/* Cache introspection for tests and benchmarks: out[0..3] = size, capacity, hits, misses. */
extern "C" TIR_BYOC_EXPORT void tir_byoc_onednn_cache_info(int64_t *out) { Cache().Info(out); }

/* Change the cache bound (0 disables caching); evicts the least recently used entries. */
extern "C" TIR_BYOC_EXPORT int32_t tir_byoc_onednn_set_cache_capacity(int64_t capacity) {
  if (capacity < 0) return TIR_BYOC_ESHAPE;
  Cache().SetCapacity(capacity);
  return TIR_BYOC_OK;
}

/* The oneDNN implementation that serves a call (e.g. "brg:avx512_core_amx"), written to
 * `out` (NUL-terminated, at most `size` bytes); for reports of which kernel ran. */
extern "C" TIR_BYOC_EXPORT int32_t tir_byoc_onednn_implementation(int64_t m, int64_t n,
                                                                 int64_t k, int32_t dtypes,
                                                                 int32_t dense, int32_t bias,
                                                                 int32_t relu, char *out,
                                                                 int64_t size) {
  Dtypes decoded;
  if (!Decode(dtypes, &decoded)) return TIR_BYOC_EDTYPE;
  if (m <= 0 || n <= 0 || k <= 0 || out == nullptr || size <= 0) return TIR_BYOC_ESHAPE;
  try {
    tir_byoc_layout layout = dense ? TIR_BYOC_LAYOUT_NK : TIR_BYOC_LAYOUT_KN;
    std::shared_ptr<const Entry> entry =
        Cache().Get(Key{m, n, k, dtypes, layout, bias != 0, relu != 0, kNoBatch}, decoded);
    std::strncpy(out, entry->implementation.c_str(), static_cast<size_t>(size - 1));
    out[size - 1] = '\0';
  } catch (...) {
    return TIR_BYOC_EBACKEND;
  }
  return TIR_BYOC_OK;
}
