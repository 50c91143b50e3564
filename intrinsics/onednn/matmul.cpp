/*
 * onednn/matmul.cpp - the oneDNN intrinsics: every pattern of the family, and the gemm entry
 * point with its epilogue as data, as one oneDNN matmul primitive.  Symbols
 * tir_byoc_onednn_<pattern> and tir_byoc_onednn_gemm, registry keys onednn.<pattern>; calling
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
 * - The gemm entry point (fp32): the longest prefix of the epilogue that oneDNN computes
 *   exactly as tir_byoc_epilogue.h does is fused (Plan, and the table above it); the rest runs
 *   in C after the primitive.
 * - Primitives are created once per (shape, dtypes, layout, fused epilogue, thread count) and
 *   kept in a bounded, thread-safe LRU cache (capacity $TIR_BYOC_ONEDNN_CACHE_CAPACITY,
 *   default 256).
 */
#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

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

/* The bits of a float, so that keys compare and hash constants exactly (a NaN included). */
uint32_t Bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

/* One post-op of a primitive: an eltwise op (algorithm, alpha, beta), or a binary op whose
 * second operand is an (n,) row broadcast over the output, or a tensor of the output's shape;
 * or a clip as two binary post-ops, binary_min of hi (beta) then binary_max of lo (alpha),
 * each a scalar broadcast over the output (kMinMax). */
struct PostOp {
  enum Operand : int32_t { kEltwise, kRow, kFull, kMinMax };
  dnnl::algorithm algorithm = dnnl::algorithm::undef;
  float alpha = 0.0f, beta = 0.0f;
  Operand operand = kEltwise;

  bool operator==(const PostOp &o) const {
    return algorithm == o.algorithm && Bits(alpha) == Bits(o.alpha) &&
           Bits(beta) == Bits(o.beta) && operand == o.operand;
  }
};

/* The part of an epilogue a primitive computes: the bias argument, which oneDNN adds before
 * any post-op, then `count` post-ops.  It computes the first ops() ops of the epilogue.
 * Post-op `guarded` (if >= 0; always the last) agrees with C only where it gives a finite
 * value (Verdict::kWhereFinite): a call whose product has an infinity or a NaN after it is
 * computed again with the fusion cut there (Call). */
struct Fusion {
  bool bias = false;
  int32_t count = 0;
  int32_t guarded = -1;
  PostOp post[TIR_BYOC_MAX_OPS];

  int ops() const { return static_cast<int>(bias) + count; }

  /* The first `keep` post-ops (and the bias argument, if any), none of them guarded. */
  Fusion Prefix(int32_t keep) const {
    Fusion prefix = *this;
    prefix.count = std::min(count, keep);
    prefix.guarded = -1;
    return prefix;
  }

  bool operator==(const Fusion &o) const {
    return bias == o.bias && count == o.count && guarded == o.guarded &&
           std::equal(post, post + count, o.post);
  }
};

/* What a primitive is specialised for.  A 2-D product has the batch {1, 1} with strides 0. */
struct Key {
  int64_t m, n, k;
  int32_t signature;
  tir_byoc_layout layout;
  tir_byoc_batch batch;
  Fusion fusion;
  bool packed = false;  // the weight in the layout oneDNN prefers (format_tag::any), 2-D only
  // The calling thread's OpenMP count: oneDNN splits a primitive's work for the count it is
  // created at and keeps that split (see Key in conv.cpp).
  int32_t threads = omp_get_max_threads();

  bool operator==(const Key &o) const {
    return m == o.m && n == o.n && k == o.k && signature == o.signature && layout == o.layout &&
           std::memcmp(&batch, &o.batch, sizeof batch) == 0 && fusion == o.fusion &&
           packed == o.packed && threads == o.threads;
  }
};

struct KeyHash {
  size_t operator()(const Key &key) const {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&h](uint64_t part) { h = (h ^ part) * 1099511628211ull; };
    for (int64_t part : {key.m, key.n, key.k, key.batch.count[0], key.batch.count[1],
                         key.batch.x_stride[0], key.batch.x_stride[1], key.batch.w_stride[0],
                         key.batch.w_stride[1]})
      mix(static_cast<uint64_t>(part));
    mix(static_cast<uint64_t>(key.signature) << 8 | static_cast<uint64_t>(key.layout));
    mix(static_cast<uint64_t>(key.fusion.count) << 2 | key.packed << 1 | key.fusion.bias);
    mix(static_cast<uint64_t>(key.threads));
    for (int i = 0; i < key.fusion.count; ++i) {
      const PostOp &post = key.fusion.post[i];
      mix(static_cast<uint64_t>(post.algorithm) << 2 | static_cast<uint64_t>(post.operand));
      mix(static_cast<uint64_t>(Bits(post.alpha)) << 32 | Bits(post.beta));
    }
    return static_cast<size_t>(h);
  }
};

/* A created primitive with the memory descriptors its arguments are wrapped in.  `fusion` is
 * what it computes: the key's, or a shorter prefix of it (see Create). */
struct Entry {
  dnnl::matmul primitive;
  dnnl::memory::desc src, weights, bias, dst;
  dnnl::memory::desc scratchpad;  // the caller's: see Scratchpad
  Fusion fusion;
  dnnl::memory::desc operand[TIR_BYOC_MAX_OPS];  // second operand of each binary post-op
                                                 // (a kMinMax clip's: a scalar)
  std::string implementation;                    // oneDNN's name for the kernel it chose
  uint64_t id;  // unique per creation, keys the per-thread argument cache
  uint64_t layout = 0;  // DescHash(weights), kept so a packed call does not hash per call
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

/* An (n,) row of the output's dtype, broadcast over its rows (and batch). */
dnnl::memory::desc Row(const Key &key, dt type) {
  return IsBatched(key) ? dnnl::memory::desc({1, 1, 1, key.n}, type, dims{key.n, key.n, key.n, 1})
                        : dnnl::memory::desc({1, key.n}, type, dims{key.n, 1});
}

/* One value broadcast over an output of `rank` dims: a kMinMax clip's bounds. */
dnnl::memory::desc Scalar(int rank) {
  return dnnl::memory::desc(dims(rank, 1), dt::f32, dims(rank, 1));
}

/* The post-ops of `post`, appended to `ops` (`operand`: a binary one's second operand). */
void Append(const PostOp &post, const dnnl::memory::desc &operand, dnnl::post_ops *ops) {
  if (post.operand == PostOp::kEltwise) {
    ops->append_eltwise(post.algorithm, post.alpha, post.beta);
  } else if (post.operand == PostOp::kMinMax) {
    ops->append_binary(dnnl::algorithm::binary_min, operand);
    ops->append_binary(dnnl::algorithm::binary_max, operand);
  } else {
    ops->append_binary(post.algorithm, operand);
  }
}

/* The weight as the call passes it: (K, N) with the strides of its layout, never copied. */
dnnl::memory::desc PlainWeights(const Key &key, dt type) {
  dims weight_strides = key.layout == TIR_BYOC_LAYOUT_NK ? dims{1, key.k} : dims{key.n, 1};
  return Operand(key, key.batch.w_stride, key.k, key.n, type, weight_strides);
}

/* A hash of everything that places an element in a memory descriptor. */
uint64_t DescHash(const dnnl::memory::desc &md) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t part) { h = (h ^ part) * 1099511628211ull; };
  auto mix_all = [&mix](const dims &values) {
    mix(values.size());
    for (int64_t v : values) mix(static_cast<uint64_t>(v));
  };
  mix(static_cast<uint64_t>(md.get_data_type()));
  mix(static_cast<uint64_t>(md.get_format_kind()));
  mix(md.get_size());
  mix_all(md.get_dims());
  mix_all(md.get_padded_dims());
  mix_all(md.get_padded_offsets());
  mix_all(md.get_strides());
  mix_all(md.get_inner_blks());
  mix_all(md.get_inner_idxs());
  mix(static_cast<uint64_t>(md.get_submemory_offset()));
  return h;
}

