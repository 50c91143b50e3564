/*
 * conv_bridge_onednn.cpp - one oneDNN convolution called directly, as a user of oneDNN writes
 * it, against tir_byoc's conv entry point (tir_byoc_onednn_conv) on the same shape and buffers,
 * interleaved in one process: the "bridge" of a convolution.  Built as a shared library by
 * conv_bridge.py, which passes tir_byoc's conv and conv_pack functions in.
 *
 * conv_bridge(geometry, relu, conv, pack, warmup, repeats, out) with geometry the conv entry
 * point's layout, weight layout, n, c, o, groups and the six triples (tir_byoc.h):
 *   - direct: the same primitive configuration tir_byoc's pack chose (plain weight; the weight
 *     reordered once into the layout the primitive asks for, format_tag::any; or that and the
 *     activations in the layouts it asks for, reordered from and to the plain ones around it),
 *     the bias as its bias argument, relu (if asked) as an eltwise post-op, oneDNN's own
 *     scratchpad, on oneDNN's first implementation for it (the pack may have chosen another);
 *   - tir_byoc: the weight packed once by conv_pack in the form it chooses (as build_model
 *     packs a constant weight), then tir_byoc_onednn_conv with the bias (and relu) as its
 *     epilogue.
 * Checks that both give the same output (returns 1 if not), then times `repeats` runs of each,
 * alternating which goes first; out[0], out[1] = median ms direct, tir_byoc; out[2] = the
 * form conv_pack chose (0 plain, 1 the library's weight layout, 3 that and blocked activations).
 */
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "tir_byoc.h"

