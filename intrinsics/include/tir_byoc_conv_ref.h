/*
 * tir_byoc_conv_ref.h - the portable convolution product of a conv call (tir_byoc.h), fp32,
 * computed as TVM's lowered convolution computes it: every tap of every window, a tap in the
 * padding reading 0 (so 0 * w, NaN where w is an infinity or a NaN).  The reference backend's
 * convolution, and the oneDNN backend's for a call whose padding meets a non-finite weight,
 * which its kernels skip rather than multiply.
 */
#ifndef TIR_BYOC_CONV_REF_H_
#define TIR_BYOC_CONV_REF_H_

#include <stdint.h>

#include "tir_byoc.h"

/* Element offset of (batch b, channel ch, spatial position pos[3]) in a compact tensor of
 * `channels` channels over `dims` positions, in `layout`. */
static inline int64_t tir_byoc_conv_offset(tir_byoc_conv_layout layout, int64_t b, int64_t ch,
                                           int64_t channels, const int64_t *pos,
                                           const int64_t *dims) {
  const int64_t spatial = (pos[0] * dims[1] + pos[1]) * dims[2] + pos[2];
  const int64_t volume = tir_byoc_conv_volume(dims);
  if (layout == TIR_BYOC_CONV_CHANNELS_FIRST) return (b * channels + ch) * volume + spatial;
  return (b * volume + spatial) * channels + ch;
}

/* Offset of w[oc, ic, r] (ic within the group) in the weight layout. */
static inline int64_t tir_byoc_conv_weight_offset(const tir_byoc_conv *conv, int64_t oc,
                                                  int64_t ic, const int64_t *r) {
  const int64_t per_group = conv->c / conv->groups;
  const int64_t window = (r[0] * conv->kernel[1] + r[1]) * conv->kernel[2] + r[2];
  if (conv->weight_layout == TIR_BYOC_CONV_WEIGHT_OIK)
    return (oc * per_group + ic) * tir_byoc_conv_volume(conv->kernel) + window;
  return (window * per_group + ic) * conv->o + oc;
}

/* Whether a window of `conv` reaches into its padding (low or high, on any axis). */
static inline int tir_byoc_conv_padded(const tir_byoc_conv *conv) {
  for (int a = 0; a < 3; ++a) {
    const int64_t reach = (conv->out[a] - 1) * conv->stride[a] +
                          (conv->kernel[a] - 1) * conv->dilation[a] + 1 - conv->pad[a];
    if (conv->pad[a] > 0 || reach > conv->in[a]) return 1;
  }
  return 0;
}

/* Whether the fp32 weight of `conv` holds no infinity and no NaN. */
static inline int tir_byoc_conv_weight_finite(const tir_byoc_conv *conv, const float *w) {
  return tir_byoc_all_finite(
      w, conv->o * (conv->c / conv->groups) * tir_byoc_conv_volume(conv->kernel));
}

/* y = the convolution of x and w (no epilogue), as TVM computes it (see the top). */
static inline void tir_byoc_conv_reference(const tir_byoc_conv *conv) {
  const float *x = (const float *)conv->x, *w = (const float *)conv->w;
  float *y = (float *)conv->y;
  const int64_t in_group = conv->c / conv->groups, out_group = conv->o / conv->groups;
  int64_t q[3], r[3], at[3];
  for (int64_t b = 0; b < conv->n; ++b)
    for (int64_t oc = 0; oc < conv->o; ++oc) {
      const int64_t g = oc / out_group;
      for (q[0] = 0; q[0] < conv->out[0]; ++q[0])
        for (q[1] = 0; q[1] < conv->out[1]; ++q[1])
          for (q[2] = 0; q[2] < conv->out[2]; ++q[2]) {
            float acc = 0.0f;
            for (int64_t ic = 0; ic < in_group; ++ic)
              for (r[0] = 0; r[0] < conv->kernel[0]; ++r[0])
                for (r[1] = 0; r[1] < conv->kernel[1]; ++r[1])
                  for (r[2] = 0; r[2] < conv->kernel[2]; ++r[2]) {
                    int inside = 1;
                    for (int a = 0; a < 3; ++a) {
                      at[a] = q[a] * conv->stride[a] + r[a] * conv->dilation[a] - conv->pad[a];
                      inside = inside && at[a] >= 0 && at[a] < conv->in[a];
                    }
                    const float value =
                        inside ? x[tir_byoc_conv_offset(conv->layout, b, g * in_group + ic,
                                                        conv->c, at, conv->in)]
                               : 0.0f; /* the padding */
                    acc += value * w[tir_byoc_conv_weight_offset(conv, oc, ic, r)];
                  }
            y[tir_byoc_conv_offset(conv->layout, b, oc, conv->o, q, conv->out)] = acc;
          }
    }
}

#endif /* TIR_BYOC_CONV_REF_H_ */
