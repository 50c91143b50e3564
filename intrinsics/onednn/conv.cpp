/*
 * onednn/conv.cpp - the oneDNN convolution: the conv entry point of tir_byoc.h as one oneDNN
 * convolution_forward primitive (fp32), symbol tir_byoc_onednn_conv, registry key
 * onednn.conv; and tir_byoc_onednn_conv_pack, which lays a constant weight out once, at build
 * time, in the layout the primitive asks for.
 *
 * - Activations are described to oneDNN in their TVM layout (plain ncw/nchw/ncdhw or
 *   nwc/nhwc/ndhwc).  The spatial dims the call passes as trivial (extent, kernel, stride and
 *   dilation 1, padding 0) at the end are dropped: a 2-D convolution is a 2-D primitive.
 * - The plain weight is described by its strides (O, I/G, k... or k..., I/G, O, with a group
 *   dim in front when groups > 1).  oneDNN's fast kernels want a blocked weight, and most of
 *   them blocked activations too (on AVX2 a depthwise 3x3 over 32 x 112 x 112 took 15 ms on
 *   plain nchw, 0.3 ms on nChw8c).  So a weight packed at build time (TIR_BYOC_PACKED_WEIGHT)
 *   takes one of two forms: TIR_BYOC_PACK_LIBRARY, the weight in the layout the primitive asks
 *   for (format_tag::any), on the plain activations; TIR_BYOC_PACK_CONV_BLOCKED, that and the
 *   activations in the layouts the primitive asks for, x and y reordered into and out of
 *   per-thread buffers around it.  The pack function times the plain weight and both forms on
 *   the call and keeps the fastest if it is 5 % faster than the plain weight
 *   (TIR_BYOC_ONEDNN_PACK=library|blocked|plain names the form instead).  A weight passed as
 *   a parameter runs the plain form.  The library form is timed on each implementation
 *   oneDNN offers for the call, not only its first (ChooseForm says why); the block's header
 *   names the one kept, and its calls run it (TIR_BYOC_ONEDNN_CONV_KERNEL=first keeps oneDNN's
 *   first).
 * - The epilogue: a leading bias is the primitive's bias argument (oneDNN adds it to the fp32
 *   sum, as the TIR adds it to the finished sum: one rounding each), then the ops oneDNN
 *   computes exactly as tir_byoc_epilogue.h does are post-ops: relu (each NaN spelling only
 *   if the kernel the call runs gives what the C relu gives on NaN, infinities and signed
 *   zeros, checked once per shape: EltwiseAgrees), a clip (as the first of eltwise_clip_v2,
 *   eltwise_clip and binary_min/binary_max of its bounds that the same check finds giving the
 *   C clip's values, NaN included: ClipForm), a residual add (binary add of a tensor of y's
 *   layout), a channel scale and a later bias (binary mul and add of an (o,) vector: a batch
 *   norm's scale and shift).  The ops after the first other op run in C
 *   (tir_byoc_conv_epilogue), and all of them on the gemm-based kernel.
 * - Primitives are created once per (shape, layouts, packed, fused epilogue, thread count) and
 *   kept in a thread-safe cache; each runs with a user scratchpad of the calling thread (the
 *   PyPI oneDNN is built without concurrent execution, so its own scratchpad is shared by all
 *   threads).
 */
#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "tir_byoc.h"
#include "tir_byoc_conv_ref.h"

namespace {

using dt = dnnl::memory::data_type;
using dims = dnnl::memory::dims;
using tag = dnnl::memory::format_tag;

dnnl::engine &Engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::stream &Stream() {
  thread_local dnnl::stream stream(Engine());
  return stream;
}

/* One fused op of the epilogue: an eltwise relu, a clip, or a binary op on the residual / the
 * channel vector. */
enum class Post : int32_t { kRelu, kAdd, kChannelScale, kChannelAdd, kClip };

/* An op that reads no tensor of the call: relu, clip. */
bool IsEltwise(Post post) { return post == Post::kRelu || post == Post::kClip; }

/* The oneDNN post-ops a clip may be fused as, in the order KeyOf tries them.  They differ on
 * NaN, which the C clip maps to the key's c2, the value TVM's spelling of the clip gives:
 * eltwise_clip_v2 and eltwise_clip give lo (seen on brgconv_1x1 and gemm:jit with AVX-512),
 * so they serve the spellings whose NaN result is lo (min(max(z, lo), hi)); binary_min of hi
 * then binary_max of lo (scalar operands, broadcast) give hi, what topi.clip's
 * max(min(z, hi), lo) gives: the clip of ReLU6.  None gives NaN for NaN.  Each is kept only
 * where the probe of the key's kernel agrees (EltwiseAgrees). */
enum class ClipForm : int32_t { kClipV2, kClip, kMinMax };
constexpr ClipForm kClipForms[] = {ClipForm::kClipV2, ClipForm::kClip, ClipForm::kMinMax};

/* What a primitive is specialised for: the call's geometry, the weight's form, the fused
 * prefix of the epilogue and the calling thread's OpenMP thread count.  oneDNN splits a
 * primitive's work for the count it is created at and keeps that split: a model first called
 * at one thread and then at two kept the one-thread split of MobileNetV2's convolutions
 * (8.5 ms a call at two threads against 5.9 from a first call at two; AMD EPYC Zen 4), and
 * its bits followed the first call's count, not the current one. */
struct Key {
  int32_t threads = omp_get_max_threads();
  int32_t layout, weight_layout;
  int64_t n, c, o, groups;
  std::array<int64_t, 3> in, out, kernel, stride, dilation, pad;
  bool packed = false;   // the weight in the layout the primitive asks for
  bool blocked = false;  // ... and the activations too, reordered around the primitive
  bool bias = false;
  std::vector<Post> post;
  std::array<uint32_t, 3> clip{};  // the bits of a clip's lo, hi and NaN result (one clip)
  ClipForm clip_form = ClipForm::kClipV2;  // the post-ops the clip is fused as
  // The oneDNN implementation to run (its impl_info_str), empty for the first oneDNN offers;
  // one it does not offer for the key runs the first too (see Implementation).
  std::string implementation;