std::shared_ptr<const Entry> Create(const Key &key, const Dtypes &dtypes) {
  // Step 1. Plain row-major descriptors; the weight's layout is carried by its strides.
  Entry entry;
  entry.src = Operand(key, key.batch.x_stride, key.m, key.k, dtypes.x, {key.k, 1});
  entry.weights = key.packed ? dnnl::memory::desc({key.k, key.n}, dtypes.w,
                                                  dnnl::memory::format_tag::any)
                             : PlainWeights(key, dtypes.w);
  const int64_t b1 = key.batch.count[1];
  entry.dst = IsBatched(key) ? dnnl::memory::desc({key.batch.count[0], b1, key.m, key.n},
                                                  dtypes.y,
                                                  dims{b1 * key.m * key.n, key.m * key.n, key.n, 1})
                             : dnnl::memory::desc({key.m, key.n}, dtypes.y, dims{key.n, 1});
  // Step 2. The fused epilogue: the bias argument, then the post-ops.
  entry.fusion = key.fusion;
  if (key.fusion.bias) entry.bias = Row(key, dtypes.y);
  for (int i = 0; i < key.fusion.count; ++i) {
    const PostOp::Operand operand = key.fusion.post[i].operand;
    if (operand == PostOp::kRow)
      entry.operand[i] = Row(key, dtypes.y);
    else if (operand == PostOp::kFull)
      entry.operand[i] = entry.dst;
    else if (operand == PostOp::kMinMax)
      entry.operand[i] = Scalar(IsBatched(key) ? 4 : 2);
  }
  // Step 3. The primitive; post-ops oneDNN does not implement for this shape, or implements
  // only in its reference kernels (slow, and not the kernels measured in the table above
  // Plan), are dropped from the end until it does.  The caller runs what was dropped in C.
  for (;; --entry.fusion.count) {
    dnnl::post_ops ops;
    for (int i = 0; i < entry.fusion.count; ++i)
      Append(entry.fusion.post[i], entry.operand[i], &ops);
    dnnl::primitive_attr attr;
    attr.set_post_ops(ops);
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    try {
      dnnl::matmul::primitive_desc desc(Engine(), entry.src, entry.weights, entry.bias,
                                        entry.dst, attr);
      entry.implementation = desc.impl_info_str();
      if (entry.fusion.count > 0 && entry.implementation.rfind("ref", 0) == 0) continue;
      if (key.packed) entry.weights = desc.weights_desc();
      entry.scratchpad = desc.scratchpad_desc();
      if (entry.fusion.guarded >= entry.fusion.count) entry.fusion.guarded = -1;
      entry.primitive = dnnl::matmul(desc);
      entry.id = next_entry_id++;
      entry.layout = DescHash(entry.weights);
      return std::make_shared<const Entry>(std::move(entry));
    } catch (const dnnl::error &) {
      if (entry.fusion.count == 0) throw;
    }
  }
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
  dnnl::memory src, weights, bias, dst, scratchpad;
  dnnl::memory operand[TIR_BYOC_MAX_OPS];  // of the binary post-ops
  dnnl::memory clip_lo[TIR_BYOC_MAX_OPS];  // of a kMinMax clip: operand[i] holds its hi
  float bounds[TIR_BYOC_MAX_OPS][2] = {};  // ... and here are hi and lo (this does not move)
  dnnl_exec_arg_t args[5 + 2 * TIR_BYOC_MAX_OPS];
  int count = 0;

  explicit BoundArgs(const Entry &entry) {
    dnnl::engine &engine = Engine();
    src = dnnl::memory(entry.src, engine, DNNL_MEMORY_NONE);
    weights = dnnl::memory(entry.weights, engine, DNNL_MEMORY_NONE);
    dst = dnnl::memory(entry.dst, engine, DNNL_MEMORY_NONE);
    args[count++] = {DNNL_ARG_SRC, src.get()};
    args[count++] = {DNNL_ARG_WEIGHTS, weights.get()};
    args[count++] = {DNNL_ARG_DST, dst.get()};
    if (entry.fusion.bias) {
      bias = dnnl::memory(entry.bias, engine, DNNL_MEMORY_NONE);
      args[count++] = {DNNL_ARG_BIAS, bias.get()};
    }
    // oneDNN numbers its post-ops, `at`; a kMinMax clip is two of them.
    for (int i = 0, at = 0; i < entry.fusion.count; ++i, ++at) {
      const PostOp &post = entry.fusion.post[i];
      if (post.operand == PostOp::kEltwise) continue;
      if (post.operand == PostOp::kMinMax) {
        bounds[i][0] = post.beta, bounds[i][1] = post.alpha;
        operand[i] = dnnl::memory(entry.operand[i], engine, &bounds[i][0]);
        clip_lo[i] = dnnl::memory(entry.operand[i], engine, &bounds[i][1]);
        args[count++] = {DNNL_ARG_ATTR_MULTIPLE_POST_OP(at) | DNNL_ARG_SRC_1, operand[i].get()};
        ++at;
        args[count++] = {DNNL_ARG_ATTR_MULTIPLE_POST_OP(at) | DNNL_ARG_SRC_1, clip_lo[i].get()};
        continue;
      }
      operand[i] = dnnl::memory(entry.operand[i], engine, DNNL_MEMORY_NONE);
      args[count++] = {DNNL_ARG_ATTR_MULTIPLE_POST_OP(at) | DNNL_ARG_SRC_1, operand[i].get()};
    }
    if (entry.scratchpad.get_size() > 0) {
      scratchpad = dnnl::memory(entry.scratchpad, engine, DNNL_MEMORY_NONE);
      args[count++] = {DNNL_ARG_SCRATCHPAD, scratchpad.get()};
    }
  }
};

/* Memory of one thread's, 64-byte aligned, kept between calls and grown when a call needs more. */
struct ThreadBuffer {
  void *data = nullptr;
  size_t size = 0;
  ~ThreadBuffer() { std::free(data); }
  /* At least `bytes`; NULL if memory ran out (the buffer is then as it was). */
  void *Grow(size_t bytes) {
    if (bytes > size) {
      const size_t rounded = (bytes + 63) / 64 * 64;
      void *grown = std::aligned_alloc(64, rounded);
      if (grown == nullptr) return nullptr;
      std::free(data);
      data = grown, size = rounded;
    }
    return data;
  }
};

/* This thread's scratchpad, at least `bytes` long; NULL if memory ran out.  oneDNN's own
 * ("library") scratchpad is shared by every primitive of the process unless oneDNN was built
 * with DNNL_ENABLE_CONCURRENT_EXEC, and the PyPI build was not: two threads running
 * primitives at once (a served model called from a pool of threads) overwrote each other's
 * partial sums.  Each primitive is created with a user scratchpad instead, and every call of
 * a thread uses this one buffer, as a thread runs one primitive at a time. */
void *Scratchpad(size_t bytes) {
  thread_local ThreadBuffer buffer;
  return buffer.Grow(bytes);
}

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

bool Point(const dnnl::memory &memory, const void *data) {
  return dnnl_memory_set_data_handle(memory.get(), const_cast<void *>(data)) == dnnl_success;
}

/* Run `entry` on the caller's buffers: `bias` for the bias argument, operands[i] for the second
 * operand of post-op i (binary post-ops only; NULL when there are none). */
int32_t Execute(const Entry &entry, const void *x, const void *w, const void *bias,
                const void *const *operands, void *y) {
  BoundArgs &bound = Bind(entry, Cache().Capacity());
  bool pointed = Point(bound.src, x) && Point(bound.weights, w) && Point(bound.dst, y);
  if (entry.fusion.bias) pointed = pointed && Point(bound.bias, bias);
  const size_t scratchpad_bytes = entry.scratchpad.get_size();
  if (scratchpad_bytes > 0) {
    void *scratchpad = Scratchpad(scratchpad_bytes);
    if (scratchpad == nullptr) return TIR_BYOC_EBACKEND;  // out of memory
    pointed = pointed && Point(bound.scratchpad, scratchpad);
  }
  for (int i = 0; i < entry.fusion.count; ++i) {
    const PostOp::Operand operand = entry.fusion.post[i].operand;
    if (operand == PostOp::kRow || operand == PostOp::kFull)
      pointed = pointed && Point(bound.operand[i], operands[i]);
  }
  if (!pointed) return TIR_BYOC_EBACKEND;
  dnnl::stream &stream = Stream();
  if (dnnl_primitive_execute(entry.primitive.get(), stream.get(), bound.count, bound.args) !=
          dnnl_success ||
      dnnl_stream_wait(stream.get()) != dnnl_success)
    return TIR_BYOC_EBACKEND;
  return TIR_BYOC_OK;
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

/* bf16 and fp16 inputs with an infinity or a NaN.  oneDNN's bf16 kernels (AVX-512 on AMD Zen 4,
 * an odd k) multiply an infinite input by the zeros that pad k to pairs, so -inf gives NaN where
 * TIR's sum gives -inf.  A call whose inputs hold such a value is computed by the loop below:
 * fp32 products summed in k order, as TIR computes them.  A model's inputs are finite, so it pays
 * one branch-free scan of X and W (k (m + n) of the m n k multiply-adds). */
bool IsHalf(const Dtypes &dtypes) { return dtypes.x == dt::bf16 || dtypes.x == dt::f16; }

uint16_t HalfExponent(const Dtypes &dtypes) { return dtypes.x == dt::bf16 ? 0x7f80 : 0x7c00; }

bool HalfFinite(const void *data, int64_t count, uint16_t exponent) {
  const uint16_t *bits = static_cast<const uint16_t *>(data);
  uint32_t special = 0;
  for (int64_t i = 0; i < count; ++i)
    special |= static_cast<uint32_t>((bits[i] & exponent) == exponent);
  return special == 0;
}

/* Whether every (rows, k) matrix of an operand with batch strides `stride` is finite. */
bool OperandFinite(const void *data, int64_t rows, int64_t k, const int64_t stride[2],
                   const tir_byoc_batch &batch, uint16_t exponent) {
  const uint16_t *base = static_cast<const uint16_t *>(data);
  for (int64_t b0 = 0; b0 < batch.count[0]; ++b0) {
    if (b0 > 0 && stride[0] == 0) break;
    for (int64_t b1 = 0; b1 < batch.count[1]; ++b1) {
      if (b1 > 0 && stride[1] == 0) break;
      if (!HalfFinite(base + b0 * stride[0] + b1 * stride[1], rows * k, exponent)) return false;
    }
  }
  return true;
}

float HalfValue(uint16_t h, bool bf16) {
  uint32_t bits;
  if (bf16) {
    bits = static_cast<uint32_t>(h) << 16;
  } else {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
    if (exponent == 0x1f) {
      bits = sign | 0x7f800000u | (mantissa << 13);
    } else if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in fp32
      const float value = std::ldexp(static_cast<float>(mantissa), -24);
      return sign ? -value : value;
    } else {
      bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
    }
  }
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

/* The product of a bf16 / fp16 call, as TIR computes it (the epilogue follows separately). */
void HalfProduct(const Dtypes &dtypes, const void *x, const void *w, float *y, int64_t m,
                 int64_t n, int64_t k, tir_byoc_layout layout, const tir_byoc_batch &batch) {
  const bool bf16 = dtypes.x == dt::bf16;
  const uint16_t *xs = static_cast<const uint16_t *>(x);
  const uint16_t *ws = static_cast<const uint16_t *>(w);
  for (int64_t b0 = 0; b0 < batch.count[0]; ++b0)
    for (int64_t b1 = 0; b1 < batch.count[1]; ++b1) {
      const uint16_t *xb = xs + b0 * batch.x_stride[0] + b1 * batch.x_stride[1];
      const uint16_t *wb = ws + b0 * batch.w_stride[0] + b1 * batch.w_stride[1];
      float *yb = y + (b0 * batch.count[1] + b1) * m * n;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          float sum = 0.0f;
          for (int64_t r = 0; r < k; ++r) {
            const uint16_t wv = layout == TIR_BYOC_LAYOUT_NK ? wb[j * k + r] : wb[r * n + j];
            sum += HalfValue(xb[i * k + r], bf16) * HalfValue(wv, bf16);
          }
          yb[i * n + j] = sum;
        }
    }
}