namespace {

using tag = dnnl::memory::format_tag;
using dims = dnnl::memory::dims;

typedef int32_t (*conv_fn)(const void *, const void *, void *, int32_t, int32_t, int32_t,
                           int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                           int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                           int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                           int64_t, int64_t, double, double, double, double, double, double,
                           const void *, const void *, const void *, const void *);
typedef int32_t (*pack_fn)(const void *, int32_t, int32_t, int32_t, int64_t, int64_t, int64_t,
                           int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                           int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                           int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, double,
                           double, double, double, double, double, int32_t *, void *,
                           int64_t *);

struct Aligned {
  float *data;
  explicit Aligned(size_t count)
      : data(static_cast<float *>(std::aligned_alloc(64, (count * 4 + 63) / 64 * 64 + 64))) {}
  ~Aligned() { std::free(data); }
};

void Fill(float *values, size_t count, uint32_t seed) {
  for (size_t i = 0; i < count; ++i) {
    seed = seed * 1664525u + 1013904223u;
    values[i] = static_cast<float>(seed >> 8) / static_cast<float>(1u << 23) - 1.0f;
  }
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace

extern "C" int conv_bridge(const int64_t *g, int32_t relu, void *conv_address, void *pack_address,
                           int32_t warmup, int32_t repeats, double *out) {
  const conv_fn conv = reinterpret_cast<conv_fn>(conv_address);
  const pack_fn pack = reinterpret_cast<pack_fn>(pack_address);
  const int32_t layout = static_cast<int32_t>(g[0]), weight_layout = static_cast<int32_t>(g[1]);
  const int64_t n = g[2], c = g[3], o = g[4], groups = g[5];
  const int64_t *in = g + 6, *outs = g + 9, *kernel = g + 12, *stride = g + 15,
                *dilation = g + 18, *pad = g + 21;
  int spatial = 3;
  while (spatial > 1 && in[spatial - 1] == 1 && outs[spatial - 1] == 1 &&
         kernel[spatial - 1] == 1 && pad[spatial - 1] == 0)
    --spatial;
  // Step 1. Buffers, filled once.
  int64_t in_count = n * c, out_count = n * o, window = 1;
  for (int a = 0; a < 3; ++a) in_count *= in[a], out_count *= outs[a], window *= kernel[a];
  const int64_t w_count = o * (c / groups) * window;
  Aligned x(in_count), w(w_count), bias(o), y_direct(out_count), y_bridged(out_count);
  Fill(x.data, in_count, 1), Fill(w.data, w_count, 2), Fill(bias.data, o, 3);
  // Step 2. tir_byoc's call: the weight packed once (the form conv_pack chooses).
  const int64_t codes = relu ? (TIR_BYOC_OP_BIAS | (TIR_BYOC_OP_RELU << 8)) : TIR_BYOC_OP_BIAS;
  int32_t form = TIR_BYOC_PACK_CHOOSE;
  int64_t size = 0;
  if (pack(w.data, TIR_BYOC_SIG_F32, layout, weight_layout, n, c, o, groups, in[0], in[1],
           in[2], outs[0], outs[1], outs[2], kernel[0], kernel[1], kernel[2], stride[0],
           stride[1], stride[2], dilation[0], dilation[1], dilation[2], pad[0], pad[1], pad[2],
           codes, 0, 0, 0, 0, 0, 0, &form, nullptr, &size) != TIR_BYOC_OK)
    return 2;
  std::vector<char> storage(size + 64);
  void *block = reinterpret_cast<void *>((reinterpret_cast<uintptr_t>(storage.data()) + 63) /
                                         64 * 64);
  if (size > 0 &&
      pack(w.data, TIR_BYOC_SIG_F32, layout, weight_layout, n, c, o, groups, in[0], in[1],
           in[2], outs[0], outs[1], outs[2], kernel[0], kernel[1], kernel[2], stride[0],
           stride[1], stride[2], dilation[0], dilation[1], dilation[2], pad[0], pad[1], pad[2],
           codes, 0, 0, 0, 0, 0, 0, &form, block, &size) != TIR_BYOC_OK)
    return 2;
  const void *weight = size > 0 ? block : w.data;
  const int32_t dtypes = TIR_BYOC_SIG_F32 | (size > 0 ? TIR_BYOC_PACKED_WEIGHT : 0);
  // Step 3. The direct primitive as a oneDNN user writes it, in the form tir_byoc chose: the
  // plain weight, the weight reordered once, or that and the activations reordered around it.
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  static const tag first[] = {tag::ncw, tag::nchw, tag::ncdhw};
  static const tag last[] = {tag::nwc, tag::nhwc, tag::ndhwc};
  const tag act = layout == 0 ? first[spatial - 1] : last[spatial - 1];
  dims src_dims{n, c}, dst_dims{n, o}, w_dims, strides, dilates, left, right;
  if (groups > 1) w_dims.push_back(groups);
  w_dims.push_back(o / groups), w_dims.push_back(c / groups);
  for (int a = 0; a < spatial; ++a) {
    src_dims.push_back(in[a]), dst_dims.push_back(outs[a]), w_dims.push_back(kernel[a]);
    strides.push_back(stride[a]), dilates.push_back(dilation[a] - 1), left.push_back(pad[a]);
    right.push_back((outs[a] - 1) * stride[a] + (kernel[a] - 1) * dilation[a] + 1 - in[a] -
                    pad[a]);
  }
  // The plain weight's layout, by strides (as tir_byoc describes it).
  dims w_strides(w_dims.size());
  {
    const int64_t per_group = c / groups, out_group = o / groups;
    int64_t inner = weight_layout == 0 ? 1 : per_group * o;
    for (int a = spatial - 1; a >= 0; --a)
      w_strides[w_dims.size() - spatial + a] = inner, inner *= kernel[a];
    const int64_t o_stride = weight_layout == 0 ? per_group * window : 1;
    const int64_t i_stride = weight_layout == 0 ? window : o;
    size_t at = 0;
    if (groups > 1) w_strides[at++] = out_group * o_stride;
    w_strides[at++] = o_stride, w_strides[at++] = i_stride;
  }
  dnnl::memory::desc src_md(src_dims, dnnl::memory::data_type::f32, act);
  dnnl::memory::desc dst_md(dst_dims, dnnl::memory::data_type::f32, act);
  dnnl::memory::desc plain_w_md(w_dims, dnnl::memory::data_type::f32, w_strides);
  dnnl::memory::desc any_w_md(w_dims, dnnl::memory::data_type::f32, tag::any);
  dnnl::memory::desc bias_md({o}, dnnl::memory::data_type::f32, tag::a);
  dnnl::post_ops ops;
  if (relu) ops.append_eltwise(dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
  dnnl::primitive_attr attr;
  attr.set_post_ops(ops);
  const bool blocked = form == TIR_BYOC_PACK_CONV_BLOCKED;
  const dnnl::memory::desc any_src(src_dims, dnnl::memory::data_type::f32, tag::any);
  const dnnl::memory::desc any_dst(dst_dims, dnnl::memory::data_type::f32, tag::any);
  dnnl::convolution_forward::primitive_desc desc(
      engine, dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
      blocked ? any_src : src_md, form == TIR_BYOC_PACK_PLAIN ? plain_w_md : any_w_md, bias_md,
      blocked ? any_dst : dst_md, strides, dilates, left, right, attr);
  dnnl::memory plain_w(plain_w_md, engine, w.data);
  dnnl::memory packed_w(desc.weights_desc(), engine);
  dnnl::reorder(plain_w, packed_w).execute(stream, plain_w, packed_w);
  stream.wait();
  dnnl::memory src(src_md, engine, x.data), dst(dst_md, engine, y_direct.data);
  dnnl::memory inner_src(desc.src_desc(), engine), inner_dst(desc.dst_desc(), engine);
  const bool reorder_src = desc.src_desc() != src_md, reorder_dst = desc.dst_desc() != dst_md;
  dnnl::reorder to_inner, to_plain;
  if (reorder_src) to_inner = dnnl::reorder(src, inner_src);
  if (reorder_dst) to_plain = dnnl::reorder(inner_dst, dst);
  dnnl::memory bias_memory(bias_md, engine, bias.data);
  dnnl::convolution_forward primitive(desc);
  auto direct = [&]() {
    if (reorder_src) to_inner.execute(stream, src, inner_src);
    primitive.execute(stream, {{DNNL_ARG_SRC, reorder_src ? inner_src : src},
                               {DNNL_ARG_WEIGHTS, packed_w},
                               {DNNL_ARG_BIAS, bias_memory},
                               {DNNL_ARG_DST, reorder_dst ? inner_dst : dst}});
    if (reorder_dst) to_plain.execute(stream, inner_dst, dst);
    stream.wait();
  };
  int32_t status = TIR_BYOC_OK;
  auto bridged = [&]() {
    status |= conv(x.data, weight, y_bridged.data, dtypes, layout, weight_layout, n, c, o,
                   groups, in[0], in[1], in[2], outs[0], outs[1], outs[2], kernel[0], kernel[1],
                   kernel[2], stride[0], stride[1], stride[2], dilation[0], dilation[1],
                   dilation[2], pad[0], pad[1], pad[2], codes, 0, 0, 0, 0, 0, 0, bias.data,
                   nullptr, nullptr, nullptr);
  };
  // Step 4. The same output both ways, then the interleaved timing.
  direct(), bridged();
  if (status != TIR_BYOC_OK) return 3;
  for (int64_t i = 0; i < out_count; ++i)
    if (std::fabs(y_direct.data[i] - y_bridged.data[i]) > 1e-3f * (1 + std::fabs(y_direct.data[i])))
      return 1;
  for (int r = 0; r < warmup; ++r) direct(), bridged();
  using clock = std::chrono::steady_clock;
  std::vector<double> times[2];
  for (int r = 0; r < repeats; ++r) {
    for (int k = 0; k < 2; ++k) {
      const int which = (r + k) % 2;  // neither always runs second
      const clock::time_point start = clock::now();
      which == 0 ? direct() : bridged();
      times[which].push_back(std::chrono::duration<double, std::milli>(clock::now() - start).count());
    }
  }
  out[0] = Median(times[0]), out[1] = Median(times[1]), out[2] = form;
  return status == TIR_BYOC_OK ? 0 : 3;
}