  auto Tie() const {
    return std::tie(threads, layout, weight_layout, n, c, o, groups, in, out, kernel, stride,
                    dilation, pad, packed, blocked, bias, post, clip, clip_form, implementation);
  }
  bool operator<(const Key &other) const { return Tie() < other.Tie(); }
};

struct Entry {
  dnnl::convolution_forward primitive;
  dnnl::memory::desc src, weights, bias, dst, scratchpad, channel;
  // The activations as the primitive reads and writes them: src and dst, or (blocked) the
  // layouts it asked for, with the reorders from and to the call's layout.
  dnnl::memory::desc inner_src, inner_dst;
  dnnl::reorder to_inner, to_plain;
  bool reorder_src = false, reorder_dst = false;
  std::string implementation;
  std::string blocking;  // the weights' descriptor as a block's header holds it (Blocking)
  uint64_t id;
};

std::atomic<uint64_t> next_entry_id{1};

std::string BlockingOf(const dnnl::memory::desc &weights);

float FloatOf(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

uint32_t BitsOf(double value) {
  const float single = static_cast<float>(value);
  uint32_t bits;
  std::memcpy(&bits, &single, sizeof bits);
  return bits;
}

/* The number of spatial dims the primitive needs: trailing trivial ones dropped, at least 1. */
int SpatialDims(const Key &key) {
  int count = 3;
  while (count > 1 && key.in[count - 1] == 1 && key.out[count - 1] == 1 &&
         key.kernel[count - 1] == 1 && key.pad[count - 1] == 0)
    --count;
  return count;
}

dnnl::memory::desc Activations(const Key &key, int64_t channels,
                               const std::array<int64_t, 3> &spatial) {
  const int count = SpatialDims(key);
  dims shape{key.n, channels};
  for (int a = 0; a < count; ++a) shape.push_back(spatial[a]);
  static const tag first[] = {tag::ncw, tag::nchw, tag::ncdhw};
  static const tag last[] = {tag::nwc, tag::nhwc, tag::ndhwc};
  const tag format = key.layout == TIR_BYOC_CONV_CHANNELS_FIRST ? first[count - 1] : last[count - 1];
  return dnnl::memory::desc(shape, dt::f32, format);
}

/* The weight as the call passes it, by strides: (G,) O/G, I/G, k... over the plain layout. */
dnnl::memory::desc PlainWeights(const Key &key) {
  const int count = SpatialDims(key);
  const int64_t in_group = key.c / key.groups, out_group = key.o / key.groups;
  dims window(key.kernel.begin(), key.kernel.begin() + count);
  dims window_strides(count);
  int64_t inner = key.weight_layout == TIR_BYOC_CONV_WEIGHT_OIK ? 1 : in_group * key.o;
  for (int a = count - 1; a >= 0; --a) window_strides[a] = inner, inner *= window[a];
  const int64_t volume = inner / (key.weight_layout == TIR_BYOC_CONV_WEIGHT_OIK ? 1 : in_group * key.o);
  int64_t o_stride, i_stride;
  if (key.weight_layout == TIR_BYOC_CONV_WEIGHT_OIK)
    o_stride = in_group * volume, i_stride = volume;
  else
    o_stride = 1, i_stride = key.o;
  dims shape, strides;
  if (key.groups > 1) shape.push_back(key.groups), strides.push_back(out_group * o_stride);
  shape.push_back(out_group), strides.push_back(o_stride);
  shape.push_back(in_group), strides.push_back(i_stride);
  shape.insert(shape.end(), window.begin(), window.end());
  strides.insert(strides.end(), window_strides.begin(), window_strides.end());
  return dnnl::memory::desc(shape, dt::f32, strides);
}

/* One value broadcast over the output: a binary post-op's operand (1, 1, 1...). */
dnnl::memory::desc ScalarOperand(int spatial_dims) {
  const dims shape(2 + spatial_dims, 1);
  return dnnl::memory::desc(shape, dt::f32, dims(shape.size(), 1));
}

dnnl::memory::desc AnyWeights(const Key &key) {
  dnnl::memory::desc plain = PlainWeights(key);
  return dnnl::memory::desc(plain.get_dims(), dt::f32, tag::any);
}

using ConvDesc = dnnl::convolution_forward::primitive_desc;

/* The descriptor of oneDNN's first implementation for `key`, and `entry`'s descriptors. */
ConvDesc FirstDesc(const Key &key, Entry &entry) {
  const int count = SpatialDims(key);
  entry.src = Activations(key, key.c, key.in);
  entry.dst = Activations(key, key.o, key.out);
  entry.weights = key.packed ? AnyWeights(key) : PlainWeights(key);
  if (key.bias) entry.bias = dnnl::memory::desc({key.o}, dt::f32, tag::a);
  dims strides, dilation, left, right;
  for (int a = 0; a < count; ++a) {
    strides.push_back(key.stride[a]);
    dilation.push_back(key.dilation[a] - 1);
    left.push_back(key.pad[a]);
    right.push_back((key.out[a] - 1) * key.stride[a] + (key.kernel[a] - 1) * key.dilation[a] + 1 -
                    key.in[a] - key.pad[a]);
  }
  dims channel_dims{1, key.o};
  for (int a = 0; a < count; ++a) channel_dims.push_back(1);
  dims channel_strides(channel_dims.size(), 1);  // the (o,) vector as (1, o, 1...)
  channel_strides[0] = key.o;
  entry.channel = dnnl::memory::desc(channel_dims, dt::f32, channel_strides);
  dnnl::post_ops ops;
  for (Post post : key.post) {
    if (post == Post::kRelu) {
      ops.append_eltwise(dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    } else if (post == Post::kClip && key.clip_form == ClipForm::kMinMax) {
      ops.append_binary(dnnl::algorithm::binary_min, ScalarOperand(count));
      ops.append_binary(dnnl::algorithm::binary_max, ScalarOperand(count));
    } else if (post == Post::kClip) {
      const dnnl::algorithm clip = key.clip_form == ClipForm::kClip
                                       ? dnnl::algorithm::eltwise_clip
                                       : dnnl::algorithm::eltwise_clip_v2;
      ops.append_eltwise(clip, FloatOf(key.clip[0]), FloatOf(key.clip[1]));
    } else if (post == Post::kAdd) {
      ops.append_binary(dnnl::algorithm::binary_add, entry.dst);
    } else if (post == Post::kChannelAdd) {
      ops.append_binary(dnnl::algorithm::binary_add, entry.channel);
    } else {
      ops.append_binary(dnnl::algorithm::binary_mul, entry.channel);
    }
  }
  dnnl::primitive_attr attr;
  attr.set_post_ops(ops);
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const dnnl::memory::desc any_src(entry.src.get_dims(), dt::f32, tag::any);
  const dnnl::memory::desc any_dst(entry.dst.get_dims(), dt::f32, tag::any);
  return ConvDesc(Engine(), dnnl::prop_kind::forward_inference,
                  dnnl::algorithm::convolution_direct, key.blocked ? any_src : entry.src,
                  entry.weights, entry.bias, key.blocked ? any_dst : entry.dst, strides, dilation,
                  left, right, attr);
}

/* Whether ChooseForm times `implementation` against oneDNN's first: not its reference
 * kernels, its gemm-based one (it runs post-ops in a slow pass, see KeyOf) or the SSE4.1 ones
 * (never within 2x of the AVX ones on the shapes of MobileNetV2 and ResNet-50). */
bool WorthTiming(const std::string &implementation) {
  return implementation.rfind("ref", 0) != 0 && implementation.find("gemm") == std::string::npos &&
         implementation.find("sse41") == std::string::npos;
}

/* The implementations oneDNN offers for `key` (whatever its key.implementation) that
 * ChooseForm times, oneDNN's first excluded. */
std::vector<std::string> Alternatives(const Key &key) {
  Entry scratch;
  ConvDesc desc = FirstDesc(key, scratch);
  std::vector<std::string> found;
  const std::string first = desc.impl_info_str();
  while (desc.next_impl()) {
    const std::string name = desc.impl_info_str();
    if (name != first && WorthTiming(name) &&
        std::find(found.begin(), found.end(), name) == found.end())
      found.push_back(name);
  }
  return found;
}

std::shared_ptr<const Entry> Create(const Key &key) {
  Entry entry;
  ConvDesc desc = FirstDesc(key, entry);
  if (!key.implementation.empty()) {
    // The named implementation, if oneDNN offers it for this key (next_impl leaves the last
    // one in place when none is left), else the first.
    while (desc.impl_info_str() != key.implementation && desc.next_impl()) {
    }
    if (desc.impl_info_str() != key.implementation) desc = FirstDesc(key, entry);
  }
  entry.implementation = desc.impl_info_str();
  if (key.packed) entry.weights = desc.weights_desc();
  entry.inner_src = desc.src_desc(), entry.inner_dst = desc.dst_desc();
  entry.reorder_src = entry.inner_src != entry.src;
  entry.reorder_dst = entry.inner_dst != entry.dst;
  if (entry.reorder_src)
    entry.to_inner = dnnl::reorder(dnnl::reorder::primitive_desc(Engine(), entry.src, Engine(),
                                                                 entry.inner_src));
  if (entry.reorder_dst)
    entry.to_plain = dnnl::reorder(dnnl::reorder::primitive_desc(Engine(), entry.inner_dst,
                                                                 Engine(), entry.dst));
  entry.scratchpad = desc.scratchpad_desc();
  entry.primitive = dnnl::convolution_forward(desc);
  entry.blocking = BlockingOf(entry.weights);
  entry.id = next_entry_id++;
  return std::make_shared<const Entry>(std::move(entry));
}

/* Created primitives by key; cleared when it holds kCapacity (a model has a few dozen). */
constexpr size_t kCapacity = 512;

/* What a process made once per key, shared by its threads (`bounded`: cleared when it holds
 * kCapacity). */
template <class K, class V>
struct SharedCache {
  bool bounded;
  std::mutex mutex;
  std::map<K, V> values;
};

/* The value of `key`: from the calling thread's own map `mine` first, without the lock (a call
 * of a small convolution takes tens of microseconds, and a locked lookup per call was a
 * measurable part of them), then from `shared`, else made by `make()` outside the lock
 * (creating or probing a primitive is slow) and kept in both, the first made winning.  `mine`
 * is cleared when it holds kCapacity. */
template <class K, class V, class Make>
V Once(std::map<K, V> &mine, SharedCache<K, V> &shared, const K &key, Make make) {
  auto known = mine.find(key);
  if (known != mine.end()) return known->second;
  if (mine.size() >= kCapacity) mine.clear();
  {
    std::lock_guard<std::mutex> lock(shared.mutex);
    auto found = shared.values.find(key);
    if (found != shared.values.end()) return mine.emplace(key, found->second).first->second;
  }
  V value = make();
  std::lock_guard<std::mutex> lock(shared.mutex);
  if (shared.bounded && shared.values.size() >= kCapacity) shared.values.clear();
  value = shared.values.emplace(key, value).first->second;
  return mine.emplace(key, value).first->second;
}

std::shared_ptr<const Entry> Get(const Key &key) {
  static SharedCache<Key, std::shared_ptr<const Entry>> shared{true, {}, {}};
  thread_local std::map<Key, std::shared_ptr<const Entry>> mine;
  return Once(mine, shared, key, [&] { return Create(key); });
}

/* The buffers of a thread (Scratchpad's `which`). */
enum ThreadBuffer : int {
  kScratchpad,
  kInnerSrc,          // the blocked activations of TIR_BYOC_PACK_CONV_BLOCKED
  kInnerDst,
  kReorderedWeights,  // a block's weight in the layout a call of another batch asks for
  kPlainWeights,      // ... and in the plain layout it may pass through
  kPairMiddle,        // a pair's intermediate, where it runs as two convolutions
  kScratchKinds
};

/* This thread's buffer `which`, at least `bytes` long (see the file comment); NULL without
 * memory. */
void *Scratchpad(size_t bytes, int which = kScratchpad) {
  struct Buffer {
    void *data = nullptr;
    size_t size = 0;
    ~Buffer() { std::free(data); }
  };
  thread_local Buffer buffers[kScratchKinds];
  Buffer &buffer = buffers[which];
  if (bytes > buffer.size) {
    const size_t size = (bytes + 63) / 64 * 64;
    void *grown = std::aligned_alloc(64, size);
    if (grown == nullptr) return nullptr;
    std::free(buffer.data);
    buffer.data = grown, buffer.size = size;
  }
  return buffer.data;
}

/* The memory objects of one entry's arguments, made once per thread and re-pointed per call. */
struct BoundArgs {
  dnnl::memory src, weights, bias, dst, scratchpad, plain_src, plain_dst;
  std::vector<dnnl::memory> operand;  // per op of key.post: the call's tensor it reads, if any
  dnnl::memory clip_hi, clip_lo;      // a clip fused as binary_min, binary_max: its bounds
  float clip_bounds[2] = {0.0f, 0.0f};  // ... held here (hi, lo): this object does not move
  std::vector<dnnl_exec_arg_t> args;
  dnnl_exec_arg_t to_inner[2], to_plain[2];  // the reorders' arguments

  BoundArgs(const Entry &entry, const Key &key) {
    dnnl::engine &engine = Engine();
    src = dnnl::memory(entry.inner_src, engine, DNNL_MEMORY_NONE);
    weights = dnnl::memory(entry.weights, engine, DNNL_MEMORY_NONE);
    dst = dnnl::memory(entry.inner_dst, engine, DNNL_MEMORY_NONE);
    if (entry.reorder_src) {
      plain_src = dnnl::memory(entry.src, engine, DNNL_MEMORY_NONE);
      to_inner[0] = {DNNL_ARG_FROM, plain_src.get()}, to_inner[1] = {DNNL_ARG_TO, src.get()};
    }
    if (entry.reorder_dst) {
      plain_dst = dnnl::memory(entry.dst, engine, DNNL_MEMORY_NONE);
      to_plain[0] = {DNNL_ARG_FROM, dst.get()}, to_plain[1] = {DNNL_ARG_TO, plain_dst.get()};
    }
    args.push_back({DNNL_ARG_SRC, src.get()});
    args.push_back({DNNL_ARG_WEIGHTS, weights.get()});
    args.push_back({DNNL_ARG_DST, dst.get()});
    if (key.bias) {
      bias = dnnl::memory(entry.bias, engine, DNNL_MEMORY_NONE);
      args.push_back({DNNL_ARG_BIAS, bias.get()});
    }
    // oneDNN numbers its post-ops, `at`; a clip fused as min and max is two of them.
    auto operand_of = [this](int at, const dnnl::memory &memory) {
      args.push_back({DNNL_ARG_ATTR_MULTIPLE_POST_OP(at) | DNNL_ARG_SRC_1, memory.get()});
    };
    int at = 0;
    for (size_t i = 0; i < key.post.size(); ++i, ++at) {
      operand.emplace_back();
      if (key.post[i] == Post::kClip && key.clip_form == ClipForm::kMinMax) {
        const dnnl::memory::desc scalar = ScalarOperand(SpatialDims(key));
        clip_bounds[0] = FloatOf(key.clip[1]), clip_bounds[1] = FloatOf(key.clip[0]);
        clip_hi = dnnl::memory(scalar, engine, &clip_bounds[0]);
        clip_lo = dnnl::memory(scalar, engine, &clip_bounds[1]);
        operand_of(at, clip_hi), operand_of(++at, clip_lo);
      } else if (!IsEltwise(key.post[i])) {
        const dnnl::memory::desc &md = key.post[i] == Post::kAdd ? entry.dst : entry.channel;
        operand.back() = dnnl::memory(md, engine, DNNL_MEMORY_NONE);
        operand_of(at, operand.back());
      }
    }
    if (entry.scratchpad.get_size() > 0) {
      scratchpad = dnnl::memory(entry.scratchpad, engine, DNNL_MEMORY_NONE);
      args.push_back({DNNL_ARG_SCRATCHPAD, scratchpad.get()});
    }
  }
};

BoundArgs &Bind(const Entry &entry, const Key &key) {
  thread_local std::unordered_map<uint64_t, std::unique_ptr<BoundArgs>> bound;
  auto found = bound.find(entry.id);
  if (found != bound.end()) return *found->second;
  if (bound.size() >= 2 * kCapacity) bound.clear();
  return *bound.emplace(entry.id, std::make_unique<BoundArgs>(entry, key)).first->second;
}

bool Point(const dnnl::memory &memory, const void *data) {
  return dnnl_memory_set_data_handle(memory.get(), const_cast<void *>(data)) == dnnl_success;
}

/* Run `entry` (made for `key`) on the caller's buffers; `operands[i]` for binary post-op i. */
int32_t Execute(const Entry &entry, const Key &key, const void *x, const void *w,
                const void *bias, const void *const *operands, void *y) {
  BoundArgs &bound = Bind(entry, key);
  void *inner_src =
      entry.reorder_src ? Scratchpad(entry.inner_src.get_size(), kInnerSrc) : nullptr;
  void *inner_dst =
      entry.reorder_dst ? Scratchpad(entry.inner_dst.get_size(), kInnerDst) : nullptr;
  if ((entry.reorder_src && inner_src == nullptr) || (entry.reorder_dst && inner_dst == nullptr))
    return TIR_BYOC_EBACKEND;
  bool pointed = Point(bound.src, entry.reorder_src ? inner_src : x) && Point(bound.weights, w) &&
                 Point(bound.dst, entry.reorder_dst ? inner_dst : y);
  if (entry.reorder_src) pointed = pointed && Point(bound.plain_src, x);
  if (entry.reorder_dst) pointed = pointed && Point(bound.plain_dst, y);
  if (key.bias) pointed = pointed && Point(bound.bias, bias);
  for (size_t i = 0; i < key.post.size(); ++i)
    if (!IsEltwise(key.post[i])) pointed = pointed && Point(bound.operand[i], operands[i]);
  const size_t scratchpad_bytes = entry.scratchpad.get_size();
  if (scratchpad_bytes > 0) {
    void *scratchpad = Scratchpad(scratchpad_bytes);
    if (scratchpad == nullptr) return TIR_BYOC_EBACKEND;
    pointed = pointed && Point(bound.scratchpad, scratchpad);
  }
  if (!pointed) return TIR_BYOC_EBACKEND;
  dnnl::stream &stream = Stream();
  if (entry.reorder_src &&
      dnnl_primitive_execute(entry.to_inner.get(), stream.get(), 2, bound.to_inner) != dnnl_success)
    return TIR_BYOC_EBACKEND;
  if (dnnl_primitive_execute(entry.primitive.get(), stream.get(),
                             static_cast<int>(bound.args.size()), bound.args.data()) != dnnl_success)
    return TIR_BYOC_EBACKEND;
  if (entry.reorder_dst &&
      dnnl_primitive_execute(entry.to_plain.get(), stream.get(), 2, bound.to_plain) != dnnl_success)
    return TIR_BYOC_EBACKEND;
  if (dnnl_stream_wait(stream.get()) != dnnl_success) return TIR_BYOC_EBACKEND;
  return TIR_BYOC_OK;
}

/* ------------------------------------------------------------------------------------------
 * Whether oneDNN's relu post-op computes what the C relu does, for the kernel a key runs: the
 * kernels differ (on AVX2 the gemm-based one gives NaN for -inf, 0 * -inf), so each key's is
 * checked once, on its own primitive with a bias: zero input and weight, the bias cycling
 * through NaN, the infinities, signed zeros, huge, tiny and plain values, each output compared
 * with the C epilogue's relu of its channel's value (any NaN equals any NaN; as the gemm entry
 * point's probe has it, -0 equals 0).
 */
bool SameFloat(float got, float want) {
  if (std::isnan(want)) return std::isnan(got);
  return got == want;
}

/* The probe itself (EltwiseAgrees caches it): `probe` has the one eltwise post-op. */
bool ProbeEltwise(const Key &probe, const tir_byoc_op &op) {
  static const float kValues[] = {NAN, -NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1.0f, -1.0f,
                                  3.0e38f, -3.0e38f, 1e-38f, -1e-38f, 0.5f, -0.5f, 7.0f, -7.0f};
  constexpr int kCount = sizeof kValues / sizeof kValues[0];
  std::shared_ptr<const Entry> entry = Get(probe);
  const int64_t positions = probe.out[0] * probe.out[1] * probe.out[2];
  const int64_t inputs = probe.n * probe.c * probe.in[0] * probe.in[1] * probe.in[2];
  std::vector<float> x(inputs, 0.0f), y(probe.n * probe.o * positions, 1.0f);
  std::vector<float> bias(probe.o);
  for (int64_t o = 0; o < probe.o; ++o) bias[o] = kValues[o % kCount];
  std::vector<char> weights(entry->weights.get_size() + 64, 0);
  void *w = reinterpret_cast<void *>((reinterpret_cast<uintptr_t>(weights.data()) + 63) / 64 * 64);
  if (Execute(*entry, probe, x.data(), w, bias.data(), nullptr, y.data()) != TIR_BYOC_OK)
    return false;
  for (int64_t b = 0; b < probe.n; ++b)
    for (int64_t o = 0; o < probe.o; ++o) {
      float want = bias[o];
      tir_byoc_op_span(&op, &want, 0, 0, 1, 1);
      for (int64_t p = 0; p < positions; ++p) {
        const int64_t at = probe.layout == TIR_BYOC_CONV_CHANNELS_FIRST
                               ? (b * probe.o + o) * positions + p
                               : (b * positions + p) * probe.o + o;
        if (!SameFloat(y[at], want)) return false;
      }
    }
  return true;
}

/* Whether the eltwise post-op `post` (the last of key.post) computes `op` as the C epilogue
 * does, for the kernel of `key`'s shape. */
bool EltwiseAgrees(const Key &key, Post post, const tir_byoc_op &op) {
  static SharedCache<std::pair<Key, int32_t>, bool> shared{false, {}, {}};
  thread_local std::map<std::pair<Key, int32_t>, bool> mine;  // every call asks: no lock
  Key probe = key;
  probe.bias = true, probe.post = {post};
  return Once(mine, shared, {probe, op.code}, [&] {
    try {
      return ProbeEltwise(probe, op);
    } catch (...) {
      return false;
    }
  });
}

/* The key of `conv` (its geometry) with the longest prefix of its epilogue oneDNN computes
 * exactly fused, on `implementation` (empty: oneDNN's first); *fused is set to how many ops
 * that is. */
Key KeyOf(const tir_byoc_conv &conv, int64_t form, int *fused,
          const std::string &implementation = std::string()) {
  Key key{};
  key.implementation = implementation;
  key.layout = conv.layout, key.weight_layout = conv.weight_layout;
  key.n = conv.n, key.c = conv.c, key.o = conv.o, key.groups = conv.groups;
  for (int a = 0; a < 3; ++a) {
    key.in[a] = conv.in[a], key.out[a] = conv.out[a], key.kernel[a] = conv.kernel[a];
    key.stride[a] = conv.stride[a], key.dilation[a] = conv.dilation[a], key.pad[a] = conv.pad[a];
  }
  key.packed = form == TIR_BYOC_PACK_LIBRARY || form == TIR_BYOC_PACK_CONV_BLOCKED;
  key.blocked = form == TIR_BYOC_PACK_CONV_BLOCKED;
  int i = 0;
  const tir_byoc_epilogue &epilogue = conv.epilogue;
  if (i < epilogue.count && epilogue.op[i].code == TIR_BYOC_OP_BIAS) key.bias = true, ++i;
  // Step 1. No post-ops where the shape runs the gemm-based convolution: it applies them in a
  // slow pass of its own (a 3x3 depthwise over 32 x 56 x 56 took twice as long with a clip
  // post-op as with the clip in C after), so its probes are not run either.
  const std::string plain_kernel = i < epilogue.count ? Get(key)->implementation : "";
  if (plain_kernel.find("gemm:") != std::string::npos) i = epilogue.count;
  // Step 2. The longest prefix of the ops that oneDNN computes as the C epilogue does.
  for (; i < epilogue.count; ++i) {
    const int32_t code = epilogue.op[i].code;
    if (code == TIR_BYOC_OP_RELU || code == TIR_BYOC_OP_RELU_KEEP_NAN) {
      key.post.push_back(Post::kRelu);
      if (!EltwiseAgrees(key, Post::kRelu, epilogue.op[i])) {
        key.post.pop_back();
        break;
      }
    } else if (code == TIR_BYOC_OP_CLIP) {
      if (std::find(key.post.begin(), key.post.end(), Post::kClip) != key.post.end()) break;
      for (int c = 0; c < 3; ++c) key.clip[c] = BitsOf(epilogue.op[i].c[c]);
      key.post.push_back(Post::kClip);
      bool agrees = false;
      for (ClipForm clip_form : kClipForms) {
        key.clip_form = clip_form;
        if ((agrees = EltwiseAgrees(key, Post::kClip, epilogue.op[i]))) break;
      }
      if (!agrees) {
        key.post.pop_back();
        key.clip = {}, key.clip_form = ClipForm::kClipV2;
        break;
      }
    } else if (code == TIR_BYOC_OP_ADD) {
      if (key.blocked) break;  // the residual is in the call's layout, not the blocked one
      key.post.push_back(Post::kAdd);
    } else if (code == TIR_BYOC_OP_CHANNEL_SCALE) {
      key.post.push_back(Post::kChannelScale);
    } else if (code == TIR_BYOC_OP_BIAS) {  // a bias after another op: z + b[o], one fp32 add
      key.post.push_back(Post::kChannelAdd);
    } else {
      break;
    }
  }
  // Step 3. Post-ops are dropped from the end, for the C epilogue to run, where oneDNN
  // implements them only in its reference kernels for this shape (slow, and not the kernels
  // the probes checked).
  auto slow = [](const std::string &kernel) {
    return kernel.rfind("ref", 0) == 0 || kernel.find("gemm:") != std::string::npos;
  };
  if (!slow(plain_kernel)) {
    while (!key.post.empty() && slow(Get(key)->implementation)) {
      if (key.post.back() == Post::kClip) key.clip = {}, key.clip_form = ClipForm::kClipV2;
      key.post.pop_back();
    }
  }
  *fused = (key.bias ? 1 : 0) + static_cast<int>(key.post.size());
  return key;
}

/* Run a conv call whose weight `w` is in the form of `key`; the unfused ops in C after. */
int32_t Run(const tir_byoc_conv &conv, const Key &key, int fused,
            const std::shared_ptr<const Entry> &entry, const void *w) {
  const void *operands[TIR_BYOC_MAX_OPS] = {nullptr};
  const int first = key.bias ? 1 : 0;
  for (size_t i = 0; i < key.post.size(); ++i) operands[i] = conv.epilogue.op[first + i].tensor;
  const void *bias = key.bias ? conv.epilogue.op[0].tensor : nullptr;
  int32_t status = Execute(*entry, key, conv.x, w, bias, operands, conv.y);
  if (status != TIR_BYOC_OK) return status;
  tir_byoc_conv_epilogue(&conv.epilogue, fused, &conv);
  return TIR_BYOC_OK;
}

/* ------------------------------------------------------------------------------------------
 * Packed weights: a header (PackHeader), then the weight reordered into the layout the
 * primitive created with format_tag::any asks for, for the batch n of the pack call.  The
 * header holds that layout's memory descriptor: dims, padded dims, strides and inner blocks
 * (what oneDNN 3.4's memory::desc::get_blob would serialise; 3.2 has no such call).
 *
 * A block meets calls at other batches: a model built once for every batch size packs its
 * weight for one of them.  A call whose primitive asks for exactly the header's descriptor runs
 * on the block.  Otherwise the call rebuilds the block's descriptor (the format tag whose
 * descriptor is exactly the header's) and reorders the block into the layout its own primitive
 * asks for, in a buffer of the calling thread, on every such call: correct, and slower by a
 * pass or two over the weight.
 * Seen with the PyPI oneDNN 3.2 on AVX-512 (brgconv, brgconv_1x1, brdgmm_dw and jit kernels),
 * for the 53 distinct convolutions of ResNet-50 and MobileNetV2 on a 224 x 224 image, channels
 * last with an HWIO weight, bias and relu or ReLU6, in both packed forms, at every n from 1 to
 * 32: at one thread each asks for one weight layout at every n; at two threads all but one do,
 * and ResNet-50's 1x1 1024 -> 512 over 14 x 14 asks for Acdb64a at n = 1 and Acdb48a (512
 * channels padded to 528) at n >= 2.  The layout depends on the threads too, and the
 * descriptor in the header serves a call in a process of other threads (or another CPU) as
 * well.  TIR_BYOC_ONEDNN_TEST_REORDER=1 (for tests) treats every block as made for another
 * layout.
 *
 * The header names the oneDNN implementation the block was chosen for (empty: oneDNN's
 * first).  A call runs it where oneDNN offers it for the call's key, and oneDNN's first
 * elsewhere (another CPU, or post-ops that implementation does not take), the block reordered
 * as above when that one asks for another weight layout.
 *
 * A block of another weight shape gives TIR_BYOC_EPACKED, as does a block of an older format
 * (its magic names the format's version) or one whose blocking no format tag of this oneDNN
 * has.
 */
struct PackHeader {
  char magic[8];
  uint64_t bytes;  // the weight's bytes after the header
  uint64_t form;   // TIR_BYOC_PACK_LIBRARY or TIR_BYOC_PACK_CONV_BLOCKED
  uint64_t batch;  // the n of the primitive the block was made for (for reports)
  // The weight's memory descriptor (fp32, blocked, offset 0): ndims and inner_nblks entries,
  // the rest 0 (Blocking: these fields as bytes).
  int32_t ndims, inner_nblks;
  int64_t dims[DNNL_MAX_NDIMS], padded_dims[DNNL_MAX_NDIMS], strides[DNNL_MAX_NDIMS];
  int64_t inner_blks[DNNL_MAX_NDIMS], inner_idxs[DNNL_MAX_NDIMS];
  // The oneDNN implementation the pack chose for the call (Key::implementation), NUL-padded;
  // all zero (blocks made before the choice too) for oneDNN's first.
  char implementation[48];
  uint64_t reserved[1];
};
static_assert(sizeof(PackHeader) == 576, "the packed data starts 64-byte aligned");
// Version 3 holds the descriptor; version 2 ("tirbyCv2", 64 bytes) had the batch and a hash
// of the layout, version 1 ("tirbyocC") the hash.
constexpr char kPackMagic[8] = {'t', 'i', 'r', 'b', 'y', 'C', 'v', '3'};

/* The blocking of `md` as the header holds it; false if it is not an fp32 blocked descriptor
 * at offset 0 within DNNL_MAX_NDIMS dims (none of oneDNN's weights is otherwise). */
bool Describe(const dnnl::memory::desc &md, PackHeader *header) {
  const dims shape = md.get_dims(), padded = md.get_padded_dims(), strides = md.get_strides();
  const dims blocks = md.get_inner_blks(), indices = md.get_inner_idxs();
  const dims offsets = md.get_padded_offsets();
  if (md.get_format_kind() != dnnl::memory::format_kind::blocked || md.get_data_type() != dt::f32 ||
      md.get_submemory_offset() != 0 || shape.size() > DNNL_MAX_NDIMS ||
      blocks.size() > DNNL_MAX_NDIMS ||
      std::any_of(offsets.begin(), offsets.end(), [](int64_t v) { return v != 0; }))
    return false;
  header->ndims = static_cast<int32_t>(shape.size());
  header->inner_nblks = static_cast<int32_t>(blocks.size());
  std::copy(shape.begin(), shape.end(), header->dims);
  std::copy(padded.begin(), padded.end(), header->padded_dims);
  std::copy(strides.begin(), strides.end(), header->strides);
  std::copy(blocks.begin(), blocks.end(), header->inner_blks);
  std::copy(indices.begin(), indices.end(), header->inner_idxs);
  return true;
}

/* The descriptor fields of a header, as bytes: what identifies the block's layout. */
constexpr size_t kBlockingBytes =
    offsetof(PackHeader, implementation) - offsetof(PackHeader, ndims);

/* The implementation a header names (empty: oneDNN's first). */
std::string ImplementationOf(const PackHeader &header) {
  return std::string(header.implementation,
                     strnlen(header.implementation, sizeof header.implementation));
}

std::string Blocking(const PackHeader &header) {
  return std::string(reinterpret_cast<const char *>(&header.ndims), kBlockingBytes);
}

/* The Blocking of the descriptor `weights`; empty for a descriptor no header can hold. */
std::string BlockingOf(const dnnl::memory::desc &weights) {
  PackHeader header{};
  return Describe(weights, &header) ? Blocking(header) : std::string();
}

/* The descriptor the header holds: the format tag's whose blocking is exactly the header's,
 * each distinct blocking searched once per thread; false if no tag has it. */
bool Described(const PackHeader &header, dnnl::memory::desc *out) {
  thread_local std::map<std::string, std::pair<bool, dnnl::memory::desc>> known;
  const std::string blocking = Blocking(header);
  auto found = known.find(blocking);
  if (found == known.end()) {
    if (known.size() >= kCapacity) known.clear();
    std::pair<bool, dnnl::memory::desc> described{false, {}};
    const int ndims = header.ndims;
    if (ndims >= 1 && ndims <= DNNL_MAX_NDIMS && header.inner_nblks >= 0 &&
        header.inner_nblks <= DNNL_MAX_NDIMS) {
      const dims shape(header.dims, header.dims + ndims);
      for (int t = dnnl_a; t < dnnl_format_tag_last && !described.first; ++t) {
        dnnl_memory_desc_t md = nullptr;
        if (dnnl_memory_desc_create_with_tag(&md, ndims, shape.data(), dnnl_f32,
                                             static_cast<dnnl_format_tag_t>(t)) != dnnl_success)
          continue;
        dnnl::memory::desc candidate(md);
        PackHeader own{};
        if (Describe(candidate, &own) && Blocking(own) == blocking)
          described = {true, candidate};
      }
    }
    found = known.emplace(blocking, described).first;
  }
  if (found->second.first) *out = found->second.second;
  return found->second.first;
}

/* One reorder of a weight, between two layouts. */
struct WeightReorder {
  dnnl::reorder primitive;
  dnnl::memory::desc from, to, scratchpad;
  std::string kernel;

  WeightReorder(const dnnl::memory::desc &source, const dnnl::memory::desc &target)
      : from(source), to(target) {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    const dnnl::reorder::primitive_desc desc(Engine(), from, Engine(), to, attr);
    primitive = dnnl::reorder(desc);
    scratchpad = desc.scratchpad_desc(), kernel = desc.impl_info_str();
  }
};

/* The reorders from the block's layout (`packed`'s) to the one `wanted` asks for: one where
 * oneDNN has a jit kernel for it, else two through the plain (k..., I, O) layout, each of which
 * has one: between two blocked layouts (Acdb64a to Acdb48a, ResNet-50's above) oneDNN 3.2 has
 * only its generic reorder, 42 ms for that 512 x 1024 weight at one thread where the two took
 * 0.14 ms. */
std::vector<WeightReorder> WeightReorders(const Key &key, const dnnl::memory::desc &packed,
                                          const Entry &wanted) {
  std::vector<WeightReorder> steps{WeightReorder(packed, wanted.weights)};
  if (steps[0].kernel.find("jit") != std::string::npos) return steps;
  Key plain = key;
  plain.weight_layout = TIR_BYOC_CONV_WEIGHT_KIO;
  const dnnl::memory::desc between = PlainWeights(plain);
  steps.clear();
  steps.emplace_back(packed, between);
  steps.emplace_back(between, wanted.weights);
  return steps;
}

/* The block's weight (laid out as `packed`, the descriptor `header` holds) in the layout
 * `wanted` (the entry of `key`) asks for, in a buffer of the calling thread that the thread's
 * next such call overwrites; NULL without memory. */
const void *Reordered(const Key &key, const PackHeader &header, const dnnl::memory::desc &packed,
                      const Entry &wanted, const void *weight) {
  // The reorders per block layout, entry (ids are never reused) and thread.
  thread_local std::map<std::pair<std::string, uint64_t>, std::vector<WeightReorder>> known;
  const std::pair<std::string, uint64_t> id{Blocking(header), wanted.id};
  auto found = known.find(id);
  if (found == known.end()) {
    if (known.size() >= kCapacity) known.clear();
    found = known.emplace(id, WeightReorders(key, packed, wanted)).first;
  }
  const void *from = weight;
  for (size_t i = 0; i < found->second.size(); ++i) {
    const WeightReorder &step = found->second[i];
    const int buffer = i + 1 == found->second.size() ? kReorderedWeights : kPlainWeights;
    void *to = Scratchpad(step.to.get_size(), buffer);
    const size_t scratchpad_bytes = step.scratchpad.get_size();
    void *scratchpad = scratchpad_bytes > 0 ? Scratchpad(scratchpad_bytes) : nullptr;
    if (to == nullptr || (scratchpad_bytes > 0 && scratchpad == nullptr)) return nullptr;
    std::unordered_map<int, dnnl::memory> args{
        {DNNL_ARG_FROM, dnnl::memory(step.from, Engine(), const_cast<void *>(from))},
        {DNNL_ARG_TO, dnnl::memory(step.to, Engine(), to)}};
    if (scratchpad_bytes > 0)
      args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(step.scratchpad, Engine(), scratchpad));
    step.primitive.execute(Stream(), args);
    Stream().wait();
    from = to;
  }
  return from;
}

/* Whether a test asked for every block to be reordered (see the comment above PackHeader). */
bool TestReorder() {
  const char *setting = std::getenv("TIR_BYOC_ONEDNN_TEST_REORDER");
  return setting != nullptr && std::strcmp(setting, "1") == 0;
}

/* Run a conv call on the packed block of `header` (its magic and form checked). */
int32_t RunPacked(const tir_byoc_conv &conv, const PackHeader &header) {
  int fused = 0;
  const int64_t form = static_cast<int64_t>(header.form);
  const Key key = KeyOf(conv, form, &fused, ImplementationOf(header));
  std::shared_ptr<const Entry> entry = Get(key);
  const void *weight = &header + 1;
  const bool reorder = TestReorder();
  // Step 1. The common case: the call's primitive asks for the block's layout.
  if (!reorder && entry->blocking.size() == kBlockingBytes &&
      std::memcmp(entry->blocking.data(), &header.ndims, kBlockingBytes) == 0 &&
      header.bytes == entry->weights.get_size())
    return Run(conv, key, fused, entry, weight);
  // Step 2. The block's descriptor, from the header: a weight of the call's shape.
  dnnl::memory::desc packed;
  if (!Described(header, &packed) || packed.get_dims() != entry->weights.get_dims() ||
      packed.get_size() != header.bytes)
    return TIR_BYOC_EPACKED;
  // Step 3. Another layout: the block reordered into it.
  const void *reordered = Reordered(key, header, packed, *entry, weight);
  if (reordered == nullptr) return TIR_BYOC_EBACKEND;
  return Run(conv, key, fused, entry, reordered);
}

void Reorder(const Key &plain, const void *w, const Entry &entry, void *out) {
  dnnl::memory source(PlainWeights(plain), Engine(), const_cast<void *>(w));
  dnnl::memory target(entry.weights, Engine(), out);
  dnnl::reorder(source, target).execute(Stream(), source, target);
  Stream().wait();
}

struct Scratch {
  std::unique_ptr<void, decltype(&std::free)> data{nullptr, &std::free};
  explicit Scratch(size_t bytes)
      : data(std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64), &std::free) {
    if (data == nullptr) throw std::bad_alloc();
    std::memset(data.get(), 0, (bytes + 63) / 64 * 64 + 64);
  }
  void *get() const { return data.get(); }
};

/* `count` values in [-1, 1), the same ones on every call: the input the timings run on. */
void FillUniform(float *values, int64_t count) {
  uint32_t state = 12345;
  for (int64_t i = 0; i < count; ++i) {
    state = state * 1664525u + 1013904223u;
    values[i] = static_cast<float>(state >> 8) / static_cast<float>(1u << 23) - 1.0f;
  }
}

/* Median seconds of the call in each of `keys` (the first the plain weight), the weight
 * reordered into each, interleaved after a warm-up: at least 3 and at most 9 runs of each form
 * within 3x of the fastest, stopping after 0.3 s; a slower form is run once. */
std::vector<double> TimeForms(const std::vector<Key> &keys, const void *w) {
  const Key &plain = keys[0];
  const int64_t x_count = plain.n * plain.c * plain.in[0] * plain.in[1] * plain.in[2];
  const int64_t y_count = plain.n * plain.o * plain.out[0] * plain.out[1] * plain.out[2];
  Scratch x(x_count * sizeof(float)), y(y_count * sizeof(float)),
      residual(y_count * sizeof(float)), vector(plain.o * sizeof(float));
  float *xs = static_cast<float *>(x.get());
  FillUniform(xs, x_count);
  std::vector<std::shared_ptr<const Entry>> entries;
  std::vector<std::unique_ptr<Scratch>> blocks;
  std::vector<const void *> weights;
  for (const Key &key : keys) {
    entries.push_back(Get(key));
    if (!key.packed) {
      weights.push_back(w);
      continue;
    }
    blocks.push_back(std::make_unique<Scratch>(entries.back()->weights.get_size()));
    Reorder(plain, w, *entries.back(), blocks.back()->get());
    weights.push_back(blocks.back()->get());
  }
  auto run = [&](size_t form) {
    const void *operands[TIR_BYOC_MAX_OPS];
    const Key &key = keys[form];
    for (size_t i = 0; i < key.post.size(); ++i)
      operands[i] = key.post[i] == Post::kAdd ? residual.get() : vector.get();
    if (Execute(*entries[form], key, x.get(), weights[form], vector.get(), operands, y.get()) !=
        TIR_BYOC_OK)
      throw std::runtime_error("a form failed to run");
  };
  using clock = std::chrono::steady_clock;
  auto timed = [&](size_t form) {
    const clock::time_point before = clock::now();
    run(form);
    return std::chrono::duration<double>(clock::now() - before).count();
  };
  // Step 1. A warm-up run of each, then one timed: a form 3x slower than the fastest cannot
  // win, and is not run again (a plain-layout kernel may take seconds on a large input).
  std::vector<std::vector<double>> times(keys.size());
  for (size_t form = 0; form < keys.size(); ++form) run(form);
  for (size_t form = 0; form < keys.size(); ++form) times[form].push_back(timed(form));
  double fastest = times[0][0];
  for (const std::vector<double> &first : times) fastest = std::min(fastest, first[0]);
  std::vector<size_t> racing;
  for (size_t form = 0; form < keys.size(); ++form)
    if (times[form][0] <= 3 * fastest) racing.push_back(form);
  // Step 2. Rounds of the forms still racing, interleaved.
  const clock::time_point start = clock::now();
  for (int round = 0; round < 8; ++round) {
    for (size_t form : racing) times[form].push_back(timed(form));
    if (round >= 1 && clock::now() - start > std::chrono::milliseconds(300)) break;
  }
  std::vector<double> medians;
  for (std::vector<double> &values : times) {
    std::sort(values.begin(), values.end());
    medians.push_back(values[values.size() / 2]);
  }
  return medians;
}

/* The forms a packed weight may take, after the plain one. */
constexpr int32_t kPackedForms[] = {TIR_BYOC_PACK_LIBRARY, TIR_BYOC_PACK_CONV_BLOCKED};

/* What ChooseForm chose per call shape and epilogue (the plain form's key) in this process:
 * the form, and for TIR_BYOC_PACK_LIBRARY the implementation (empty: oneDNN's first). */
std::mutex chosen_mutex;
std::map<Key, std::pair<int32_t, std::string>> chosen;

/* The implementation ChooseForm chose for the library form of `conv`'s shape and epilogue;
 * empty (oneDNN's first) if it did not choose one. */
std::string ChosenImplementation(const tir_byoc_conv &conv) {
  int fused = 0;
  const Key plain = KeyOf(conv, TIR_BYOC_PACK_PLAIN, &fused);
  std::lock_guard<std::mutex> lock(chosen_mutex);
  auto found = chosen.find(plain);
  return found != chosen.end() && found->second.first == TIR_BYOC_PACK_LIBRARY
             ? found->second.second
             : std::string();
}

/* The library form on each other implementation oneDNN offers for it (WorthTiming) that fuses
 * the same ops (so that the C epilogue after, which TimeForms does not run, is the same). */
std::vector<Key> OtherImplementations(const tir_byoc_conv &conv, const Key &library) {
  std::vector<Key> keys;
  if (const char *setting = std::getenv("TIR_BYOC_ONEDNN_CONV_KERNEL"))
    if (std::strcmp(setting, "first") == 0) return keys;
  for (const std::string &name : Alternatives(library)) {
    if (name.size() >= sizeof(PackHeader::implementation)) continue;
    int fused = 0;
    const Key key = KeyOf(conv, TIR_BYOC_PACK_LIBRARY, &fused, name);
    if (key.bias == library.bias && key.post == library.post && Get(key)->implementation == name)
      keys.push_back(key);
  }
  return keys;
}

/* The form to keep: the fastest packed one if it is 5 % faster than the plain weight, else the
 * plain weight.  The library form is timed on every implementation oneDNN offers for the call
 * (OtherImplementations), and another than oneDNN's first is kept if it is 3 % faster than the
 * first.  oneDNN ranks its implementations by ISA and layout, not by shape: on AVX-512 (Zen 4)
 * its first for a depthwise 3x3 over 144 x 56 x 56, channels last (brdgmm_dw), took 1.45x the
 * time of its jit_dw, and for MobileNetV2's 1x1 16 -> 96 over 112 x 112 at batch 8
 * (brgconv_1x1, AVX-512) 1.9x that of its AVX2 brgconv_1x1, each timed alone at one thread. */
int32_t ChooseForm(const tir_byoc_conv &conv, const void *w) {
  if (const char *setting = std::getenv("TIR_BYOC_ONEDNN_PACK")) {
    const std::string named = setting;
    if (named == "library" || named == "always") return TIR_BYOC_PACK_LIBRARY;
    if (named == "blocked") return TIR_BYOC_PACK_CONV_BLOCKED;
    if (named == "plain") return TIR_BYOC_PACK_PLAIN;
  }
  // Chosen once per call shape and epilogue in a process: build_model asks twice (the choice
  // against im2col, then the packing), and a model repeats its shapes.
  int fused = 0;
  std::vector<Key> keys{KeyOf(conv, TIR_BYOC_PACK_PLAIN, &fused)};
  {
    std::lock_guard<std::mutex> lock(chosen_mutex);
    auto found = chosen.find(keys[0]);
    if (found != chosen.end()) return found->second.first;
  }
  for (int32_t form : kPackedForms) keys.push_back(KeyOf(conv, form, &fused));
  const size_t others = keys.size();  // keys[1] is the library form on oneDNN's first
  for (Key &key : OtherImplementations(conv, keys[1])) keys.push_back(std::move(key));
  const std::vector<double> medians = TimeForms(keys, w);
  int32_t best = TIR_BYOC_PACK_PLAIN;
  std::string implementation;
  double best_time = 0.95 * medians[0];
  for (size_t i = 1; i < others; ++i)
    if (medians[i] <= best_time) best = kPackedForms[i - 1], best_time = medians[i];
  for (size_t i = others; i < keys.size(); ++i)
    if (medians[i] <= best_time && medians[i] <= 0.97 * medians[1])
      best = TIR_BYOC_PACK_LIBRARY, best_time = medians[i], implementation = keys[i].implementation;
  std::lock_guard<std::mutex> lock(chosen_mutex);
  return chosen.emplace(keys[0], std::make_pair(best, implementation)).first->second.first;
}

/* A whole conv call (TIR_BYOC_DEFINE_CONV has checked the geometry, pointers and epilogue). */
int32_t Conv(const tir_byoc_conv *conv) {
  const int32_t flags = TIR_BYOC_FLAGS_OF(conv->dtypes);
  if (TIR_BYOC_SIGNATURE_OF(conv->dtypes) != TIR_BYOC_SIG_F32) return TIR_BYOC_EDTYPE;
  if ((flags & ~TIR_BYOC_PACKED_WEIGHT) != 0) return TIR_BYOC_EDTYPE;
  const bool packed = (flags & TIR_BYOC_PACKED_WEIGHT) != 0;
  if (conv->n == 0) return TIR_BYOC_OK;
  try {
    int fused = 0;
    if (!packed) {
      // oneDNN skips the taps in the padding, where TVM multiplies 0 by the weight: with an
      // infinity or NaN in the weight, only the reference computes what TVM does.  (A packed
      // weight is finite: the pack function keeps other weights plain.)
      if (tir_byoc_conv_padded(conv) &&
          !tir_byoc_conv_weight_finite(conv, static_cast<const float *>(conv->w))) {
        tir_byoc_conv_reference(conv);
        tir_byoc_conv_epilogue(&conv->epilogue, 0, conv);
        return TIR_BYOC_OK;
      }
      const Key key = KeyOf(*conv, TIR_BYOC_PACK_PLAIN, &fused);  // sets fused
      return Run(*conv, key, fused, Get(key), conv->w);
    }
    const PackHeader *header = static_cast<const PackHeader *>(conv->w);
    if (std::memcmp(header->magic, kPackMagic, sizeof kPackMagic) != 0 ||
        (header->form != TIR_BYOC_PACK_LIBRARY && header->form != TIR_BYOC_PACK_CONV_BLOCKED) ||
        header->bytes == 0)
      return TIR_BYOC_EPACKED;
    return RunPacked(*conv, *header);
  } catch (...) {
    return TIR_BYOC_EBACKEND;
  }
}

/* The block of a conv call's plain weight w (tir_byoc_onednn_conv_pack, whose protocol this
 * is), `conv` decoded with its epilogue; may throw. */
int32_t PackConv(const tir_byoc_conv &conv, const void *w, int32_t *form, void *out,
                 int64_t *size) {
  if (conv.n < 1) {  // no batch to lay the weight out for
    if (out != nullptr) return TIR_BYOC_ESHAPE;
    *form = TIR_BYOC_PACK_PLAIN, *size = 0;
    return TIR_BYOC_OK;
  }
  int fused = 0;
  // A weight whose infinities or NaNs the padding would meet stays plain (see Conv).
  if (out == nullptr && tir_byoc_conv_padded(&conv) &&
      !tir_byoc_conv_weight_finite(&conv, static_cast<const float *>(w)))
    *form = TIR_BYOC_PACK_PLAIN;
  if (*form == TIR_BYOC_PACK_CHOOSE && out == nullptr) *form = ChooseForm(conv, w);
  if (*form == TIR_BYOC_PACK_PLAIN && out == nullptr) {
    *size = 0;
    return TIR_BYOC_OK;
  }
  if (*form != TIR_BYOC_PACK_LIBRARY && *form != TIR_BYOC_PACK_CONV_BLOCKED)
    return TIR_BYOC_EDTYPE;
  const Key plain = KeyOf(conv, TIR_BYOC_PACK_PLAIN, &fused);
  const std::string implementation =
      *form == TIR_BYOC_PACK_LIBRARY ? ChosenImplementation(conv) : std::string();
  std::shared_ptr<const Entry> entry = Get(KeyOf(conv, *form, &fused, implementation));
  const int64_t bytes = static_cast<int64_t>(sizeof(PackHeader) + entry->weights.get_size());
  if (out == nullptr) {
    // A layout no header can describe (none of oneDNN's fp32 weights): the plain weight.
    if (entry->blocking.empty()) *form = TIR_BYOC_PACK_PLAIN;
    *size = entry->blocking.empty() ? 0 : bytes;
    return TIR_BYOC_OK;
  }
  if (*size < bytes) return TIR_BYOC_ESHAPE;
  PackHeader *header = static_cast<PackHeader *>(out);
  std::memset(header, 0, sizeof *header);
  std::memcpy(header->magic, kPackMagic, sizeof kPackMagic);
  header->bytes = entry->weights.get_size();
  header->form = static_cast<uint64_t>(*form);
  header->batch = static_cast<uint64_t>(conv.n);
  if (!Describe(entry->weights, header)) return TIR_BYOC_EBACKEND;
  if (entry->implementation == implementation)  // the header is zeroed: NUL-padded
    std::memcpy(header->implementation, implementation.c_str(), implementation.size());
  Reorder(plain, w, *entry, header + 1);
  return TIR_BYOC_OK;
}

/* ------------------------------------------------------------------------------------------
 * A pair: a 1 x 1 convolution (stride 1, no padding, one group) and the depthwise 3 x 3 that
 * alone reads its output (PairFits), channels last, each with a bias and at most one relu or
 * clip, as one primitive: the 1 x 1's, with the depthwise one as its append_dw post-op.  oneDNN 3.2 has a
 * real fused kernel for it (jit_1x1 with the depthwise row kernel inside) only where the
 * intermediate is larger than about twice the L2 cache of its threads; elsewhere it offers
 * ref_fused_convolution (the two primitives one after the other), which is not taken.  The
 * intermediate is then never written to memory whole.
 *
 * A pair's block (tir_byoc_onednn_conv_pair_pack) holds both weights in the layouts the fused
 * primitive asks for, each behind a PackHeader.  A call whose fused primitive asks for exactly
 * those layouts runs it; any other call (another CPU or thread count, where oneDNN picks other
 * layouts or no fused kernel) reorders both weights to the plain layout and runs the two
 * convolutions one after the other through a buffer of the calling thread: correct, slower.
 * A block for a symbolic batch (ChoosePairAnyBatch, laid out for one batch) also holds each
 * convolution's own block: the batches below the least one the fused primitive was timed
 * faster at, and those it does not serve with the block's layouts, run the two convolutions
 * on those, as the model without the pair would.
 *
 * Each clip of a pair is fused in the first of three forms whose values the probes find equal
 * to the C epilogue's, NaN included: eltwise_clip_v2, eltwise_clip (both give lo for NaN), or
 * the clip negated, -clip_v2(-z, -hi, -lo), which gives hi for NaN as topi.clip's spelling of
 * ReLU6 does.  The probes (ProbePair) run the fused primitive on the call's own shape against
 * the reference convolution and the C epilogue.
 */
enum class PairClip : int32_t { kClipV2, kClip, kNegated };
constexpr PairClip kPairClips[] = {PairClip::kClipV2, PairClip::kClip, PairClip::kNegated};

struct PairKey {
  Key a, b;  // a packed, each with a bias and at most one eltwise post-op
  PairClip a_clip = PairClip::kClipV2, b_clip = PairClip::kClipV2;