/* How a post-op compares with tir_byoc_op_row on this machine (Check, below): everywhere,
 * wherever it gives a finite value (it may give an infinity or NaN where C does not), or not. */
enum class Verdict { kNo, kExact, kWhereFinite };

Verdict Check(const tir_byoc_op &op, const PostOp &post);

/* What the primitive of a family call fuses: floating point only (see the file comment for
 * integers), and a relu only if it maps NaN to 0 and agrees with C everywhere here (Check). */
Fusion FamilyFusion(const Dtypes &dtypes, bool bias, bool relu, bool keep_nan) {
  Fusion fusion;
  if (dtypes.integer) return fusion;
  fusion.bias = bias;
  const PostOp post{dnnl::algorithm::eltwise_relu, 0.0f, 0.0f, PostOp::kEltwise};
  tir_byoc_op op{};
  op.code = TIR_BYOC_OP_RELU;
  if (relu && !keep_nan && Check(op, post) == Verdict::kExact)
    fusion.post[fusion.count++] = post;
  return fusion;
}

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
  if (IsHalf(dtypes)) {  // an infinity or NaN in the inputs: TIR's loop (see HalfProduct)
    const uint16_t exponent = HalfExponent(dtypes);
    if (!OperandFinite(x, m, k, batch->x_stride, *batch, exponent) ||
        !OperandFinite(w, n, k, batch->w_stride, *batch, exponent)) {
      HalfProduct(dtypes, x, w, static_cast<float *>(y), m, n, k, layout, *batch);
      ApplyEpilogue(dtypes, y, bias, rows, n, relu, keep_nan, false);
      return TIR_BYOC_OK;
    }
  }
  try {
    // Step 2. The cached primitive, executed on the caller's buffers.
    // A batch of one is a 2-D product, whatever its strides: one cache entry for both.
    const tir_byoc_batch &key_batch = count == 1 ? kNoBatch : *batch;
    const Key key{m, n, k, signature, layout, key_batch,
                  FamilyFusion(dtypes, has_bias, relu, keep_nan)};
    std::shared_ptr<const Entry> entry = Cache().Get(key, dtypes);
    if ((status = Execute(*entry, x, w, bias, nullptr, y)) != TIR_BYOC_OK) return status;
    // Step 3. The exact int32 epilogue of the integer patterns; a relu not fused.
    if (dtypes.integer && (has_bias || relu)) {
      ApplyEpilogue(dtypes, y, bias, rows, n, relu, keep_nan, false);
    } else if (relu && entry->fusion.count == 0) {
      ApplyEpilogue(dtypes, y, nullptr, rows, n, true, keep_nan, false);
    }
  } catch (...) {
    return TIR_BYOC_EBACKEND;
  }
  return TIR_BYOC_OK;
}

/* ------------------------------------------------------------------------------------------
 * The gemm entry point: an epilogue op is fused only where oneDNN computes it as
 * tir_byoc_epilogue.h does, NaN and infinities included.  Measured with oneDNN 3.2.0 (kernel
 * gemm:jit:f32, AVX2, AMD EPYC): each op alone as the post-op of a matmul whose product is the
 * value z exactly (k = 1, 8, 96; n = 1 ... 3072; 2-D and 4-D with a broadcast weight), against
 * tir_byoc_op_row, for z in {NaN, +-inf, +-3e38, +-1e30, +-100, +-89, +-88, +-20, +-10, ...,
 * +-1e-30, +-0} and 801 points of [-10, 10].  "Agrees": NaN where C has NaN, the same infinity,
 * otherwise within 1e-5 relative (+ 1e-6); a zero's sign is not compared.
 *
 *   op             oneDNN post-op               NaN    +inf   -inf   +1e30  -1e30  -100   fused
 *   scale c        eltwise_linear(c, 0)         NaN    +-inf  -+inf  c*z    c*z    c*z    c finite
 *   div c          eltwise_linear(1/c, 0)       NaN    +-inf  -+inf  z/c    z/c    z/c    1/c exact
 *   bias           the bias argument (op 0),    NaN    inf    -inf   z+b    z+b    z+b    yes
 *                  else binary_add of a row
 *   relu           eltwise_relu(0)              0      inf    0      1e30   0      0      yes
 *   relu_keep_nan  eltwise_relu(0)              0 (C: NaN)                                no
 *   gelu           eltwise_gelu_erf             NaN    inf    NaN    1e30   0      0      yes
 *   gelu_tanh      eltwise_gelu_tanh            NaN    inf    NaN    1e30   -0     -0     yes
 *   silu           eltwise_swish(1)             NaN    inf    NaN    1e30   -0     -0     yes
 *   swish a        eltwise_swish(a)             a > 0: as silu (each a checked, below)     a finite
 *   sigmoid        eltwise_logistic             NaN    1      0      1      0      0      yes
 *   tanh           eltwise_tanh                 NaN    1      -1     1      -1     -1     yes
 *   clip lo hi c2  eltwise_clip_v2(lo, hi)      lo (C: c2)   hi     lo     hi     lo     c2 == lo
 *                  binary_min hi, binary_max lo (not in that measurement: Checked tries the
 *                  forms of a clip in turn, and the probe found hi for NaN on AVX-512)  c2 == hi
 *   leaky_relu a   eltwise_relu(a)              NaN    inf    -inf   1e30   a*z    a*z    a > 0
 *     a = 0                                     0 (C: NaN); -inf: 0 (C: 0 * -inf = NaN)   no
 *   add, mul       binary_add / binary_mul of   IEEE fp32 + and *, as C                   yes
 *                  a tensor of y's shape
 *
 * The gelus are fused only with the constants oneDNN builds in (sqrt(1/2); sqrt(2/pi) and
 * 0.044715), clip only with lo <= hi; tanh and gelu_tanh not on CPUs without AVX-512, where
 * the C epilogue is faster at them (FasterInC).  A div by a c whose reciprocal is inexact is
 * not the same op (z * (1/3) is 1 ulp off z / 3 for a third of all z), so it runs in C.  A
 * kernel oneDNN implements only by reference code is never given post-ops (Create).
 *
 * The table holds for the kernels measured, not for every CPU: on AVX-512 (Intel Xeon with
 * AMX, oneDNN's brgemm kernels) eltwise_gelu_erf gives NaN for +inf and inf for 3e38, where C
 * gives inf and 3e38 (it computes 0.5 * z * (1 + erf), which overflows).  So each eltwise
 * post-op is also checked on the machine it runs on (Check, below) before it is fused:
 *
 * - agreeing everywhere, it is fused;
 * - agreeing wherever oneDNN's value is finite (the gelu above), it is fused and guarded, as
 *   the last op fused: a call whose output holds an infinity or a NaN after the primitive
 *   (one scan of it, before any later op could map one to a finite value) is computed again
 *   with the fusion cut before the op and the rest in C, so the result is C's.  A model's
 *   outputs are finite, so it pays only the scan;
 * - otherwise it runs in C.
 */

/* ------------------------------------------------------------------------------------------
 * The check of an eltwise post-op on this machine: once per process and op (code and
 * constants), a matmul whose product is z exactly (z in X's first column, zeros after it, W
 * all ones) runs the post-op over the values of the table above (the specials and 801 points
 * of [-10, 10]) at three shapes (K x N = 1 x 16, 8 x 64, 96 x 256: the tails and the bodies
 * of the vector loops, oneDNN's gemm and brgemm kernels), and every output is compared with
 * tir_byoc_op_row as the table compares them.  A shape oneDNN gives only a reference kernel
 * is not counted; an op no shape checked is not fused.
 */
std::vector<float> ProbeValues() {
  std::vector<float> values{NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 3e38f, -3e38f, 1.7e38f,
                            -1.7e38f, 1e30f, -1e30f, 1e-30f, -1e-30f, 100.0f, -100.0f,
                            89.0f, -89.0f, 88.0f, -88.0f, 20.0f, -20.0f};
  for (int i = 0; i <= 800; ++i) values.push_back(-10.0f + 0.025f * static_cast<float>(i));
  return values;
}

bool Close(float got, float want) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want)) return got == want;
  return std::isfinite(got) && std::fabs(got - want) <= 1e-5f * std::fabs(want) + 1e-6f;
}

Verdict Probe(const tir_byoc_op &op, const PostOp &post) {
  static const std::vector<float> values = ProbeValues();
  const int64_t m = static_cast<int64_t>(values.size());
  static const int64_t kShapes[][2] = {{1, 16}, {8, 64}, {96, 256}};
  int checked = 0;
  bool where_finite = false;  // a disagreement seen, each where oneDNN's value is not finite
  for (const auto &shape : kShapes) {
    const int64_t k = shape[0], n = shape[1];
    std::vector<float> x(m * k, 0.0f), w(k * n, 1.0f), y(m * n, 0.0f), want(n);
    for (int64_t i = 0; i < m; ++i) x[i * k] = values[i];
    dnnl::memory::desc src({m, k}, dt::f32, dims{k, 1}), weights({k, n}, dt::f32, dims{n, 1}),
        dst({m, n}, dt::f32, dims{n, 1});
    dnnl::post_ops ops;
    Append(post, Scalar(2), &ops);
    dnnl::primitive_attr attr;
    attr.set_post_ops(ops);
    dnnl::matmul::primitive_desc desc;
    try {
      desc = dnnl::matmul::primitive_desc(Engine(), src, weights, dst, attr);
    } catch (const dnnl::error &) {
      continue;  // not implemented for this shape: Create drops it there too
    }
    if (std::string(desc.impl_info_str()).rfind("ref", 0) == 0) continue;
    dnnl::memory src_m(src, Engine(), x.data()), weights_m(weights, Engine(), w.data()),
        dst_m(dst, Engine(), y.data());
    float bounds[2] = {post.beta, post.alpha};  // a kMinMax clip's hi and lo
    std::unordered_map<int, dnnl::memory> args{
        {DNNL_ARG_SRC, src_m}, {DNNL_ARG_WEIGHTS, weights_m}, {DNNL_ARG_DST, dst_m}};
    if (post.operand == PostOp::kMinMax) {
      args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1,
                   dnnl::memory(Scalar(2), Engine(), &bounds[0]));
      args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(1) | DNNL_ARG_SRC_1,
                   dnnl::memory(Scalar(2), Engine(), &bounds[1]));
    }
    dnnl::matmul(desc).execute(Stream(), args);
    Stream().wait();
    for (int64_t i = 0; i < m; ++i) {
      std::fill(want.begin(), want.end(), values[i]);
      tir_byoc_op_row(&op, want.data(), i, n);
      for (int64_t j = 0; j < n; ++j) {
        if (Close(y[i * n + j], want[j])) continue;
        if (std::isfinite(y[i * n + j])) return Verdict::kNo;
        where_finite = true;
      }
    }
    ++checked;
  }
  if (checked == 0) return Verdict::kNo;
  return where_finite ? Verdict::kWhereFinite : Verdict::kExact;
}

