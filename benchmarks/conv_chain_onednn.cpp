/*
 * conv_chain_onednn.cpp - a model's convolutions run in sequence, each as one oneDNN
 * convolution called directly, with and without oneDNN's depthwise post-op: a 1 x 1
 * convolution and the 3 x 3 depthwise convolution that reads its output (MobileNet's expand
 * and depthwise pair) as one primitive, whose intermediate never leaves the cache.  Built as a
 * shared library by conv_chain.py.
 *
 * conv_chain(layers, count, n, fuse, repeats, out, names, names_size, result): `layers` holds
 * `count` rows of kLayerFields int64 (c, o, groups, h, w, kernel, stride, pad_l, pad_r, clip,
 * residual): a square kernel and stride, pad_l before and pad_r after each spatial dim
 * (MobileNetV2 pads TensorFlow's way: 0 and 1 at stride 2), channels last (nhwc) activations,
 * the weight in the layout the primitive asks for (format_tag::any), a bias, a clip to [0, 6]
 * (ReLU6) if `clip`, and a residual add of the input of layer `residual` (-1: none) as a
 * binary post-op.  Layer i reads layer i - 1's output (layer 0 an input of its shape).
 *
 * With `fuse` 1, a 1 x 1 layer followed by a 3 x 3 depthwise layer of stride 1 or 2 whose
 * padding is the one append_dw derives (an output of ceil(h / stride)) becomes one primitive:
 * the 1 x 1 with its bias and clip, then append_dw, then the depthwise layer's clip.  Only where
 * oneDNN offers a fused kernel for it: its ref_fused_convolution, which runs the two
 * primitives one after the other, is not taken.  With `fuse` 2, only the pairs whose fused
 * primitive is faster than the two alone (medians of 10 runs each, timed as the chain is
 * built): the choice a build would make by measurement.
 *
 * Every weight is filled by its logical index (then reordered into the layout the primitive
 * asks for), so the chains compute the same function and their outputs can be compared.
 *
 * Runs the chain `repeats` times after two warm-up runs; out[0] = the median ms of the whole
 * chain; out[1 + s] = the median ms of step s (a primitive; count steps at most, the rest 0);
 * names gets each step's oneDNN implementation, one per line; result the last layer's output
 * (nhwc), for the caller to compare.  Returns the number of steps, or -1 if a
 * primitive cannot be made or run (names then holds oneDNN's message).
 */
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;
using dims = dnnl::memory::dims;

constexpr int kLayerFields = 11;

struct Layer {
  int64_t c, o, groups, h, w, kernel, stride, pad_l, pad_r, clip, residual;
  int64_t out_h() const { return (h + pad_l + pad_r - kernel) / stride + 1; }
  int64_t out_w() const { return (w + pad_l + pad_r - kernel) / stride + 1; }
};

dnnl::memory::desc Nhwc(int64_t n, int64_t c, int64_t h, int64_t w) {
  return dnnl::memory::desc({n, c, h, w}, dt::f32, tag::nhwc);
}

/* A layer's weight: oihw, or goihw with groups (`plain`), else in the layout the primitive
 * asks for (format_tag::any). */
dnnl::memory::desc Weights(const Layer &layer, bool plain) {
  if (layer.groups == 1)
    return dnnl::memory::desc({layer.o, layer.c, layer.kernel, layer.kernel}, dt::f32,
                              plain ? tag::oihw : tag::any);
  return dnnl::memory::desc(
      {layer.groups, layer.o / layer.groups, layer.c / layer.groups, layer.kernel, layer.kernel},
      dt::f32, plain ? tag::goihw : tag::any);
}

bool Fusable(const Layer &first, const Layer &second) {
  // append_dw takes the left padding and derives the output, ceil(h / stride), and from it
  // the right padding.
  const int64_t s = second.stride;
  const bool derived = second.out_h() == (second.h + s - 1) / s &&
                       second.out_w() == (second.w + s - 1) / s;
  return first.kernel == 1 && first.stride == 1 && first.pad_l == 0 && first.pad_r == 0 &&
         first.groups == 1 && first.residual < 0 && second.groups == second.c &&
         second.c == second.o && second.c == first.o && second.kernel == 3 &&
         (s == 1 || s == 2) && derived && second.residual < 0;
}

dnnl::memory Filled(const dnnl::memory::desc &md, dnnl::engine &engine, float scale) {
  dnnl::memory memory(md, engine);
  float *data = static_cast<float *>(memory.get_data_handle());
  const size_t count = md.get_size() / sizeof(float);
  for (size_t i = 0; i < count; ++i)
    data[i] = scale * static_cast<float>(static_cast<int64_t>((i * 7919) % 17) - 8);
  return memory;
}