  auto Tie() const { return std::tie(a, b, a_clip, b_clip); }
  bool operator<(const PairKey &other) const { return Tie() < other.Tie(); }
};

struct PairEntry {
  dnnl::convolution_forward primitive;
  dnnl::memory::desc src, wa, ba, dst, wb, bb, scratchpad;
  std::string implementation, blocking_a, blocking_b;
};

/* Why a pair is not fused (tir_byoc_onednn_conv_pair_pack's *choice); 1 is "fused". */
enum PairChoice : int32_t {
  kPairSeparate = 0,     // timed: the two convolutions alone are as fast
  kPairFused = 1,
  kPairUnfit = 2,        // not a 1 x 1 and a depthwise 3 x 3 append_dw serves (PairFits)
  kPairNoKernel = 3,     // oneDNN has no fused kernel for the pair on this machine
  kPairDisagrees = 4,    // no fused form computes the epilogue as the C one does, NaN included
  kPairNotFinite = 5,    // a weight holds an infinity or NaN (the padding would meet it)
  kPairNamed = 6,        // TIR_BYOC_ONEDNN_PAIR=separate
  // A pair of a symbolic batch (TIR_BYOC_PACK_CHOOSE_ANY_BATCH), its block made at the call's n:
  kPairFusedAnyBatch = 7,  // fused at every batch the fused primitive serves with its layouts
  kPairFusedFromBatch = 8, // fused from the block's n up; below it, the two convolutions
};

void AppendEltwise(dnnl::post_ops &ops, const Key &key, PairClip clip) {
  if (key.post.empty()) return;
  if (key.post[0] == Post::kRelu) {
    ops.append_eltwise(dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    return;
  }
  const float lo = FloatOf(key.clip[0]), hi = FloatOf(key.clip[1]);
  if (clip == PairClip::kNegated) {
    ops.append_eltwise(dnnl::algorithm::eltwise_linear, -1.0f, 0.0f);
    ops.append_eltwise(dnnl::algorithm::eltwise_clip_v2, -hi, -lo);
    ops.append_eltwise(dnnl::algorithm::eltwise_linear, -1.0f, 0.0f);
  } else {
    ops.append_eltwise(clip == PairClip::kClip ? dnnl::algorithm::eltwise_clip
                                               : dnnl::algorithm::eltwise_clip_v2,
                       lo, hi);
  }
}

/* The fused primitive of `key`, or NULL where oneDNN offers none but its reference. */
std::shared_ptr<const PairEntry> CreatePair(const PairKey &key) {
  const Key &a = key.a, &b = key.b;
  PairEntry entry;
  entry.src = Activations(a, a.c, a.in);
  entry.dst = Activations(b, b.o, b.out);
  entry.ba = dnnl::memory::desc({a.o}, dt::f32, tag::a);
  dnnl::post_ops ops;
  AppendEltwise(ops, a, key.a_clip);
  ops.append_dw(dt::f32, dt::f32, dt::f32, 3, b.stride[0], b.pad[0]);
  AppendEltwise(ops, b, key.b_clip);
  dnnl::primitive_attr attr;
  attr.set_post_ops(ops);
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  try {
    // The destination given is the 1 x 1's own output; the primitive's is the depthwise one's.
    ConvDesc desc(Engine(), dnnl::prop_kind::forward_inference,
                  dnnl::algorithm::convolution_direct, entry.src, AnyWeights(a), entry.ba,
                  Activations(a, a.o, a.out), {1, 1}, {0, 0}, {0, 0}, {0, 0}, attr);
    entry.implementation = desc.impl_info_str();
    if (entry.implementation.rfind("ref", 0) == 0 || desc.src_desc() != entry.src ||
        desc.dst_desc() != entry.dst)
      return nullptr;
    entry.wa = desc.weights_desc();
    entry.wb = desc.query_md(dnnl::query::exec_arg_md, DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_WEIGHTS);
    entry.bb = desc.query_md(dnnl::query::exec_arg_md, DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_BIAS);
    entry.blocking_a = BlockingOf(entry.wa), entry.blocking_b = BlockingOf(entry.wb);
    if (entry.blocking_a.empty() || entry.blocking_b.empty() ||
        entry.bb != dnnl::memory::desc({b.o}, dt::f32, tag::a))
      return nullptr;
    entry.scratchpad = desc.scratchpad_desc();
    entry.primitive = dnnl::convolution_forward(desc);
  } catch (const dnnl::error &) {
    return nullptr;
  }
  return std::make_shared<const PairEntry>(std::move(entry));
}

/* The fused primitive of `key` (NULL: none), created once per process. */
std::shared_ptr<const PairEntry> GetPair(const PairKey &key) {
  static SharedCache<PairKey, std::shared_ptr<const PairEntry>> shared{true, {}, {}};
  thread_local std::map<PairKey, std::shared_ptr<const PairEntry>> mine;
  return Once(mine, shared, key, [&] { return CreatePair(key); });
}

int32_t ExecutePair(const PairEntry &entry, const void *x, const void *wa, const void *ba,
                    const void *wb, const void *bb, void *y) {
  auto memory = [](const dnnl::memory::desc &md, const void *data) {
    return dnnl::memory(md, Engine(), const_cast<void *>(data));
  };
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, memory(entry.src, x)},
      {DNNL_ARG_WEIGHTS, memory(entry.wa, wa)},
      {DNNL_ARG_BIAS, memory(entry.ba, ba)},
      {DNNL_ARG_DST, memory(entry.dst, y)},
      {DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_WEIGHTS, memory(entry.wb, wb)},
      {DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_BIAS, memory(entry.bb, bb)}};
  const size_t scratchpad_bytes = entry.scratchpad.get_size();
  if (scratchpad_bytes > 0) {
    void *scratchpad = Scratchpad(scratchpad_bytes);
    if (scratchpad == nullptr) return TIR_BYOC_EBACKEND;
    args.emplace(DNNL_ARG_SCRATCHPAD, memory(entry.scratchpad, scratchpad));
  }
  entry.primitive.execute(Stream(), args);
  Stream().wait();
  return TIR_BYOC_OK;
}