/* How `post` compares with tir_byoc_op_row on this machine (Probe, once per op and
 * constants; a failure to check is a no). */
Verdict Check(const tir_byoc_op &op, const PostOp &post) {
  static std::mutex mutex;
  static std::map<std::array<uint32_t, 5>, Verdict> verdicts;
  // Plan asks on every call: a key on the stack, no allocation.
  const std::array<uint32_t, 5> key{
      static_cast<uint32_t>(op.code),
      static_cast<uint32_t>(post.algorithm) << 8 | static_cast<uint32_t>(post.operand),
      Bits(post.alpha), Bits(post.beta), Bits(static_cast<float>(op.c[2]))};
  std::lock_guard<std::mutex> lock(mutex);
  auto found = verdicts.find(key);
  if (found != verdicts.end()) return found->second;
  Verdict verdict = Verdict::kNo;
  try {
    verdict = Probe(op, post);
  } catch (...) {
    verdict = Verdict::kNo;
  }
  verdicts.emplace(key, verdict);
  return verdict;
}

/* True if z * (1 / c) == z / c for every float z: c is a power of two whose reciprocal is a
 * normal float. */
bool ExactReciprocal(float c) {
  int exponent;
  return std::isnormal(c) && std::fabs(std::frexp(c, &exponent)) == 0.5f &&
         std::isnormal(1.0f / c);
}

/* The post-op computing `op` (not a leading bias) as tir_byoc_op_row does, or false; the
 * conditions are those of the table above. */
bool PostOpOf(const tir_byoc_op &op, PostOp *post) {
  using alg = dnnl::algorithm;
  // The constants as tir_byoc_op_row takes them.
  const float c0 = static_cast<float>(op.c[0]), c1 = static_cast<float>(op.c[1]);
  const float sqrt_half = static_cast<float>(0.70710678118654752440);
  const float sqrt_2_over_pi = static_cast<float>(0.79788456080286535588);
  auto eltwise = [post](alg algorithm, float alpha, float beta) {
    *post = {algorithm, alpha, beta, PostOp::kEltwise};
    return true;
  };
  auto binary = [post](alg algorithm, PostOp::Operand operand) {
    *post = {algorithm, 0.0f, 0.0f, operand};
    return true;
  };
  switch (op.code) {
    case TIR_BYOC_OP_SCALE:
      return std::isfinite(c0) && eltwise(alg::eltwise_linear, c0, 0.0f);
    case TIR_BYOC_OP_DIV:
      return ExactReciprocal(c0) && eltwise(alg::eltwise_linear, 1.0f / c0, 0.0f);
    case TIR_BYOC_OP_BIAS:
      return binary(alg::binary_add, PostOp::kRow);
    case TIR_BYOC_OP_RELU:
      return eltwise(alg::eltwise_relu, 0.0f, 0.0f);
    case TIR_BYOC_OP_GELU:
      return c0 == sqrt_half && eltwise(alg::eltwise_gelu_erf, 0.0f, 0.0f);
    case TIR_BYOC_OP_GELU_TANH:
      return c0 == sqrt_2_over_pi && c1 == 0.044715f &&
             eltwise(alg::eltwise_gelu_tanh, 0.0f, 0.0f);
    case TIR_BYOC_OP_SILU:
      return eltwise(alg::eltwise_swish, 1.0f, 0.0f);
    case TIR_BYOC_OP_SWISH:
      return std::isfinite(c0) && eltwise(alg::eltwise_swish, c0, 0.0f);
    case TIR_BYOC_OP_SIGMOID:
      return eltwise(alg::eltwise_logistic, 0.0f, 0.0f);
    case TIR_BYOC_OP_TANH:
      return eltwise(alg::eltwise_tanh, 0.0f, 0.0f);
    case TIR_BYOC_OP_CLIP:  // the first form; Checked tries the others (ClipForms)
      return c0 <= c1 && eltwise(alg::eltwise_clip_v2, c0, c1);
    case TIR_BYOC_OP_LEAKY_RELU:
      return c0 > 0.0f && std::isfinite(c0) && eltwise(alg::eltwise_relu, c0, 0.0f);
    case TIR_BYOC_OP_ADD:
      return binary(alg::binary_add, PostOp::kFull);
    case TIR_BYOC_OP_MUL:
      return binary(alg::binary_mul, PostOp::kFull);
    case TIR_BYOC_OP_CHANNEL_SCALE:
      return binary(alg::binary_mul, PostOp::kRow);
    default:  // TIR_BYOC_OP_RELU_KEEP_NAN
      return false;
  }
}

/* Whether the C epilogue computes `post` faster than oneDNN's primitive does: the tanh-based
 * eltwise ops (tanh, gelu_tanh) on a CPU without AVX-512, where oneDNN 3.2's fp32 matmul is
 * its gemm:jit kernel, when the C epilogue calls libmvec's tanhf (tir_byoc_epilogue.h).
 * Measured on an AMD EPYC (Zen 3, AVX2), one thread, a 128 x 3072 output: the gelu_tanh
 * post-op added 2.4 ms to the product, its eltwise primitive took 1.8-2.8 ms and the tanh
 * one 2.0 ms, against 0.72 and 0.55 ms in C.  Which one runs is speed only: both agree with
 * the TIR as the table above says. */