/* A weight of `plain` (oihw or goihw) filled by its logical index and scaled to its fan-in, so
 * that the outputs keep their size from layer to layer, reordered into `packed`, the layout
 * the primitive asks for: the same weight whatever layout a primitive picks. */
dnnl::memory FilledWeight(const dnnl::memory::desc &plain, const dnnl::memory::desc &packed,
                          int64_t fan_in, dnnl::engine &engine, dnnl::stream &stream) {
  // (index % 17) - 8 has a standard deviation of about 5: about 1 / sqrt(fan_in) scaled.
  dnnl::memory source = Filled(plain, engine, 0.2f / std::sqrt(static_cast<float>(fan_in)));
  dnnl::memory target(packed, engine);
  dnnl::reorder(source, target).execute(stream, source, target);
  stream.wait();
  return target;
}

int64_t FanIn(const Layer &layer) { return layer.c / layer.groups * layer.kernel * layer.kernel; }

struct Step {
  dnnl::primitive primitive;
  std::unordered_map<int, dnnl::memory> args;
  std::string implementation;
};

using clock = std::chrono::steady_clock;

double Ms(clock::time_point since) {
  return std::chrono::duration<double, std::milli>(clock::now() - since).count();
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

/* The median ms of `repeats` runs of `steps` in order, after one warm-up run. */
double Time(const std::vector<const Step *> &steps, dnnl::stream &stream, int repeats) {
  std::vector<double> runs;
  for (int r = -1; r < repeats; ++r) {
    const clock::time_point start = clock::now();
    for (const Step *step : steps) step->primitive.execute(stream, step->args);
    stream.wait();
    if (r >= 0) runs.push_back(Ms(start));
  }
  return Median(runs);
}

}  // namespace