/* Whether an epilogue is a bias and at most one relu or clip: what a pair fuses. */
bool PairEpilogue(const tir_byoc_epilogue &epilogue) {
  if (epilogue.count < 1 || epilogue.count > 2 || epilogue.op[0].code != TIR_BYOC_OP_BIAS)
    return false;
  if (epilogue.count == 1) return true;
  const int32_t code = epilogue.op[1].code;
  return code == TIR_BYOC_OP_RELU || code == TIR_BYOC_OP_RELU_KEEP_NAN || code == TIR_BYOC_OP_CLIP;
}

/* Whether `a` then `b` is a pair append_dw serves: a 1 x 1 (stride 1, no padding, one group)
 * over a 2-D image, then a depthwise 3 x 3 of stride 1 or 2 over its output with the same low
 * padding, 0 or 1, on both axes and the output append_dw derives from it (ceil(in / stride):
 * padding 1 on both sides, or TensorFlow's "SAME" padding of a stride 2, 0 before and 1 after,
 * as transformers' MobileNetV2 has it), both channels last, fp32. */
bool PairFits(const tir_byoc_conv &a, const tir_byoc_conv &b) {
  auto ones = [](const int64_t *v) { return v[0] == 1 && v[1] == 1 && v[2] == 1; };
  const int64_t s = b.stride[0];
  return a.layout == TIR_BYOC_CONV_CHANNELS_LAST && b.layout == TIR_BYOC_CONV_CHANNELS_LAST &&
         a.groups == 1 && ones(a.kernel) && ones(a.stride) && ones(a.dilation) &&
         a.pad[0] == 0 && a.pad[1] == 0 && a.pad[2] == 0 && a.in[2] == 1 && a.in[0] > 1 &&
         a.in[1] > 1 && a.out[0] == a.in[0] && a.out[1] == a.in[1] && a.out[2] == 1 &&
         b.n == a.n && b.c == a.o && b.o == a.o && b.groups == a.o && b.in[0] == a.out[0] &&
         b.in[1] == a.out[1] && b.in[2] == 1 && b.kernel[0] == 3 && b.kernel[1] == 3 &&
         b.kernel[2] == 1 && (s == 1 || s == 2) && b.stride[1] == s && b.stride[2] == 1 &&
         ones(b.dilation) && (b.pad[0] == 0 || b.pad[0] == 1) && b.pad[1] == b.pad[0] &&
         b.pad[2] == 0 &&
         b.out[0] == (b.in[0] + s - 1) / s && b.out[1] == (b.in[1] + s - 1) / s &&
         b.out[2] == 1 && PairEpilogue(a.epilogue) && PairEpilogue(b.epilogue);
}