bool FasterInC(const PostOp &post) {
  using alg = dnnl::algorithm;
  if (post.operand != PostOp::kEltwise ||
      (post.algorithm != alg::eltwise_tanh && post.algorithm != alg::eltwise_gelu_tanh))
    return false;
  static const bool avx512 = (static_cast<int>(dnnl::get_effective_cpu_isa()) &
                              dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core;
  return !avx512 && (tir_byoc_vector_math() & 2) != 0;  // bit 1: tanhf
}

/* How `op` compares as the eltwise post-op `post` (PostOpOf's) on this machine (Check); for a
 * clip, the first of its forms that agrees everywhere, written to `post`: eltwise_clip_v2,
 * eltwise_clip, then binary_min of hi and binary_max of lo.  They differ on NaN, which the C
 * clip maps to c2, the value TVM's spelling gives: eltwise_clip_v2 and eltwise_clip give lo
 * on the kernels seen (AVX-512 brgemm, AVX2 gemm:jit), min then max gives hi, what topi.clip's
 * max(min(z, hi), lo) gives: ReLU6's clip.  None gives NaN for NaN (that spelling runs in C). */
Verdict Checked(const tir_byoc_op &op, PostOp *post) {
  if (op.code != TIR_BYOC_OP_CLIP) return Check(op, *post);
  const float lo = post->alpha, hi = post->beta;
  const PostOp forms[] = {{dnnl::algorithm::eltwise_clip_v2, lo, hi, PostOp::kEltwise},
                          {dnnl::algorithm::eltwise_clip, lo, hi, PostOp::kEltwise},
                          {dnnl::algorithm::binary_min, lo, hi, PostOp::kMinMax}};
  for (const PostOp &form : forms) {
    if (Check(op, form) != Verdict::kExact) continue;
    *post = form;
    return Verdict::kExact;
  }
  return Verdict::kNo;
}

/* The longest prefix of `epilogue` that oneDNN computes exactly: a leading bias as the bias
 * argument (oneDNN adds it before every post-op), then one post-op per op (two for a clip as
 * min and max); it ends before an op the C epilogue computes faster (FasterInC). */
Fusion Plan(const tir_byoc_epilogue &epilogue) {
  Fusion fusion;
  PostOp post;
  for (int i = 0; i < epilogue.count; ++i) {
    if (i == 0 && epilogue.op[0].code == TIR_BYOC_OP_BIAS)
      fusion.bias = true;
    else if (!PostOpOf(epilogue.op[i], &post) || FasterInC(post))
      break;
    else if (post.operand != PostOp::kEltwise)
      fusion.post[fusion.count++] = post;
    else if (Verdict verdict = Checked(epilogue.op[i], &post); verdict == Verdict::kNo)
      break;
    else if (verdict == Verdict::kExact)
      fusion.post[fusion.count++] = post;
    else {  // the last op fused: its output is scanned before any later op could hide a NaN
      fusion.guarded = fusion.count;
      fusion.post[fusion.count++] = post;
      break;
    }
  }
  return fusion;
}

/* ------------------------------------------------------------------------------------------
 * Packed weights (TIR_BYOC_PACKED_WEIGHT).  tir_byoc_onednn_pack lays a constant weight out at
 * build time in one of three forms for one call (its N, K, layout and fused epilogue, and its
 * M but for the third), after a 64-byte header naming the form and the layout:
 *
 * - TIR_BYOC_PACK_LIBRARY: the layout oneDNN's matmul asks for when the weight is given as
 *   format_tag::any (blocked on brgemm CPUs, a plain one on AVX2);
 * - TIR_BYOC_PACK_TRANSPOSED: the weight as the call would pass it in the other layout (a
 *   matmul's K x N weight as a dense N x K one, or the reverse).  oneDNN's jit gemm copies
 *   blocks of the weight as it goes, and how fast depends on the layout it reads: measured on
 *   AVX2 (AMD EPYC, one thread), 128x768 -> 3072 takes 14.5 ms from a K x N weight and
 *   7.2 ms from an N x K one, while 1x4096 -> 4096 is 12 % faster from K x N.
 * - TIR_BYOC_PACK_LIBRARY_BY_M, for a call whose M is known only at run time: the weight in
 *   each distinct layout oneDNN's matmul asks for (format_tag::any) at the M of kLayoutRows,
 *   at most kMaxCopies copies, the smallest M's first, after a table of them (PackTable).  A
 *   call runs on the copy in the layout its primitive asks for.  When no copy is (an M past
 *   the sampled ones, a layout beyond the cap, another thread count or CPU), a copy whose
 *   layout a format tag describes is reordered for that call into this thread's memory: a
 *   pass over the weight per call, correct but not the fast path.
 *   TIR_BYOC_ONEDNN_TEST_REORDER=1 (for tests) takes that path on every call.
 * - TIR_BYOC_PACK_LAYOUT_BY_M, for a call whose M is known only at run time on a CPU where the
 *   plain weight and its transpose run the same kernel at different speeds by M: both, after
 *   a table (LayoutTable) that says, per range of M (a power of two to the next), which one the
 *   call reads.  ChooseForm makes it only where it would otherwise keep the plain weight and
 *   the transpose is 5 % faster at some of the sampled M and not at others.  Measured on AVX2
 *   (AMD EPYC Zen 3, jit gemm, one thread), GPT-2's 256 -> 1024 up-projection: the transpose
 *   takes 0.47-0.50 ms at M = 32 against 0.58-0.68 from K x N, 1.25-1.68 against 2.07-2.16 at
 *   M = 128, and level or behind at M = 1, 8, 384 and 512.
 *   Seen with the PyPI oneDNN 3.2 on AVX-512 (AMD EPYC Zen 4, brg:avx512_core) for K x N in
 *   {256, 1024} x {256, 512, 768, 1000, 1024}, 768 x 3072 and 3072 x 768, with a bias, at
 *   every M from 1 to 512 and a sample up to 8192, at one and two threads: one layout
 *   (BA16a64b, N padded to 64) at every M.  The table holds more in case another CPU or
 *   oneDNN version changes layout with M.
 *
 * A call with the flag creates the primitive of the form the header names and runs on the
 * block only if the block holds the layout that primitive wants (or, by M, one it can be
 * reordered from): a block made for another shape, epilogue, CPU or oneDNN version gives
 * TIR_BYOC_EPACKED, never a result.
 */
struct PackHeader {
  char magic[8];
  uint64_t layout;  // DescHash of the packed weight's memory descriptor (by M: the first copy's)
  uint64_t bytes;   // its size (by M: the table's and the copies')
  uint64_t form;    // TIR_BYOC_PACK_LIBRARY, _TRANSPOSED, _LIBRARY_BY_M or _LAYOUT_BY_M
  uint64_t version;  // by M: kByMVersion (kLayoutByMVersion); 0 for the other forms
  uint64_t copies;   // by M: how many copies the table lists; 0 for the other forms
  uint64_t reserved[2];
};
static_assert(sizeof(PackHeader) == 64, "the packed data starts 64-byte aligned");
constexpr char kPackMagic[8] = {'t', 'i', 'r', 'b', 'y', 'o', 'c', 'P'};
// The format of a block by M; a block of another version gives TIR_BYOC_EPACKED.
constexpr uint64_t kByMVersion = 1;

/* One copy of a block by M, in the table after its header. */
struct PackCopy {
  uint64_t layout;  // DescHash of the copy's memory descriptor
  uint64_t offset;  // from the end of the header, a multiple of 64
  uint64_t bytes;   // its size
  int64_t rows;     // the first M of kLayoutRows whose primitive asked for it (for reports)
};
/* At most this many copies: four weights' memory for a layout per range of M; an M whose
 * layout is not held pays a reorder per call. */
constexpr int kMaxCopies = 4;
struct PackTable {
  PackCopy copy[kMaxCopies];
};
static_assert(sizeof(PackTable) % 64 == 0, "the copies start 64-byte aligned");

/* The table of a block of TIR_BYOC_PACK_LAYOUT_BY_M, after its header: the plain weight's copy
 * (index 0) and the transposed one (1), and per range of M the copy a call reads. */
constexpr int kLayoutRanges = 16;  // M in [2^r, 2^(r+1)), the last open-ended
constexpr uint64_t kLayoutByMVersion = 1;
struct LayoutTable {
  uint64_t layout[2];  // DescHash of each copy's memory descriptor
  uint64_t offset[2];  // from the end of the header, multiples of 64
  uint64_t bytes[2];
  uint8_t transposed[kLayoutRanges];  // 1: a call of M in range r reads the transposed copy
};
static_assert(sizeof(LayoutTable) == 64, "the copies start 64-byte aligned");

/* The range of M (see LayoutTable) that `m` >= 1 falls in. */
int LayoutRange(int64_t m) {
  const int log2 = 63 - __builtin_clzll(static_cast<unsigned long long>(m));
  return std::min(log2, kLayoutRanges - 1);
}

/* True if a block of TIR_BYOC_PACK_LAYOUT_BY_M's table lies inside it and names a copy for
 * every range. */
bool LayoutTableFits(const PackHeader &header) {
  if (header.version != kLayoutByMVersion || header.bytes < sizeof(LayoutTable)) return false;
  const LayoutTable &table = *reinterpret_cast<const LayoutTable *>(&header + 1);
  for (int i = 0; i < 2; ++i) {
    if (table.offset[i] % 64 != 0 || table.offset[i] < sizeof(LayoutTable) ||
        table.bytes[i] > header.bytes || table.offset[i] > header.bytes - table.bytes[i])
      return false;
  }
  return std::all_of(std::begin(table.transposed), std::end(table.transposed),
                     [](uint8_t t) { return t <= 1; });
}

/* The M whose layouts a block by M holds: powers of two up to 8192, as no layout change was
 * seen between them (see above). */
constexpr int64_t kLayoutRows[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192};

/* The key of the primitive that reads a weight packed in `form` for a call of key `plain`. */
Key FormKey(const Key &plain, int64_t form) {
  Key key = plain;
  if (form == TIR_BYOC_PACK_LIBRARY || form == TIR_BYOC_PACK_LIBRARY_BY_M) key.packed = true;
  if (form == TIR_BYOC_PACK_TRANSPOSED)
    key.layout = plain.layout == TIR_BYOC_LAYOUT_NK ? TIR_BYOC_LAYOUT_KN : TIR_BYOC_LAYOUT_NK;
  return key;
}

/* True if a block by M's table lists 1 to kMaxCopies copies, each inside the block. */
bool TableFits(const PackHeader &header) {
  if (header.version != kByMVersion || header.copies < 1 || header.copies > kMaxCopies ||
      header.bytes < sizeof(PackTable))
    return false;
  const PackTable &table = *reinterpret_cast<const PackTable *>(&header + 1);
  for (uint64_t i = 0; i < header.copies; ++i) {
    const PackCopy &copy = table.copy[i];
    if (copy.offset % 64 != 0 || copy.offset < sizeof(PackTable) || copy.bytes > header.bytes ||
        copy.offset > header.bytes - copy.bytes)
      return false;
  }
  return true;
}

/* True if `header` starts a block of a form this file makes. */
bool IsPack(const PackHeader *header) {
  if (header == nullptr || std::memcmp(header->magic, kPackMagic, sizeof kPackMagic) != 0)
    return false;
  if (header->form == TIR_BYOC_PACK_LIBRARY_BY_M) return TableFits(*header);
  if (header->form == TIR_BYOC_PACK_LAYOUT_BY_M) return LayoutTableFits(*header);
  return (header->form == TIR_BYOC_PACK_LIBRARY || header->form == TIR_BYOC_PACK_TRANSPOSED) &&
         header->version == 0;
}

bool PackFits(const PackHeader *header, const Entry &entry) {
  return IsPack(header) && header->layout == entry.layout &&
         header->bytes == entry.weights.get_size();
}

/* Whether a test asked every block by M to be reordered, as if it held no copy in the
 * layout of the call (see the comment above PackHeader). */
bool TestReorder() {
  const char *setting = std::getenv("TIR_BYOC_ONEDNN_TEST_REORDER");
  return setting != nullptr && std::strcmp(setting, "1") == 0;
}

/* The descriptor of dims `shape` (fp32) whose DescHash is `layout`: the format tag's that
 * gives it, each searched once per thread; false if no tag does. */
bool Described(uint64_t layout, const dims &shape, dnnl::memory::desc *out) {
  thread_local std::map<std::pair<uint64_t, dims>, std::pair<bool, dnnl::memory::desc>> known;
  auto found = known.find({layout, shape});
  if (found == known.end()) {
    if (known.size() >= 64) known.clear();
    std::pair<bool, dnnl::memory::desc> described{false, {}};
    for (int t = dnnl_a; t < dnnl_format_tag_last && !described.first; ++t) {
      dnnl_memory_desc_t md = nullptr;
      if (dnnl_memory_desc_create_with_tag(&md, static_cast<int>(shape.size()), shape.data(),
                                           dnnl_f32,
                                           static_cast<dnnl_format_tag_t>(t)) != dnnl_success)
        continue;
      dnnl::memory::desc candidate(md);
      if (DescHash(candidate) == layout) described = {true, candidate};
    }
    found = known.emplace(std::make_pair(layout, shape), described).first;
  }
  if (found->second.first) *out = found->second.second;
  return found->second.first;
}

/* This thread's memory for a weight reordered for one call, at least `bytes` long; NULL if
 * memory ran out. */
void *ReorderedWeight(size_t bytes) {
  thread_local ThreadBuffer buffer;
  return buffer.Grow(bytes);
}

/* The weight of a block by M (its table checked by IsPack) in the layout `entry` reads: the
 * copy in that layout, or else a copy reordered into it for this call; NULL if no copy's
 * layout can be described (a block of another weight shape, or none a format tag gives). */
const void *CopyFor(const PackHeader &header, const Entry &entry) {
  const PackTable &table = *reinterpret_cast<const PackTable *>(&header + 1);
  const char *data = reinterpret_cast<const char *>(&header + 1);
  const size_t bytes = entry.weights.get_size();
  // Step 1. The common case: a copy in the primitive's layout.
  if (!TestReorder()) {
    for (uint64_t i = 0; i < header.copies; ++i) {
      if (table.copy[i].layout == entry.layout && table.copy[i].bytes == bytes)
        return data + table.copy[i].offset;
    }
  }
  // Step 2. A copy whose descriptor is known and of the call's weight shape, reordered into
  // the primitive's layout.
  for (uint64_t i = 0; i < header.copies; ++i) {
    dnnl::memory::desc held;
    if (!Described(table.copy[i].layout, entry.weights.get_dims(), &held) ||
        held.get_dims() != entry.weights.get_dims() || held.get_size() != table.copy[i].bytes)
      continue;
    void *out = ReorderedWeight(bytes);
    if (out == nullptr) return nullptr;
    dnnl::memory from(held, Engine(), const_cast<char *>(data + table.copy[i].offset));
    dnnl::memory to(entry.weights, Engine(), out);
    dnnl::reorder(from, to).execute(Stream(), from, to);
    Stream().wait();
    return out;
  }
  return nullptr;
}

/* The weight in `block` (laid out as `entry` reads it) in the plain layout of `plain`. */
std::vector<float> Unpack(const Entry &entry, const void *block, const Key &plain) {
  std::vector<float> weight(static_cast<size_t>(plain.k * plain.n));
  dnnl::memory from(entry.weights, Engine(), const_cast<void *>(block));
  dnnl::memory to(PlainWeights(plain, dt::f32), Engine(), weight.data());
  dnnl::reorder(from, to).execute(Stream(), from, to);
  Stream().wait();
  return weight;
}

/* Run `entry` for `call` with the weight `w`: the product and the fused prefix. */
int32_t Run(const Entry &entry, const tir_byoc_call &call, const void *w) {
  const Fusion &fused = entry.fusion;
  const void *operands[TIR_BYOC_MAX_OPS];
  for (int i = 0; i < fused.count; ++i) operands[i] = call.epilogue.op[fused.bias + i].tensor;
  const void *bias = fused.bias ? call.epilogue.op[0].tensor : nullptr;
  return Execute(entry, call.x, w, bias, operands, call.y);
}

/* A whole gemm call (TIR_BYOC_DEFINE_GEMM below has checked the layout, shape, batch, pointers
 * and epilogue): one primitive for the product and the fused prefix, then the rest in C. */
int32_t Call(const tir_byoc_call *call) {
  // Step 1. fp32 only; the one flag is a packed weight, for a call without batch.
  const int32_t flags = TIR_BYOC_FLAGS_OF(call->dtypes);
  const bool packed = flags == TIR_BYOC_PACKED_WEIGHT;
  if (TIR_BYOC_SIGNATURE_OF(call->dtypes) != TIR_BYOC_SIG_F32 || (flags != 0 && !packed))
    return TIR_BYOC_EDTYPE;
  if (packed && call->batch.count[0] * call->batch.count[1] != 1) return TIR_BYOC_EDTYPE;
  Dtypes dtypes;
  if (!Decode(TIR_BYOC_SIG_F32, &dtypes)) return TIR_BYOC_EDTYPE;
  const tir_byoc_epilogue &epilogue = call->epilogue;
  const int64_t m = call->m, n = call->n, k = call->k;
  const int64_t count = call->batch.count[0] * call->batch.count[1];
  if (m == 0 || n == 0 || count == 0) return TIR_BYOC_OK;
  float *y = static_cast<float *>(call->y);
  const int64_t rows = count * m;  // Y is compact: every batch's output at once
  if (k == 0) {  // an empty sum: the epilogue of 0 (oneDNN rejects zero-sized K)
    std::fill(y, y + rows * n, 0.0f);
    tir_byoc_run_epilogue(&epilogue, 0, y, rows, n);
    return TIR_BYOC_OK;
  }
  try {
    // Step 2. The product and the fused prefix of the epilogue, in one primitive.
    const tir_byoc_batch &key_batch = count == 1 ? kNoBatch : call->batch;
    Key key{m, n, k, TIR_BYOC_SIG_F32, call->layout, key_batch, Plan(epilogue)};
    const Key plain = key;
    const void *w = call->w;
    const PackHeader *header = static_cast<const PackHeader *>(w);
    const LayoutTable *layouts = nullptr;  // TIR_BYOC_PACK_LAYOUT_BY_M: the block's table
    int copy = 0;                           // and the copy this M reads
    if (packed) {
      if (!IsPack(header)) return TIR_BYOC_EPACKED;
      int64_t form = static_cast<int64_t>(header->form);
      if (form == TIR_BYOC_PACK_LAYOUT_BY_M) {
        layouts = reinterpret_cast<const LayoutTable *>(header + 1);
        copy = layouts->transposed[LayoutRange(rows)];
        form = copy ? TIR_BYOC_PACK_TRANSPOSED : TIR_BYOC_PACK_PLAIN;
      }
      key = FormKey(key, form);
    }
    std::shared_ptr<const Entry> entry = Cache().Get(key, dtypes);
    if (packed) {  // the block must hold this primitive's weight layout (by M: a copy in it)
      if (header->form == TIR_BYOC_PACK_LIBRARY_BY_M) {
        w = CopyFor(*header, *entry);
      } else if (layouts != nullptr) {  // its offsets count from the table's start
        const bool fits = layouts->layout[copy] == entry->layout &&
                          layouts->bytes[copy] == entry->weights.get_size();
        w = fits ? reinterpret_cast<const char *>(layouts) + layouts->offset[copy] : nullptr;
      } else
        w = PackFits(header, *entry) ? header + 1 : nullptr;
      if (w == nullptr) return TIR_BYOC_EPACKED;
    }
    // Step 3. Run it.  A guarded post-op (the last fused) may differ from C only where its
    // output is an infinity or a NaN, so such an output is computed again (step 4).
    std::shared_ptr<const Entry> ran = entry;
    int32_t status = Run(*entry, *call, w);
    if (status != TIR_BYOC_OK) return status;
    if (entry->fusion.guarded >= 0 && !tir_byoc_all_finite(y, rows * n)) {
      // Step 4. The fusion cut before the guarded op, on the plain weight (a block
      // unpacked); the inputs are as they were, as no epilogue tensor shares the output's
      // memory (tir_byoc.h).
      Key cut = plain;
      cut.fusion = entry->fusion.Prefix(entry->fusion.guarded);
      std::vector<float> unpacked;
      if (packed) {
        unpacked = Unpack(*entry, w, plain);
        w = unpacked.data();
      }
      ran = Cache().Get(cut, dtypes);
      if ((status = Run(*ran, *call, w)) != TIR_BYOC_OK) return status;
    }
    // Step 5. The ops after the fused prefix, in C.
    tir_byoc_run_epilogue(&epilogue, ran->fusion.ops(), y, rows, n);
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
TIR_BYOC_DEFINE_GEMM(onednn, Call);
TIR_BYOC_DEFINE_EPILOGUE_INFO(onednn)  // the ops oneDNN does not fuse run in C


/* The Key of a gemm call without x, y and the epilogue's tensors (they do not shape the
 * primitive), with the plain weight; false for arguments a call would refuse. */
bool PackKey(int64_t m, int64_t n, int64_t k, int32_t dtypes, int32_t layout, int64_t ops,
             const double *constants, const void *w, Key *key) {
  if (dtypes != TIR_BYOC_SIG_F32) return false;
  if (layout != TIR_BYOC_LAYOUT_NK && layout != TIR_BYOC_LAYOUT_KN) return false;
  if (tir_byoc_check_shape(m, n, k) != TIR_BYOC_OK || m == 0 || n == 0 || k == 0) return false;
  const void *const tensors[TIR_BYOC_MAX_TENSORS] = {w, w, w, w};  // only their presence counts
  tir_byoc_call call;
  call.m = m, call.n = n;
  if (tir_byoc_decode_epilogue(&call, ops, constants, tensors) != TIR_BYOC_OK) return false;
  *key = Key{m, n, k, TIR_BYOC_SIG_F32, static_cast<tir_byoc_layout>(layout), kNoBatch,
             Plan(call.epilogue)};
  return true;
}

/* 64-byte aligned scratch memory, for timing the candidate forms. */
struct Scratch {
  std::unique_ptr<void, decltype(&std::free)> data{nullptr, &std::free};
  explicit Scratch(size_t bytes) : data(std::aligned_alloc(64, (bytes + 63) / 64 * 64), &std::free) {
    if (data == nullptr) throw std::bad_alloc();
    std::memset(data.get(), 0, (bytes + 63) / 64 * 64);
  }
  void *get() const { return data.get(); }
};

/* The weight `w` (plain, as `plain` passes it) reordered into `entry`'s weight layout. */
void Reorder(const Key &plain, const Dtypes &dtypes, const void *w, const Entry &entry,
             void *out) {
  dnnl::memory source(PlainWeights(plain, dtypes.w), Engine(), const_cast<void *>(w));
  dnnl::memory target(entry.weights, Engine(), out);
  dnnl::reorder(source, target).execute(Stream(), source, target);
  Stream().wait();
}

/* Median seconds of a call of key `plain` with its weight in each of `forms` (the weight `w`
 * reordered into each), timed on this machine: scratch operands, every buffer 64-byte aligned
 * as TVM allocates them (where a weight starts changes how fast jit gemm reads it: a 768 x
 * 3072 K x N weight at M = 128 takes 14 ms aligned, 8 ms at an offset of 16 bytes), the forms
 * in interleaved rounds after a warm-up, at least 3 and at most 9, stopping after 0.2 s. */
std::vector<double> TimeForms(const Key &plain, const Dtypes &dtypes, const void *w,
                              const std::vector<int32_t> &forms) {
  const size_t word = sizeof(float);
  Scratch x(plain.m * plain.k * word), y(plain.m * plain.n * word),
      operand(plain.m * plain.n * word);
  float *xs = static_cast<float *>(x.get());
  uint32_t state = 12345;  // values in [-1, 1): no denormals, no infinities
  for (int64_t i = 0; i < plain.m * plain.k; ++i) {
    state = state * 1664525u + 1013904223u;
    xs[i] = static_cast<float>(state >> 8) / static_cast<float>(1u << 23) - 1.0f;
  }
  const void *operands[TIR_BYOC_MAX_OPS];
  std::fill(operands, operands + TIR_BYOC_MAX_OPS, operand.get());
  std::vector<std::shared_ptr<const Entry>> entries;
  std::vector<Scratch> weights;
  for (int32_t form : forms) {
    entries.push_back(Cache().Get(FormKey(plain, form), dtypes));
    weights.emplace_back(entries.back()->weights.get_size());
    Reorder(plain, dtypes, w, *entries.back(), weights.back().get());
  }
  auto run = [&](size_t c) {
    if (Execute(*entries[c], x.get(), weights[c].get(), operand.get(), operands, y.get()) !=
        TIR_BYOC_OK)
      throw std::runtime_error("a form failed to run");
  };
  using clock = std::chrono::steady_clock;
  std::vector<std::vector<double>> times(forms.size());
  for (size_t c = 0; c < forms.size(); ++c) run(c);  // caches, pages, oneDNN's scratchpad
  const clock::time_point start = clock::now();
  for (int round = 0; round < 9; ++round) {
    for (size_t c = 0; c < forms.size(); ++c) {
      const clock::time_point before = clock::now();
      run(c);
      times[c].push_back(std::chrono::duration<double>(clock::now() - before).count());
    }
    if (round >= 2 && clock::now() - start > std::chrono::milliseconds(200)) break;
  }
  std::vector<double> medians;
  for (std::vector<double> &values : times) {
    std::sort(values.begin(), values.end());
    medians.push_back(values[values.size() / 2]);
  }
  return medians;
}

/* The M a call with a symbolic M is timed at when choosing a form valid for every M. */
constexpr int64_t kSampleRows[] = {1, 32, 256};
/* The M the plain weight and its transpose are timed at for TIR_BYOC_PACK_LAYOUT_BY_M; a range
 * of M (LayoutTable) takes the verdict of the sampled M nearest to it (log scale). */
constexpr int64_t kLayoutSampleRows[] = {1, 8, 32, 128, 512};
using LayoutRanges = std::array<uint8_t, kLayoutRanges>;

/* The ranges a block by layout of key `plain` gives the transpose, as measured: the call that
 * writes the block uses the table its choice measured, and other weights of the key reuse it. */
std::unordered_map<Key, LayoutRanges, KeyHash> &LayoutChoices(std::unique_lock<std::mutex> *lock) {
  static std::mutex mutex;
  static std::unordered_map<Key, LayoutRanges, KeyHash> choices;
  *lock = std::unique_lock<std::mutex>(mutex);
  return choices;
}

/* Per range of M, whether a call of key `plain` (a symbolic M) reads the transposed weight:
 * where it is 5 % faster than the plain one at the nearest of kLayoutSampleRows. */
LayoutRanges TimeLayouts(const Key &plain, const Dtypes &dtypes, const void *w) {
  const std::vector<int32_t> forms{TIR_BYOC_PACK_PLAIN, TIR_BYOC_PACK_TRANSPOSED};
  std::vector<uint8_t> faster;
  for (int64_t m : kLayoutSampleRows) {
    Key key = plain;
    key.m = m;
    const std::vector<double> medians = TimeForms(key, dtypes, w, forms);
    faster.push_back(medians[1] < 0.95 * medians[0]);
  }
  LayoutRanges ranges{};
  for (int r = 0; r < kLayoutRanges; ++r) {
    double nearest = 1e9;
    for (size_t i = 0; i < faster.size(); ++i) {
      const double distance = std::fabs(r + 0.5 - std::log2(kLayoutSampleRows[i]));
      if (distance < nearest) nearest = distance, ranges[r] = faster[i];
    }
  }
  return ranges;
}

/* TimeLayouts for key `plain`, measured once per process (a model's layers of one shape and
 * epilogue share it; the values of the weight do not change the time). */
LayoutRanges MeasuredLayouts(const Key &plain, const Dtypes &dtypes, const void *w) {
  std::unique_lock<std::mutex> lock;
  auto &choices = LayoutChoices(&lock);
  auto found = choices.find(plain);
  if (found != choices.end()) return found->second;
  lock.unlock();
  const LayoutRanges ranges = TimeLayouts(plain, dtypes, w);
  lock.lock();
  return choices.emplace(plain, ranges).first->second;
}

/* The table of TIR_BYOC_PACK_LAYOUT_BY_M for key `plain` (MeasuredLayouts);
 * TIR_BYOC_ONEDNN_PACK=layout_by_m (tests) gives the transpose every other range, so that
 * both copies serve calls. */
LayoutRanges LayoutTableOf(const Key &plain, const Dtypes &dtypes, const void *w) {
  const char *setting = std::getenv("TIR_BYOC_ONEDNN_PACK");
  if (setting != nullptr && std::string(setting) == "layout_by_m") {
    LayoutRanges alternate{};
    for (int r = 0; r < kLayoutRanges; ++r) alternate[r] = r % 2 == 0;
    return alternate;
  }
  return MeasuredLayouts(plain, dtypes, w);
}

/* The form a call of key `plain` is fastest with on this machine, for its M or, with `any_m`,
 * for every M: the transposed weight, or the library's layouts by M (a block holding the
 * layout oneDNN asks for at each M, TIR_BYOC_PACK_LIBRARY_BY_M).  A candidate is a form whose
 * primitive runs the same kernel with the same fused epilogue (whose exactness the table
 * above Plan measured) on a different weight layout; it wins on its medians (TimeForms, at
 * each of kSampleRows with `any_m`, the library's layout being the one of that M) only if it
 * is 5 % faster than the plain weight on average and nowhere 5 % slower.
 * TIR_BYOC_ONEDNN_PACK=library (or always), transposed or plain names the form instead (for
 * tests and measurements); library names the form by M for `any_m`. */
int32_t ChooseForm(const Key &plain, const Dtypes &dtypes, const void *w, bool any_m) {
  const int32_t library = any_m ? TIR_BYOC_PACK_LIBRARY_BY_M : TIR_BYOC_PACK_LIBRARY;
  if (const char *setting = std::getenv("TIR_BYOC_ONEDNN_PACK")) {
    const std::string named = setting;
    if (named == "library" || named == "always") return library;
    if (named == "transposed") return TIR_BYOC_PACK_TRANSPOSED;
    if (named == "plain") return TIR_BYOC_PACK_PLAIN;
    if (named == "layout_by_m" && any_m) return TIR_BYOC_PACK_LAYOUT_BY_M;
  }
  std::vector<int64_t> rows{plain.m};
  if (any_m) rows.assign(std::begin(kSampleRows), std::end(kSampleRows));
  std::vector<int32_t> forms{TIR_BYOC_PACK_PLAIN};
  std::vector<uint64_t> layouts{Cache().Get(plain, dtypes)->layout};
  for (int32_t form : {TIR_BYOC_PACK_TRANSPOSED, library}) {
    // A candidate runs the plain weight's kernel at every row; a form by M is the plain
    // weight again if its layout is the plain one at every row.
    bool candidate = true, plain_layout = true;
    for (int64_t m : rows) {
      Key key = plain;
      key.m = m;
      std::shared_ptr<const Entry> base = Cache().Get(key, dtypes);
      std::shared_ptr<const Entry> entry = Cache().Get(FormKey(key, form), dtypes);
      candidate = candidate && entry->implementation == base->implementation &&
                  entry->fusion == base->fusion;
      plain_layout = plain_layout && entry->layout == base->layout;
    }
    const uint64_t layout = Cache().Get(FormKey(plain, form), dtypes)->layout;
    const bool known = form == TIR_BYOC_PACK_LIBRARY_BY_M
                           ? plain_layout
                           : std::find(layouts.begin(), layouts.end(), layout) != layouts.end();
    if (!candidate || known) continue;
    forms.push_back(form);
    layouts.push_back(layout);
  }
  // Each form's time relative to the plain weight's at each row count: a form wins if it is
  // 5 % faster on average and nowhere 5 % slower, so that noise keeps the plain path.
  std::vector<double> mean(forms.size(), 0.0), worst(forms.size(), 0.0);
  for (int64_t m : rows) {
    if (forms.size() == 1) break;
    Key key = plain;
    key.m = m;
    std::vector<double> medians;
    try {
      medians = TimeForms(key, dtypes, w, forms);
    } catch (const std::exception &) {  // a form that fails to run is kept out: plain it is
      return TIR_BYOC_PACK_PLAIN;
    }
    for (size_t c = 1; c < forms.size(); ++c) {
      mean[c] += medians[c] / medians[0] / static_cast<double>(rows.size());
      worst[c] = std::max(worst[c], medians[c] / medians[0]);
    }
  }
  int32_t best = TIR_BYOC_PACK_PLAIN;
  double fastest = 0.95;
  for (size_t c = 1; c < forms.size(); ++c) {
    if (mean[c] < fastest && worst[c] < 1.05) fastest = mean[c], best = forms[c];
  }
  // For every M, where the plain weight would be kept but its transpose is a candidate: the
  // transpose at the ranges of M it is faster at, if that is some but not all of them.
  const bool transposable =
      std::find(forms.begin(), forms.end(), TIR_BYOC_PACK_TRANSPOSED) != forms.end();
  if (!any_m || best != TIR_BYOC_PACK_PLAIN || !transposable) return best;
  LayoutRanges ranges;
  try {
    ranges = MeasuredLayouts(plain, dtypes, w);
  } catch (const std::exception &) {
    return TIR_BYOC_PACK_PLAIN;
  }
  const int transposed = static_cast<int>(std::count(ranges.begin(), ranges.end(), 1));
  if (transposed == 0) return TIR_BYOC_PACK_PLAIN;
  return transposed == kLayoutRanges ? TIR_BYOC_PACK_TRANSPOSED : TIR_BYOC_PACK_LAYOUT_BY_M;
}

/* `header` zeroed, then its magic, form, layout and byte count (the data after it). */
void StartHeader(PackHeader *header, int64_t form, uint64_t layout, uint64_t bytes) {
  std::memset(header, 0, sizeof *header);
  std::memcpy(header->magic, kPackMagic, sizeof kPackMagic);
  header->layout = layout;
  header->bytes = bytes;
  header->form = static_cast<uint64_t>(form);
}

/* The primitives whose layouts a block by M of key `plain` holds: the first to ask for each
 * distinct layout at the M of kLayoutRows, at most kMaxCopies of them. */
std::vector<std::pair<int64_t, std::shared_ptr<const Entry>>> CopiesByM(const Key &plain,
                                                                        const Dtypes &dtypes) {
  std::vector<std::pair<int64_t, std::shared_ptr<const Entry>>> copies;
  for (int64_t m : kLayoutRows) {
    Key key = FormKey(plain, TIR_BYOC_PACK_LIBRARY_BY_M);
    key.m = m;
    std::shared_ptr<const Entry> entry = Cache().Get(key, dtypes);
    const bool held = std::any_of(copies.begin(), copies.end(), [&](const auto &copy) {
      return copy.second->layout == entry->layout;
    });
    if (!held && copies.size() < kMaxCopies) copies.emplace_back(m, entry);
  }
  return copies;
}

/* Write a block by M of the plain weight `w` (key `plain`) to `header`: the table, then each
 * copy 64-byte aligned; its size (header included) if `header` is NULL. */
int64_t PackByM(const Key &plain, const Dtypes &dtypes, const void *w, PackHeader *header) {
  const auto copies = CopiesByM(plain, dtypes);
  uint64_t offset = sizeof(PackTable);
  PackTable table{};
  for (size_t i = 0; i < copies.size(); ++i) {
    const Entry &entry = *copies[i].second;
    table.copy[i] = PackCopy{entry.layout, offset, entry.weights.get_size(), copies[i].first};
    offset += (entry.weights.get_size() + 63) / 64 * 64;
  }
  if (header != nullptr) {
    StartHeader(header, TIR_BYOC_PACK_LIBRARY_BY_M, table.copy[0].layout, offset);
    header->version = kByMVersion;
    header->copies = copies.size();
    char *data = reinterpret_cast<char *>(header + 1);
    std::memcpy(data, &table, sizeof table);
    for (size_t i = 0; i < copies.size(); ++i)
      Reorder(plain, dtypes, w, *copies[i].second, data + table.copy[i].offset);
  }
  return static_cast<int64_t>(sizeof(PackHeader) + offset);
}

/* Write a block by layout of the plain weight `w` (key `plain`) to `header`: the table, the
 * plain copy, the transposed one, each 64-byte aligned; its size (header included) if `header`
 * is NULL. */
int64_t PackLayoutByM(const Key &plain, const Dtypes &dtypes, const void *w, PackHeader *header) {
  const std::shared_ptr<const Entry> copies[2] = {
      Cache().Get(plain, dtypes), Cache().Get(FormKey(plain, TIR_BYOC_PACK_TRANSPOSED), dtypes)};
  LayoutTable table{};
  uint64_t offset = sizeof(LayoutTable);
  for (int i = 0; i < 2; ++i) {
    table.layout[i] = copies[i]->layout;
    table.offset[i] = offset;
    table.bytes[i] = copies[i]->weights.get_size();
    offset += (table.bytes[i] + 63) / 64 * 64;
  }
  if (header != nullptr) {
    const LayoutRanges ranges = LayoutTableOf(plain, dtypes, w);
    std::copy(ranges.begin(), ranges.end(), table.transposed);
    StartHeader(header, TIR_BYOC_PACK_LAYOUT_BY_M, table.layout[0], offset);
    header->version = kLayoutByMVersion;
    char *data = reinterpret_cast<char *>(header + 1);
    std::memcpy(data, &table, sizeof table);
    for (int i = 0; i < 2; ++i) Reorder(plain, dtypes, w, *copies[i], data + table.offset[i]);
  }
  return static_cast<int64_t>(sizeof(PackHeader) + offset);
}

/* Pack the plain weight w of a gemm call (the arguments of tir_byoc_onednn_gemm without the
 * operands x, y and the epilogue's tensors, which do not shape the primitive) in *form, into
 * `out`: *size bytes, 64-byte aligned.  The protocol is tir_byoc.h's (TIR_BYOC_PACKED_WEIGHT):
 * with out == NULL only *size is set, after choosing *form if it is TIR_BYOC_PACK_CHOOSE. */
extern "C" TIR_BYOC_EXPORT int32_t tir_byoc_onednn_pack(const void *w, int64_t m, int64_t n,
                                                       int64_t k, int32_t dtypes,
                                                       int32_t layout, int64_t ops, double c0,
                                                       double c1, double c2, double c3,
                                                       double c4, double c5, int32_t *form,
                                                       void *out, int64_t *size) {
  if (w == nullptr || form == nullptr || size == nullptr) return TIR_BYOC_ENULL;
  const double constants[TIR_BYOC_MAX_CONSTANTS] = {c0, c1, c2, c3, c4, c5};
  Key plain;
  Dtypes decoded;
  if (!PackKey(m, n, k, dtypes, layout, ops, constants, w, &plain) ||
      !Decode(TIR_BYOC_SIG_F32, &decoded))
    return TIR_BYOC_EDTYPE;
  try {
    if ((*form == TIR_BYOC_PACK_CHOOSE || *form == TIR_BYOC_PACK_CHOOSE_ANY_M) && out == nullptr)
      *form = ChooseForm(plain, decoded, w, *form == TIR_BYOC_PACK_CHOOSE_ANY_M);
    if (*form == TIR_BYOC_PACK_PLAIN && out == nullptr) {
      *size = 0;
      return TIR_BYOC_OK;
    }
    if (*form == TIR_BYOC_PACK_LIBRARY_BY_M || *form == TIR_BYOC_PACK_LAYOUT_BY_M) {
      const auto write = *form == TIR_BYOC_PACK_LIBRARY_BY_M ? PackByM : PackLayoutByM;
      const int64_t bytes = write(plain, decoded, w, nullptr);
      if (out == nullptr) {
        *size = bytes;
        return TIR_BYOC_OK;
      }
      if (*size < bytes) return TIR_BYOC_ESHAPE;
      write(plain, decoded, w, static_cast<PackHeader *>(out));
      return TIR_BYOC_OK;
    }
    if (*form != TIR_BYOC_PACK_LIBRARY && *form != TIR_BYOC_PACK_TRANSPOSED)
      return TIR_BYOC_EDTYPE;
    std::shared_ptr<const Entry> entry = Cache().Get(FormKey(plain, *form), decoded);
    const int64_t bytes = static_cast<int64_t>(sizeof(PackHeader) + entry->weights.get_size());
    if (out == nullptr) {
      *size = bytes;
      return TIR_BYOC_OK;
    }
    if (*size < bytes) return TIR_BYOC_ESHAPE;
    PackHeader *header = static_cast<PackHeader *>(out);
    StartHeader(header, *form, entry->layout, entry->weights.get_size());
    Reorder(plain, decoded, w, *entry, header + 1);
  } catch (...) {
    return TIR_BYOC_EBACKEND;
  }
  return TIR_BYOC_OK;
}

/* Cache introspection for tests and benchmarks: out[0..3] = size, capacity, hits, misses. */
extern "C" TIR_BYOC_EXPORT void tir_byoc_onednn_cache_info(int64_t *out) { Cache().Info(out); }

/* How the gemm entry point computes the op `code` with constants c0..c2 (not a tensor op) on
 * this machine: 1 as a post-op of its primitive, 2 as a guarded one (Fusion::guarded), 0 in C
 * after the primitive (PostOpOf, FasterInC, then Checked); for reports and tests. */
extern "C" TIR_BYOC_EXPORT int32_t tir_byoc_onednn_fuses(int32_t code, double c0, double c1,
                                                        double c2) {
  tir_byoc_op op{};
  op.code = code;
  op.c[0] = c0;
  op.c[1] = c1;
  op.c[2] = c2;
  PostOp post;
  if (tir_byoc_op_has_tensor(code) || !PostOpOf(op, &post) || FasterInC(post)) return 0;
  switch (Checked(op, &post)) {
    case Verdict::kExact:
      return 1;
    case Verdict::kWhereFinite:
      return 2;
    default:
      return 0;
  }
}

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
    const Key key{m, n, k, dtypes, layout, kNoBatch,
                  FamilyFusion(decoded, bias != 0, relu != 0, false)};
    std::shared_ptr<const Entry> entry = Cache().Get(key, decoded);
    std::strncpy(out, entry->implementation.c_str(), static_cast<size_t>(size - 1));
    out[size - 1] = '\0';
  } catch (...) {
    return TIR_BYOC_EBACKEND;
  }
  return TIR_BYOC_OK;
}

/* The oneDNN kernels a gemm call runs with the plain weight and with a packed one, written to
 * `plain` and `packed` (NUL-terminated, at most `size` bytes each); for reports. */
extern "C" TIR_BYOC_EXPORT int32_t tir_byoc_onednn_pack_kernels(
    int64_t m, int64_t n, int64_t k, int32_t dtypes, int32_t layout, int64_t ops, double c0,
    double c1, double c2, double c3, double c4, double c5, char *plain, char *packed,
    int64_t size) {
  const double constants[TIR_BYOC_MAX_CONSTANTS] = {c0, c1, c2, c3, c4, c5};
  Key keys[2];
  const void *dummy = &keys;
  if (plain == nullptr || packed == nullptr || size <= 0) return TIR_BYOC_ENULL;
  if (!PackKey(m, n, k, dtypes, layout, ops, constants, dummy, &keys[0]))
    return TIR_BYOC_EDTYPE;
  keys[1] = FormKey(keys[0], TIR_BYOC_PACK_LIBRARY);
  Dtypes decoded;
  if (!Decode(TIR_BYOC_SIG_F32, &decoded)) return TIR_BYOC_EDTYPE;
  try {
    char *out[2] = {plain, packed};
    for (int i = 0; i < 2; ++i) {
      std::strncpy(out[i], Cache().Get(keys[i], decoded)->implementation.c_str(),
                   static_cast<size_t>(size - 1));
      out[i][size - 1] = '\0';
    }
  } catch (...) {
    return TIR_BYOC_EBACKEND;
  }
  return TIR_BYOC_OK;
}