extern "C" int conv_chain(const int64_t *rows, int count, int64_t n, int fuse, int repeats,
                          double *out, char *names, int64_t names_size, float *result) {
  try {
    dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    dnnl::stream stream(engine);
    std::vector<Layer> layers;
    for (int i = 0; i < count; ++i) {
      const int64_t *r = rows + i * kLayerFields;
      layers.push_back({r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10]});
    }
    // Each layer's input buffer (layer i's output is layer i + 1's input), and the last output.
    std::vector<dnnl::memory> inputs;
    for (const Layer &layer : layers)
      inputs.push_back(Filled(Nhwc(n, layer.c, layer.h, layer.w), engine, 0.01f));
    const Layer &last = layers.back();
    dnnl::memory output = Filled(Nhwc(n, last.o, last.out_h(), last.out_w()), engine, 0.0f);
    auto output_of = [&](size_t i) -> dnnl::memory & {
      return i + 1 < layers.size() ? inputs[i + 1] : output;
    };
    // Layer i alone, reading inputs[i] and writing its output.
    auto alone = [&](size_t i) {
      const Layer &layer = layers[i];
      const dnnl::memory::desc dst = Nhwc(n, layer.o, layer.out_h(), layer.out_w());
      dnnl::post_ops ops;
      if (layer.clip) ops.append_eltwise(dnnl::algorithm::eltwise_clip_v2, 0.0f, 6.0f);
      if (layer.residual >= 0) ops.append_binary(dnnl::algorithm::binary_add, dst);
      dnnl::primitive_attr attr;
      attr.set_post_ops(ops);
      const dnnl::memory::desc bias({layer.o}, dt::f32, tag::a);
      dnnl::convolution_forward::primitive_desc desc(
          engine, dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
          inputs[i].get_desc(), Weights(layer, false), bias, dst, {layer.stride, layer.stride},
          {layer.pad_l, layer.pad_l}, {layer.pad_r, layer.pad_r}, attr);
      Step step;
      step.primitive = dnnl::convolution_forward(desc);
      step.implementation = desc.impl_info_str();
      step.args = {{DNNL_ARG_SRC, inputs[i]},
                   {DNNL_ARG_WEIGHTS, FilledWeight(Weights(layer, true), desc.weights_desc(),
                                                   FanIn(layer), engine, stream)},
                   {DNNL_ARG_BIAS, Filled(bias, engine, 0.01f)},
                   {DNNL_ARG_DST, output_of(i)}};
      if (layer.residual >= 0)
        step.args[DNNL_ARG_ATTR_MULTIPLE_POST_OP(layer.clip ? 1 : 0) | DNNL_ARG_SRC_1] =
            inputs[layer.residual];
      if (desc.scratchpad_desc().get_size() > 0)
        step.args[DNNL_ARG_SCRATCHPAD] = dnnl::memory(desc.scratchpad_desc(), engine);
      return step;
    };
    // Layers i and i + 1 as one primitive, or false where oneDNN offers no fused kernel (only
    // its ref_fused_convolution, which runs the two primitives one after the other) or one
    // whose output is not the depthwise layer's.
    auto fused = [&](size_t i, Step *step) {
      const Layer &layer = layers[i], &dw = layers[i + 1];
      dnnl::post_ops ops;
      if (layer.clip) ops.append_eltwise(dnnl::algorithm::eltwise_clip_v2, 0.0f, 6.0f);
      ops.append_dw(dt::f32, dt::f32, dt::f32, 3, dw.stride, dw.pad_l);
      if (dw.clip) ops.append_eltwise(dnnl::algorithm::eltwise_clip_v2, 0.0f, 6.0f);
      dnnl::primitive_attr attr;
      attr.set_post_ops(ops);
      const dnnl::memory::desc bias({layer.o}, dt::f32, tag::a);
      try {
        // The destination is the 1 x 1's own output; the primitive's is the depthwise one's.
        dnnl::convolution_forward::primitive_desc desc(
            engine, dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
            inputs[i].get_desc(), Weights(layer, false), bias,
            Nhwc(n, layer.o, layer.out_h(), layer.out_w()), {1, 1}, {0, 0}, {0, 0}, attr);
        const std::string name = desc.impl_info_str();
        if (name.rfind("ref", 0) == 0 || desc.dst_desc() != output_of(i + 1).get_desc())
          return false;
        step->primitive = dnnl::convolution_forward(desc);
        step->implementation = name + " + dw";
        const int dw_weights = DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_WEIGHTS;
        step->args = {
            {DNNL_ARG_SRC, inputs[i]},
            {DNNL_ARG_WEIGHTS, FilledWeight(Weights(layer, true), desc.weights_desc(),
                                            FanIn(layer), engine, stream)},
            {DNNL_ARG_BIAS, Filled(bias, engine, 0.01f)},
            {DNNL_ARG_DST, output_of(i + 1)},
            {dw_weights,
             FilledWeight(Weights(dw, true),
                          desc.query_md(dnnl::query::exec_arg_md, dw_weights), FanIn(dw),
                          engine, stream)},
            {DNNL_ARG_ATTR_POST_OP_DW | DNNL_ARG_BIAS,
             Filled(dnnl::memory::desc({dw.o}, dt::f32, tag::a), engine, 0.01f)}};
        if (desc.scratchpad_desc().get_size() > 0)
          step->args[DNNL_ARG_SCRATCHPAD] = dnnl::memory(desc.scratchpad_desc(), engine);
        return true;
      } catch (const dnnl::error &) {
        return false;  // oneDNN offers no primitive for the pair
      }
    };
    std::vector<Step> steps;
    for (size_t i = 0; i < layers.size(); ++i) {
      Step pair;
      if (fuse && i + 1 < layers.size() && Fusable(layers[i], layers[i + 1]) && fused(i, &pair)) {
        Step first, second;
        bool keep = true;
        if (fuse == 2) {  // only where it is faster than the two primitives alone
          first = alone(i), second = alone(i + 1);
          keep = Time({&pair}, stream, 10) < Time({&first, &second}, stream, 10);
        }
        if (keep) {
          steps.push_back(std::move(pair));
        } else {  // the two timed primitives themselves
          steps.push_back(std::move(first));
          steps.push_back(std::move(second));
        }
        ++i;  // layer i + 1 is done too
        continue;
      }
      steps.push_back(alone(i));
    }
    std::vector<double> totals;
    std::vector<std::vector<double>> per_step(steps.size());
    for (int r = -2; r < repeats; ++r) {
      const clock::time_point start = clock::now();
      for (size_t s = 0; s < steps.size(); ++s) {
        const clock::time_point before = clock::now();
        steps[s].primitive.execute(stream, steps[s].args);
        stream.wait();
        if (r >= 0) per_step[s].push_back(Ms(before));
      }
      if (r >= 0) totals.push_back(Ms(start));
    }
    out[0] = Median(totals);
    std::string listing;
    for (size_t s = 0; s < steps.size(); ++s) {
      out[1 + s] = Median(per_step[s]);
      listing += steps[s].implementation + "\n";
    }
    std::snprintf(names, static_cast<size_t>(names_size), "%s", listing.c_str());
    std::memcpy(result, output.get_data_handle(), output.get_desc().get_size());
    return static_cast<int>(steps.size());
  } catch (const dnnl::error &error) {
    std::snprintf(names, static_cast<size_t>(names_size), "%s", error.what());
    return -1;
  }
}