/* The key of one half: its geometry, a bias and its eltwise op (the clip's bits). */
Key HalfKey(const tir_byoc_conv &conv, bool packed) {
  int fused = 0;
  tir_byoc_conv geometry = conv;
  geometry.epilogue.count = 0;
  Key key = KeyOf(geometry, packed ? TIR_BYOC_PACK_LIBRARY : TIR_BYOC_PACK_PLAIN, &fused);
  key.bias = true;
  if (conv.epilogue.count == 2) {
    const tir_byoc_op &op = conv.epilogue.op[1];
    key.post.push_back(op.code == TIR_BYOC_OP_CLIP ? Post::kClip : Post::kRelu);
    if (op.code == TIR_BYOC_OP_CLIP)
      for (int c = 0; c < 3; ++c) key.clip[c] = BitsOf(op.c[c]);
  }
  return key;
}

/* A buffer of `bytes`, 64-byte aligned and zeroed. */
using Buffer = Scratch;

/* `from` (a weight laid out as `source`) reordered into `out`, laid out as `target`. */
void ReorderWeight(const dnnl::memory::desc &source, const void *from,
                   const dnnl::memory::desc &target, void *out) {
  dnnl::memory in(source, Engine(), const_cast<void *>(from)), to(target, Engine(), out);
  dnnl::reorder(in, to).execute(Stream(), in, to);
  Stream().wait();
}

