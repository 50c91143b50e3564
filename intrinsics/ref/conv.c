/*
 * ref/conv.c - the portable reference convolution: any conv entry point call (tir_byoc.h) in
 * fp32, written for clarity rather than speed (tir_byoc_conv_ref.h), then the portable
 * epilogue.  The fallback for a backend without a convolution and the oracle the library
 * backends are tested against.  Symbol tir_byoc_ref_conv, registry key ref.conv.
 */
#include "tir_byoc.h"
#include "tir_byoc_conv_ref.h"

static int32_t ref_conv(const tir_byoc_conv *conv) {
  if (conv->dtypes != TIR_BYOC_SIG_F32) return TIR_BYOC_EDTYPE;
  tir_byoc_conv_reference(conv);
  tir_byoc_conv_epilogue(&conv->epilogue, 0, conv);
  return TIR_BYOC_OK;
}

TIR_BYOC_DEFINE_CONV(ref, ref_conv)