/* Whether the fused primitive of `key` gives what the two convolutions and the C epilogue give,
 * on the call's shape, for the special values of ProbeEltwise: in the 1 x 1's bias (the
 * depthwise weight 1 at its centre, so that each value reaches the depthwise sums, its
 * neighbours' zero taps included) or (`first` false) in the depthwise bias. */
bool ProbePair(const PairKey &key, const tir_byoc_conv &a, const tir_byoc_conv &b, bool first) {
  static const float kValues[] = {NAN, -NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1.0f, -1.0f,
                                  3.0e38f, -3.0e38f, 1e-38f, -1e-38f, 0.5f, -0.5f, 7.0f, -7.0f};
  constexpr int kCount = sizeof kValues / sizeof kValues[0];
  std::shared_ptr<const PairEntry> entry = GetPair(key);
  if (entry == nullptr) return false;
  const int64_t inputs = a.n * a.c * a.in[0] * a.in[1];
  const int64_t middle_count = a.n * a.o * a.out[0] * a.out[1];
  const int64_t outputs = b.n * b.o * b.out[0] * b.out[1];
  Buffer x(inputs * sizeof(float)), wa(entry->wa.get_size()), wb(entry->wb.get_size());
  std::vector<float> ba(a.o, 0.0f), bb(b.o, 0.0f), wb_plain(b.o * 9, 0.0f);
  std::vector<float> middle(middle_count), want(outputs), got(outputs, 1.0f);
  tir_byoc_conv reference = b;
  if (first) {
    for (int64_t o = 0; o < a.o; ++o) ba[o] = kValues[o % kCount];
    const int64_t centre[3] = {1, 1, 0};
    for (int64_t o = 0; o < b.o; ++o) wb_plain[tir_byoc_conv_weight_offset(&b, o, 0, centre)] = 1;
  } else {
    for (int64_t o = 0; o < b.o; ++o) bb[o] = kValues[o % kCount];
  }
  ReorderWeight(PlainWeights(key.b), wb_plain.data(), entry->wb, wb.get());
  if (ExecutePair(*entry, x.get(), wa.get(), ba.data(), wb.get(), bb.data(), got.data()) !=
      TIR_BYOC_OK)
    return false;
  // The reference: the 1 x 1's sums are 0 (zero input and weight), plus its bias, then its op.
  std::vector<float> channel(a.o);
  for (int64_t o = 0; o < a.o; ++o) {
    channel[o] = 0.0f + ba[o];
    for (int i = 1; i < a.epilogue.count; ++i)
      tir_byoc_op_span(&a.epilogue.op[i], &channel[o], 0, 0, 1, 1);
  }
  for (int64_t i = 0; i < middle_count; ++i) middle[i] = channel[i % a.o];
  reference.x = middle.data(), reference.w = wb_plain.data(), reference.y = want.data();
  reference.epilogue.op[0].tensor = bb.data();
  tir_byoc_conv_reference(&reference);
  tir_byoc_conv_epilogue(&reference.epilogue, 0, &reference);
  for (int64_t i = 0; i < outputs; ++i)
    if (!SameFloat(got[i], want[i])) return false;
  return true;
}

/* The fused key of the pair `a`, `b` (PairFits), its clips in the first forms the probes agree
 * with; the choice codes kPairNoKernel or kPairDisagrees where there is none.  Probed once per
 * pair shape and epilogue in a process. */
std::pair<int32_t, PairKey> ProbedPairKey(const PairKey &base, const tir_byoc_conv &a,
                                          const tir_byoc_conv &b) {
  if (GetPair(base) == nullptr) return {kPairNoKernel, base};
  PairKey key = base;
  auto choose = [&](PairClip *clip, bool clipped, bool first) {
    for (PairClip form : kPairClips) {
      *clip = form;
      if (ProbePair(key, a, b, first)) return true;
      if (!clipped) return false;  // the other forms are the same primitive
    }
    return false;
  };
  const bool a_clipped = !key.a.post.empty() && key.a.post[0] == Post::kClip;
  const bool b_clipped = !key.b.post.empty() && key.b.post[0] == Post::kClip;
  try {
    // The depthwise op first: the 1 x 1's forms agree on its zero output.
    if (choose(&key.b_clip, b_clipped, false) && choose(&key.a_clip, a_clipped, true))
      return {kPairFused, key};
  } catch (...) {
  }
  return {kPairDisagrees, base};
}

std::pair<int32_t, PairKey> PairKeyOf(const tir_byoc_conv &a, const tir_byoc_conv &b) {
  static SharedCache<PairKey, std::pair<int32_t, PairKey>> shared{false, {}, {}};
  thread_local std::map<PairKey, std::pair<int32_t, PairKey>> mine;
  PairKey base;
  base.a = HalfKey(a, true), base.b = HalfKey(b, false);
  return Once(mine, shared, base, [&] { return ProbedPairKey(base, a, b); });
}

/* A pair run as two convolutions on plain weights `wa` and `wb`, through a buffer of the
 * calling thread. */
int32_t PairSeparately(tir_byoc_conv a, tir_byoc_conv b, const void *wa, const void *wb) {
  const size_t bytes = a.n * a.o * a.out[0] * a.out[1] * sizeof(float);
  void *middle = Scratchpad(bytes, kPairMiddle);
  if (middle == nullptr) return TIR_BYOC_EBACKEND;
  a.y = middle, a.w = wa, b.x = middle, b.w = wb;
  int fused = 0;
  const Key key_a = KeyOf(a, TIR_BYOC_PACK_PLAIN, &fused);
  int32_t status = Run(a, key_a, fused, Get(key_a), wa);
  if (status != TIR_BYOC_OK) return status;
  const Key key_b = KeyOf(b, TIR_BYOC_PACK_PLAIN, &fused);
  return Run(b, key_b, fused, Get(key_b), wb);
}

/* A pair run as two convolutions, each on its own block (PairHeader::alone), through a buffer
 * of the calling thread. */
int32_t PairAlone(tir_byoc_conv a, tir_byoc_conv b, const PackHeader *const alone[2]) {
  const size_t bytes = a.n * a.o * a.out[0] * a.out[1] * sizeof(float);
  void *middle = Scratchpad(bytes, kPairMiddle);
  if (middle == nullptr) return TIR_BYOC_EBACKEND;
  a.y = middle, b.x = middle;
  tir_byoc_conv *halves[2] = {&a, &b};
  for (int h = 0; h < 2; ++h) {
    tir_byoc_conv &conv = *halves[h];
    const bool plain = alone[h]->form == TIR_BYOC_PACK_PLAIN;
    conv.w = plain ? static_cast<const void *>(alone[h] + 1) : alone[h];
    conv.dtypes = plain ? TIR_BYOC_SIG_F32 : (TIR_BYOC_SIG_F32 | TIR_BYOC_PACKED_WEIGHT);
    const int32_t status = Conv(&conv);
    if (status != TIR_BYOC_OK) return status;
  }
  return TIR_BYOC_OK;
}

/* The pair block's first bytes; each weight then lies behind its PackHeader at its offset.  A
 * block for a symbolic batch also holds each convolution's own block, as
 * tir_byoc_onednn_conv_pack writes it for the call alone (form TIR_BYOC_PACK_PLAIN: the plain
 * weight behind the header), which the calls below `fuse_from` and those the fused primitive
 * does not serve run on.  A block for one batch has these fields 0, as blocks made before
 * them do. */
struct PairHeader {
  char magic[8];
  uint64_t offset[2];  // of the 1 x 1's and the depthwise weight's PackHeader
  uint64_t alone[2];   // of each convolution's own block; 0: none
  uint64_t fuse_from;  // the least batch the fused primitive runs (0: every batch)
  uint64_t reserved[2];
};
static_assert(sizeof(PairHeader) == 64, "the weights' headers start 64-byte aligned");
constexpr char kPairMagic[8] = {'t', 'i', 'r', 'b', 'y', 'P', 'v', '1'};

int64_t Aligned(int64_t bytes) { return (bytes + 63) / 64 * 64; }

/* A whole pair call on its block: the fused primitive where it asks for the block's layouts,
 * else the two convolutions on the weights reordered to plain. */
int32_t Pair(const tir_byoc_conv &a, const tir_byoc_conv &b, const void *block) {
  if (!PairFits(a, b)) return TIR_BYOC_ESHAPE;
  const PairHeader *pair = static_cast<const PairHeader *>(block);
  if (std::memcmp(pair->magic, kPairMagic, sizeof kPairMagic) != 0) return TIR_BYOC_EPACKED;
  const auto *bytes = static_cast<const char *>(block);
  const PackHeader *headers[2] = {reinterpret_cast<const PackHeader *>(bytes + pair->offset[0]),
                                  reinterpret_cast<const PackHeader *>(bytes + pair->offset[1])};
  for (const PackHeader *header : headers)
    if (std::memcmp(header->magic, kPackMagic, sizeof kPackMagic) != 0 || header->bytes == 0)
      return TIR_BYOC_EPACKED;
  if (a.n == 0) return TIR_BYOC_OK;
  const PackHeader *alone[2] = {nullptr, nullptr};
  for (int h = 0; h < 2; ++h) {
    if (pair->alone[h] == 0) continue;
    alone[h] = reinterpret_cast<const PackHeader *>(bytes + pair->alone[h]);
    if (std::memcmp(alone[h]->magic, kPackMagic, sizeof kPackMagic) != 0 ||
        alone[h]->bytes == 0)
      return TIR_BYOC_EPACKED;
  }
  const bool fuse = static_cast<uint64_t>(a.n) >= pair->fuse_from;
  const std::pair<int32_t, PairKey> chosen =
      fuse ? PairKeyOf(a, b) : std::make_pair(kPairSeparate, PairKey());
  if (chosen.first == kPairFused && !TestReorder()) {
    std::shared_ptr<const PairEntry> entry = GetPair(chosen.second);
    if (entry != nullptr && entry->blocking_a == Blocking(*headers[0]) &&
        entry->blocking_b == Blocking(*headers[1]) && entry->wa.get_size() == headers[0]->bytes &&
        entry->wb.get_size() == headers[1]->bytes)
      return ExecutePair(*entry, a.x, headers[0] + 1, a.epilogue.op[0].tensor, headers[1] + 1,
                         b.epilogue.op[0].tensor, b.y);
  }
  // A batch the fused primitive does not serve with the block's layouts: each convolution on
  // its own block where the block has them (a symbolic batch's), else (another machine or
  // thread count) on the weights reordered from the fused layouts to the plain ones.
  if (alone[0] != nullptr && alone[1] != nullptr) return PairAlone(a, b, alone);
  const Key plain[2] = {HalfKey(a, false), HalfKey(b, false)};
  const int buffers[2] = {kReorderedWeights, kPlainWeights};
  const void *weights[2];
  for (int h = 0; h < 2; ++h) {
    dnnl::memory::desc packed;
    const dnnl::memory::desc target = PlainWeights(plain[h]);
    if (!Described(*headers[h], &packed) || packed.get_dims() != target.get_dims() ||
        packed.get_size() != headers[h]->bytes)
      return TIR_BYOC_EPACKED;
    void *out = Scratchpad(target.get_size(), buffers[h]);
    if (out == nullptr) return TIR_BYOC_EBACKEND;
    ReorderWeight(packed, headers[h] + 1, target, out);
    weights[h] = out;
  }
  return PairSeparately(a, b, weights[0], weights[1]);
}

/* Median seconds of the fused pair and of the two convolutions as the plain packing would run
 * them (each in the form ChooseForm picks, its C epilogue included), interleaved after a
 * warm-up: 3 to 9 rounds, stopping after 0.3 s. */
std::pair<double, double> TimePair(const PairKey &key, tir_byoc_conv a, tir_byoc_conv b,
                                   const void *wa, const void *wb) {
  std::shared_ptr<const PairEntry> fused_entry = GetPair(key);
  const int64_t x_count = a.n * a.c * a.in[0] * a.in[1];
  Buffer x(x_count * sizeof(float)), middle(a.n * a.o * a.out[0] * a.out[1] * sizeof(float));
  Buffer y(b.n * b.o * b.out[0] * b.out[1] * sizeof(float)), vector(a.o * sizeof(float));
  float *xs = static_cast<float *>(x.get());
  FillUniform(xs, x_count);
  a.x = x.get(), a.y = middle.get(), b.x = middle.get(), b.y = y.get();
  a.epilogue.op[0].tensor = vector.get(), b.epilogue.op[0].tensor = vector.get();
  // The separate convolutions, each with its weight in its chosen form.
  struct Half {
    Key key;
    int fused = 0;
    std::shared_ptr<const Entry> entry;
    std::unique_ptr<Buffer> block;
    const void *weight;
  };
  Half halves[2];
  tir_byoc_conv *convs[2] = {&a, &b};
  const void *plain_weights[2] = {wa, wb};
  for (int h = 0; h < 2; ++h) {
    const tir_byoc_conv &conv = *convs[h];
    const int32_t form = ChooseForm(conv, plain_weights[h]);
    const std::string implementation =
        form == TIR_BYOC_PACK_LIBRARY ? ChosenImplementation(conv) : std::string();
    Half &half = halves[h];
    half.key = KeyOf(conv, form, &half.fused, implementation);
    half.entry = Get(half.key);
    half.weight = plain_weights[h];
    if (half.key.packed) {
      int unused = 0;
      half.block = std::make_unique<Buffer>(half.entry->weights.get_size());
      Reorder(KeyOf(conv, TIR_BYOC_PACK_PLAIN, &unused), plain_weights[h], *half.entry,
              half.block->get());
      half.weight = half.block->get();
    }
  }
  Buffer fused_a(fused_entry->wa.get_size()), fused_b(fused_entry->wb.get_size());
  ReorderWeight(PlainWeights(HalfKey(a, false)), wa, fused_entry->wa, fused_a.get());
  ReorderWeight(PlainWeights(key.b), wb, fused_entry->wb, fused_b.get());
  auto fused = [&] {
    if (ExecutePair(*fused_entry, a.x, fused_a.get(), vector.get(), fused_b.get(), vector.get(),
                    b.y) != TIR_BYOC_OK)
      throw std::runtime_error("the fused pair failed to run");
  };
  auto separate = [&] {
    for (int h = 0; h < 2; ++h)
      if (Run(*convs[h], halves[h].key, halves[h].fused, halves[h].entry, halves[h].weight) !=
          TIR_BYOC_OK)
        throw std::runtime_error("a convolution of the pair failed to run");
  };
  using clock = std::chrono::steady_clock;
  auto timed = [](const auto &run) {
    const clock::time_point before = clock::now();
    run();
    return std::chrono::duration<double>(clock::now() - before).count();
  };
  fused(), separate();
  std::vector<double> fused_times, separate_times;
  const clock::time_point start = clock::now();
  for (int round = 0; round < 9; ++round) {
    fused_times.push_back(timed(fused));
    separate_times.push_back(timed(separate));
    if (round >= 2 && clock::now() - start > std::chrono::milliseconds(300)) break;
  }
  auto median = [](std::vector<double> &values) {
    std::sort(values.begin(), values.end());
    return values[values.size() / 2];
  };
  return {median(fused_times), median(separate_times)};
}

/* The choice of tir_byoc_onednn_conv_pair_pack for plain weights wa and wb: kPairFused where
 * the fused primitive is at least 5 % faster than the two convolutions
 * (TIR_BYOC_ONEDNN_PAIR=fused|separate names it instead, where a fused kernel exists). */
int32_t ChoosePair(const tir_byoc_conv &a, const tir_byoc_conv &b, const void *wa,
                   const void *wb, PairKey *key) {
  if (!PairFits(a, b)) return kPairUnfit;
  if (!tir_byoc_conv_weight_finite(&a, static_cast<const float *>(wa)) ||
      !tir_byoc_conv_weight_finite(&b, static_cast<const float *>(wb)))
    return kPairNotFinite;
  const std::pair<int32_t, PairKey> chosen = PairKeyOf(a, b);
  if (chosen.first != kPairFused) return chosen.first;
  *key = chosen.second;
  if (const char *setting = std::getenv("TIR_BYOC_ONEDNN_PAIR")) {
    if (std::strcmp(setting, "fused") == 0) return kPairFused;
    if (std::strcmp(setting, "separate") == 0) return kPairNamed;
  }
  const std::pair<double, double> times = TimePair(*key, a, b, wa, wb);
  return times.first <= 0.95 * times.second ? kPairFused : kPairSeparate;
}

/* The choice for a pair of a symbolic batch, its block made at the calls' n (tir_byoc.packing's
 * PACK_BATCH): ChoosePair's at n, and where that is kPairFused, whether batch 1 is fused too:
 * kPairFusedAnyBatch where oneDNN's fused primitive at batch 1 asks for the same weight layouts
 * and is timed 5 % faster there as well, else kPairFusedFromBatch (the fused kernel needs an
 * intermediate of about twice the L2 cache, so a batch that gains from it gains above it). */
int32_t ChoosePairAnyBatch(const tir_byoc_conv &a, const tir_byoc_conv &b, const void *wa,
                           const void *wb, PairKey *key) {
  const int32_t at_n = ChoosePair(a, b, wa, wb, key);
  if (at_n != kPairFused || a.n == 1) return at_n == kPairFused ? kPairFusedAnyBatch : at_n;
  tir_byoc_conv a1 = a, b1 = b;
  a1.n = b1.n = 1;
  const std::pair<int32_t, PairKey> one = PairKeyOf(a1, b1);
  if (one.first != kPairFused) return kPairFusedFromBatch;
  std::shared_ptr<const PairEntry> at_one = GetPair(one.second), at_block = GetPair(*key);
  if (at_one->blocking_a != at_block->blocking_a || at_one->blocking_b != at_block->blocking_b)
    return kPairFusedFromBatch;
  const char *setting = std::getenv("TIR_BYOC_ONEDNN_PAIR");
  if (setting != nullptr && std::strcmp(setting, "fused") == 0) return kPairFusedAnyBatch;
  const std::pair<double, double> times = TimePair(one.second, a1, b1, wa, wb);
  return times.first <= 0.95 * times.second ? kPairFusedAnyBatch : kPairFusedFromBatch;
}

/* The bytes of a convolution's own block in a pair's block (PairHeader::alone), from
 * PackConv's choice for the call; 0 with *form the plain form behind its header. */
int64_t AloneBytes(const tir_byoc_conv &conv, const void *w, int32_t *form) {
  int64_t size = 0;
  *form = TIR_BYOC_PACK_CHOOSE;
  if (PackConv(conv, w, form, nullptr, &size) != TIR_BYOC_OK)
    throw std::runtime_error("a pair's convolution could not be packed alone");
  if (*form == TIR_BYOC_PACK_PLAIN)
    size = sizeof(PackHeader) + PlainWeights(HalfKey(conv, false)).get_size();
  return Aligned(size);
}

/* Write a convolution's own block of `bytes` (AloneBytes) at `out`. */
void WriteAlone(const tir_byoc_conv &conv, const void *w, int32_t form, int64_t bytes, void *out) {
  if (form != TIR_BYOC_PACK_PLAIN) {
    if (PackConv(conv, w, &form, out, &bytes) != TIR_BYOC_OK)
      throw std::runtime_error("a pair's convolution could not be packed alone");
    return;
  }
  PackHeader *header = static_cast<PackHeader *>(out);
  std::memcpy(header->magic, kPackMagic, sizeof kPackMagic);
  header->bytes = PlainWeights(HalfKey(conv, false)).get_size();
  header->form = TIR_BYOC_PACK_PLAIN;
  header->batch = static_cast<uint64_t>(conv.n);
  std::memcpy(header + 1, w, header->bytes);
}

/* One half of a pair call's arguments (the conv entry point's, without its pointers) decoded;
 * the tensors may be NULL (a pack call). */
int32_t DecodeHalf(tir_byoc_conv *conv, int32_t dtypes, const int64_t *ints, const double *c,
                   const void *const *tensors) {
  std::memset(conv, 0, sizeof *conv);
  conv->dtypes = dtypes;
  conv->layout = static_cast<tir_byoc_conv_layout>(ints[0]);
  conv->weight_layout = static_cast<tir_byoc_conv_weight_layout>(ints[1]);
  conv->n = ints[2], conv->c = ints[3], conv->o = ints[4], conv->groups = ints[5];
  int64_t *fields[6] = {conv->in, conv->out, conv->kernel, conv->stride, conv->dilation, conv->pad};
  for (int f = 0; f < 6; ++f) std::memcpy(fields[f], ints + 6 + 3 * f, 3 * sizeof(int64_t));
  int32_t status = tir_byoc_check_conv(conv);
  if (status != TIR_BYOC_OK) return status;
  const int64_t n = conv->n;
  if (tensors[0] == nullptr) conv->n = 0;  // a pack call: no tensors to check
  status = tir_byoc_conv_decode_epilogue(conv, ints[24], c, tensors);
  conv->n = n;
  return status;
}

}  // namespace


TIR_BYOC_DEFINE_CONV(onednn, Conv)

/* Pack the plain weight w of a conv call (tir_byoc.h): with out == NULL set *size (0 for
 * TIR_BYOC_PACK_PLAIN), first choosing *form if it is TIR_BYOC_PACK_CHOOSE; else write the
 * block.  The epilogue shapes the primitive (its fused post-ops): its op codes, and its
 * constants where they decide a fusion (a clip's bounds and NaN result), so the call must pass
 * those of the calls the block is made for. */
extern "C" TIR_BYOC_EXPORT int32_t tir_byoc_onednn_conv_pack(
    const void *w, int32_t dtypes, int32_t layout, int32_t weight_layout,
    TIR_BYOC_CONV_SHAPE_PARAMS_, int64_t ops, double c0, double c1, double c2, double c3,
    double c4, double c5, int32_t *form, void *out, int64_t *size) {
  if (w == nullptr || form == nullptr || size == nullptr) return TIR_BYOC_ENULL;
  if (dtypes != TIR_BYOC_SIG_F32) return TIR_BYOC_EDTYPE;
  tir_byoc_conv conv;
  std::memset(&conv, 0, sizeof conv);
  TIR_BYOC_CONV_OF_PARAMS_(conv);
  int32_t status = tir_byoc_check_conv(&conv);
  if (status != TIR_BYOC_OK) return status;
  const double constants[TIR_BYOC_MAX_CONSTANTS] = {c0, c1, c2, c3, c4, c5};
  const void *const tensors[TIR_BYOC_MAX_TENSORS] = {nullptr};
  const int64_t n_saved = conv.n;
  conv.n = 0;  // the tensors may be NULL here
  if ((status = tir_byoc_conv_decode_epilogue(&conv, ops, constants, tensors)) != TIR_BYOC_OK)
    return status;
  conv.n = n_saved;
  try {
    return PackConv(conv, w, form, out, size);
  } catch (...) {
    return TIR_BYOC_EBACKEND;
  }
}

/* The oneDNN implementation a conv call runs in `form` (TIR_BYOC_PACK_PLAIN, _LIBRARY or
 * _CONV_BLOCKED), written to out (at most size bytes, NUL-terminated); for reports and
 * benchmarks. */
extern "C" TIR_BYOC_EXPORT int32_t tir_byoc_onednn_conv_implementation(
    int32_t form, int32_t layout, int32_t weight_layout, int64_t n, int64_t c, int64_t o,
    int64_t groups, const int64_t *geometry, char *out, int64_t size) {
  tir_byoc_conv conv;
  std::memset(&conv, 0, sizeof conv);
  conv.layout = (tir_byoc_conv_layout)layout;
  conv.weight_layout = (tir_byoc_conv_weight_layout)weight_layout;
  conv.n = n, conv.c = c, conv.o = o, conv.groups = groups;
  int64_t *fields[6] = {conv.in, conv.out, conv.kernel, conv.stride, conv.dilation, conv.pad};
  for (int f = 0; f < 6; ++f) std::memcpy(fields[f], geometry + 3 * f, 3 * sizeof(int64_t));
  if (tir_byoc_check_conv(&conv) != TIR_BYOC_OK || out == nullptr || size < 1)
    return TIR_BYOC_ESHAPE;
  try {
    int fused = 0;
    std::shared_ptr<const Entry> entry = Get(KeyOf(conv, form, &fused));
    std::snprintf(out, static_cast<size_t>(size), "%s", entry->implementation.c_str());
  } catch (...) {
    return TIR_BYOC_EBACKEND;
  }
  return TIR_BYOC_OK;
}

/* The arguments of one half of a pair call: the conv entry point's after its dtypes. */
#define TIR_BYOC_PAIR_HALF_PARAMS_(p)                                                          \
  int32_t p##layout, int32_t p##weight_layout, int64_t p##n, int64_t p##c, int64_t p##o,       \
      int64_t p##groups, int64_t p##i0, int64_t p##i1, int64_t p##i2, int64_t p##o0,           \
      int64_t p##o1, int64_t p##o2, int64_t p##k0, int64_t p##k1, int64_t p##k2, int64_t p##s0, \
      int64_t p##s1, int64_t p##s2, int64_t p##d0, int64_t p##d1, int64_t p##d2, int64_t p##p0, \
      int64_t p##p1, int64_t p##p2, int64_t p##ops, double p##c0, double p##c1, double p##c2,  \
      double p##c3, double p##c4, double p##c5, const void *p##t0, const void *p##t1,          \
      const void *p##t2, const void *p##t3

/* Decode one half into `conv` (returns from the caller on a bad argument). */
#define TIR_BYOC_PAIR_DECODE_HALF_(conv, p)                                                    \
  do {                                                                                         \
    const int64_t ints_[25] = {p##layout, p##weight_layout, p##n, p##c, p##o, p##groups,       \
                               p##i0, p##i1, p##i2, p##o0, p##o1, p##o2, p##k0, p##k1, p##k2,  \
                               p##s0, p##s1, p##s2, p##d0, p##d1, p##d2, p##p0, p##p1, p##p2,  \
                               p##ops};                                                        \
    const double constants_[TIR_BYOC_MAX_CONSTANTS] = {p##c0, p##c1, p##c2,                    \
                                                       p##c3, p##c4, p##c5};                   \
    const void *const tensors_[TIR_BYOC_MAX_TENSORS] = {p##t0, p##t1, p##t2, p##t3};           \
    const int32_t status_ = DecodeHalf(&(conv), dtypes, ints_, constants_, tensors_);          \
    if (status_ != TIR_BYOC_OK) return status_;                                                \
  } while (0)

/* A 1 x 1 convolution a and the depthwise 3 x 3 convolution b that alone reads its output, as
 * one call (see PairKey above): x the input of a, y the output of b, block the pair's block
 * (tir_byoc_onednn_conv_pair_pack); then each convolution's arguments as the conv entry point
 * takes them after its dtypes (the layouts, the geometry, the epilogue: a bias and at most one
 * relu or clip).  dtypes is TIR_BYOC_SIG_F32 | TIR_BYOC_PACKED_WEIGHT. */
extern "C" TIR_BYOC_EXPORT int32_t tir_byoc_onednn_conv_pair(const void *x, const void *block,
                                                             void *y, int32_t dtypes,
                                                             TIR_BYOC_PAIR_HALF_PARAMS_(a_),
                                                             TIR_BYOC_PAIR_HALF_PARAMS_(b_)) {
  if (dtypes != (TIR_BYOC_SIG_F32 | TIR_BYOC_PACKED_WEIGHT)) return TIR_BYOC_EDTYPE;
  tir_byoc_conv a, b;
  TIR_BYOC_PAIR_DECODE_HALF_(a, a_);
  TIR_BYOC_PAIR_DECODE_HALF_(b, b_);
  if (a.n > 0 && (x == nullptr || block == nullptr || y == nullptr)) return TIR_BYOC_ENULL;
  a.x = x, b.y = y;
  try {
    return Pair(a, b, block);
  } catch (...) {
    return TIR_BYOC_EBACKEND;
  }
}

/* The block of a pair (tir_byoc_onednn_conv_pair) from the plain weights wa and wb, each half
 * given as 25 int64 (layout, weight layout, n, c, o, groups, the 6 x 3 geometry, ops) and 6
 * constants.  With out == NULL and *choice = TIR_BYOC_PACK_CHOOSE, times the pair (ChoosePair)
 * and sets *choice to 1 (fused: *size the block's bytes) or to why not (0 the two convolutions
 * are as fast, 2 not a pair append_dw serves, 3 no fused kernel here, 4 no fused form computes
 * the epilogue as the C one does, 5 a weight that is not finite, 6
 * TIR_BYOC_ONEDNN_PAIR=separate; *size 0).  *choice = TIR_BYOC_PACK_CHOOSE_ANY_M chooses for a
 * symbolic batch, the halves' n the batch to lay the block out for (ChoosePairAnyBatch): 7
 * (fused at every batch) or 8 (fused from n up) besides the reasons above; such a block also
 * holds each convolution's own block.  With out, *choice is the choice made (1, 7 or 8), and
 * the block is written. */
extern "C" TIR_BYOC_EXPORT int32_t tir_byoc_onednn_conv_pair_pack(
    const void *wa, const void *wb, int32_t dtypes, const int64_t *a_ints,
    const double *a_constants, const int64_t *b_ints, const double *b_constants, int32_t *choice,
    void *out, int64_t *size) {
  if (wa == nullptr || wb == nullptr || a_ints == nullptr || b_ints == nullptr ||
      a_constants == nullptr || b_constants == nullptr || choice == nullptr || size == nullptr)
    return TIR_BYOC_ENULL;
  if (dtypes != TIR_BYOC_SIG_F32) return TIR_BYOC_EDTYPE;
  const void *const none[TIR_BYOC_MAX_TENSORS] = {nullptr};
  tir_byoc_conv a, b;
  int32_t status;
  if ((status = DecodeHalf(&a, dtypes, a_ints, a_constants, none)) != TIR_BYOC_OK ||
      (status = DecodeHalf(&b, dtypes, b_ints, b_constants, none)) != TIR_BYOC_OK)
    return status;
  if (a.n < 1) return TIR_BYOC_ESHAPE;
  try {
    PairKey key;
    if (out == nullptr && *choice == TIR_BYOC_PACK_CHOOSE) {
      *choice = ChoosePair(a, b, wa, wb, &key);
    } else if (out == nullptr && *choice == TIR_BYOC_PACK_CHOOSE_ANY_M) {
      *choice = ChoosePairAnyBatch(a, b, wa, wb, &key);
    } else {
      if (*choice != kPairFused && *choice != kPairFusedAnyBatch &&
          *choice != kPairFusedFromBatch)
        return TIR_BYOC_EDTYPE;
      const int32_t fits = PairFits(a, b) ? PairKeyOf(a, b).first : kPairUnfit;
      if (fits != kPairFused) return TIR_BYOC_ESHAPE;
      key = PairKeyOf(a, b).second;
    }
    if (out == nullptr) *size = 0;
    const bool any_batch = *choice == kPairFusedAnyBatch || *choice == kPairFusedFromBatch;
    if (*choice != kPairFused && !any_batch) return TIR_BYOC_OK;
    std::shared_ptr<const PairEntry> entry = GetPair(key);
    if (entry == nullptr) return TIR_BYOC_EBACKEND;
    const tir_byoc_conv *halves[2] = {&a, &b};
    const void *weights[2] = {wa, wb};
    const dnnl::memory::desc *fused[2] = {&entry->wa, &entry->wb};
    // The layout: the PairHeader, the fused weights, then (a symbolic batch's) the own blocks.
    uint64_t offset[2], alone[2] = {0, 0};
    int32_t alone_form[2] = {TIR_BYOC_PACK_PLAIN, TIR_BYOC_PACK_PLAIN};
    int64_t alone_bytes[2] = {0, 0}, bytes = sizeof(PairHeader);
    for (int h = 0; h < 2; ++h)
      offset[h] = bytes, bytes += sizeof(PackHeader) + Aligned(fused[h]->get_size());
    for (int h = 0; h < 2 && any_batch; ++h) {
      alone_bytes[h] = AloneBytes(*halves[h], weights[h], &alone_form[h]);
      alone[h] = bytes, bytes += alone_bytes[h];
    }
    if (out == nullptr) {
      *size = bytes;
      return TIR_BYOC_OK;
    }
    if (*size < bytes) return TIR_BYOC_ESHAPE;
    auto *base = static_cast<char *>(out);
    std::memset(base, 0, bytes);
    PairHeader *pair = reinterpret_cast<PairHeader *>(base);
    std::memcpy(pair->magic, kPairMagic, sizeof kPairMagic);
    pair->fuse_from = *choice == kPairFusedFromBatch ? static_cast<uint64_t>(a.n) : 0;
    for (int h = 0; h < 2; ++h) {
      pair->offset[h] = offset[h], pair->alone[h] = alone[h];
      PackHeader *header = reinterpret_cast<PackHeader *>(base + offset[h]);
      std::memcpy(header->magic, kPackMagic, sizeof kPackMagic);
      header->bytes = fused[h]->get_size();
      header->form = TIR_BYOC_PACK_LIBRARY;
      header->batch = static_cast<uint64_t>(a.n);
      if (!Describe(*fused[h], header)) return TIR_BYOC_EBACKEND;
      std::snprintf(header->implementation, sizeof header->implementation, "%s",
                    entry->implementation.c_str());
      ReorderWeight(PlainWeights(HalfKey(*halves[h], false)), weights[h], *fused[h], header + 1);
      if (alone[h] != 0)
        WriteAlone(*halves[h], weights[h], alone_form[h], alone_bytes[h], base + alone[h]);
    }
  } catch (...) {
    return TIR_BYOC_EBACKEND;
  }
  return TIR_BYOC_OK;
}
