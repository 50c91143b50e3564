"""Small real models through the whole flow, and how much of their GEMM work tir_byoc serves.

Eleven models, built from configs with random weights (nothing is downloaded): BERT-like,
DeBERTa-like and CLIP-text-like encoders, a ViT, a Whisper encoder and a Wav2Vec2
(convolutions before their transformer layers, Wav2Vec2's in groups) and LLaMA-like,
GPT-2-like, GPT-NeoX-like and Falcon-like decoders from transformers, and torch's
``nn.TransformerEncoderLayer``.
Each goes the way a user's model goes: ``torch.export`` -> ``from_exported_program`` (as
:func:`tir_byoc.frontend.import_torch` runs them) -> the standard Relax lowering ->
:func:`tir_byoc.offload` -> ``tvm.compile`` for llvm -> the Relax VM.

The GEMM work is counted twice, each side without asking tir_byoc's matcher:

- :func:`torch_gemm_flops`, what the model computes: torch's ``FlopCounterMode`` on the eager
  model (2 * M * N * K per product, times the batch);
- :func:`library_calls`, what the offloaded module hands to the library: every
  ``tir_byoc_*`` extern call reached from Relax ``main``, read from the call's own arguments
  (the calling convention of ``intrinsics/include/tir_byoc.h``).

Their ratio is the fraction offloaded; :func:`refusals` says why the rest was not.

Entry points: :data:`MODELS` (name -> builder of a :class:`RealModel`), :func:`compile_model`
(-> :class:`Compiled`), :func:`torch_gemm_flops`, :func:`library_calls`,
:func:`refusals`.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable
from dataclasses import dataclass

# The models are built from configs; transformers must never reach for the hub.
os.environ["HF_HUB_OFFLINE"] = "1"

import numpy as np
import torch
import transformers
import tvm
import tvm_ffi
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode
from tvm import relax, s_tir, tirx

import tir_byoc
from support import model_settings

#: Batch and sequence length of every model's input.
BATCH, SEQUENCE = 2, 16
#: Hidden size, heads, feed-forward size and vocabulary shared by the models.
HIDDEN, HEADS, INTERMEDIATE, VOCAB = 64, 4, 128, 100

#: The aten operators ``FlopCounterMode`` counts that are GEMMs (or, for the attention
#: kernels, two batched GEMMs, and for a convolution the GEMM of its im2col, which is how
#: tir_byoc serves it: :mod:`tir_byoc.relax.convolutions`); a count from any other operator is an
#: error, not GEMM work.
GEMM_OPS = frozenset(
    {
        "aten.convolution",
        "aten.mm",
        "aten.addmm",
        "aten.bmm",
        "aten.baddbmm",
        "aten._scaled_mm",
        "aten._scaled_dot_product_efficient_attention",
        "aten._scaled_dot_product_flash_attention",
        "aten._scaled_dot_product_cudnn_attention",
        "aten._flash_attention_forward",
        "aten._efficient_attention_forward",
    }
)

#: Prefix of every tir_byoc intrinsic's C symbol.
SYMBOL_PREFIX = "tir_byoc_"

_CALL_EXTERN = tvm.ir.Op.get("tirx.call_extern")
_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


@dataclass(frozen=True)
class RealModel:
    """A torch model in eval mode and the arguments it is exported and run with."""

    name: str
    module: torch.nn.Module
    inputs: tuple[torch.Tensor, ...]


class LastHiddenState(torch.nn.Module):
    """``forward(x)`` -> a transformers encoder's ``last_hidden_state`` for ``argument=x``
    (token ids, an image's pixels, an audio clip's mel features)."""

    def __init__(self, encoder: torch.nn.Module, argument: str = "input_ids"):
        super().__init__()
        self.encoder = encoder
        self.argument = argument

    def forward(self, x):
        return self.encoder(**{self.argument: x}).last_hidden_state


class CausalLogits(torch.nn.Module):
    """``forward(ids)`` -> a transformers decoder's logits, under a prepared causal mask.

    transformers builds its causal mask from boolean comparisons that TVM 0.27 imports but
    cannot compile (a bool ``==`` emitted as a float compare); a 4-D mask is used as given, so
    the mask here is the additive float one eager attention adds to its scores.
    """

    def __init__(self, decoder: torch.nn.Module, sequence: int):
        super().__init__()
        self.decoder = decoder
        self.register_buffer("mask", tir_byoc.frontend.causal_mask(sequence))

    def forward(self, ids):
        return self.decoder(input_ids=ids, attention_mask=self.mask, use_cache=False).logits


def _token_ids(seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (BATCH, SEQUENCE), generator=generator)


#: The config fields BERT-like configs name this way (LLaMA, GPT-NeoX, DeBERTa...).
_BERT_LIKE = dict(
    hidden_size=HIDDEN,
    num_hidden_layers=2,
    num_attention_heads=HEADS,
    intermediate_size=INTERMEDIATE,
    vocab_size=VOCAB,
    max_position_embeddings=32,
)


def _transformers_model(
    model_class, config_class: str, *, decoder: bool, model_args=None, **settings
):
    """``model_class`` (a class, or the name of one of transformers') built from
    ``<config_class>(**settings)`` and ``model_args`` with eager attention (and no cache for a
    decoder), its weights drawn with torch's seed 0."""
    extra = {"use_cache": False} if decoder else {}
    config = getattr(transformers, config_class)(**settings, **extra, attn_implementation="eager")
    if isinstance(model_class, str):
        model_class = getattr(transformers, model_class)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return model_class(config, **(model_args or {})).eval()


def _decoder(name: str, model_class: str, config_class: str, seed: int, **settings):
    model = _transformers_model(model_class, config_class, decoder=True, **settings)
    return RealModel(name, CausalLogits(model, SEQUENCE).eval(), (_token_ids(seed),))


def bert() -> RealModel:
    """A two-layer BERT encoder; no attention mask (every token attends to every token).

    Without the pooler: ``last_hidden_state`` does not use it, so ``torch.export`` drops it
    while the eager model would still compute (and count) its GEMM.
    """
    config = transformers.BertConfig(**_BERT_LIKE, attn_implementation="eager")
    with torch.random.fork_rng():
        torch.manual_seed(0)
        encoder = transformers.BertModel(config, add_pooling_layer=False).eval()
    return RealModel("bert", LastHiddenState(encoder).eval(), (_token_ids(1),))


def llama() -> RealModel:
    """A two-layer LLaMA decoder with grouped-query attention (4 heads, 2 key/value heads)."""
    return _decoder(
        "llama", "LlamaForCausalLM", "LlamaConfig", 2, **_BERT_LIKE, num_key_value_heads=2
    )


def gpt2() -> RealModel:
    """A two-layer GPT-2 decoder: its MLP's tanh gelu is written in Python (``gelu_new``), so
    torch.export keeps its pow, tanh and multiplies and the matcher reads that spelling."""
    return _decoder(
        "gpt2",
        "GPT2LMHeadModel",
        "GPT2Config",
        4,
        n_embd=HIDDEN,
        n_layer=2,
        n_head=HEADS,
        n_inner=INTERMEDIATE,
        vocab_size=VOCAB,
        n_positions=32,
        bos_token_id=0,
        eos_token_id=0,
    )


def deberta() -> RealModel:
    """A two-layer DeBERTa-v2 encoder with DeBERTa-v3's relative attention (content to
    position and back, log-bucketed positions, shared keys).  Its buckets divide integer
    tensors (``torch.log(abs_pos / mid)``), which TVM 0.27 imports as an integer division
    (:func:`tir_byoc.frontend.divide_in_float`)."""
    encoder = _transformers_model(
        "DebertaV2Model",
        "DebertaV2Config",
        decoder=False,
        **_BERT_LIKE,
        **model_settings.DEBERTA_V3,
    )
    return RealModel("deberta", LastHiddenState(encoder).eval(), (_token_ids(6),))


def clip_text() -> RealModel:
    """A two-layer CLIP text encoder: its MLP's ``quick_gelu``, ``x * sigmoid(1.702 x)``, is
    the family's swish op with alpha 1.702, read from the three blocks Relax lowers it to."""
    encoder = _transformers_model(
        "CLIPTextModel",
        "CLIPTextConfig",
        decoder=False,
        **_BERT_LIKE,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
    )
    return RealModel("clip_text", LastHiddenState(encoder).eval(), (_token_ids(7),))


#: A two-layer vision transformer on 32 x 32 images in 8 x 8 patches.
_IMAGES = dict(
    {k: v for k, v in _BERT_LIKE.items() if k not in ("vocab_size", "max_position_embeddings")},
    image_size=32,
    patch_size=8,
)


def vit() -> RealModel:
    """A two-layer ViT on 32 x 32 images: its patch embedding is a convolution of stride 8
    with an 8 x 8 kernel, served as a GEMM (:mod:`tir_byoc.relax.convolutions`)."""
    encoder = _transformers_model(
        "ViTModel", "ViTConfig", decoder=False, model_args={"add_pooling_layer": False}, **_IMAGES
    )
    pixels = torch.randn(BATCH, 3, 32, 32, generator=torch.Generator().manual_seed(8))
    return RealModel("vit", LastHiddenState(encoder, "pixel_values").eval(), (pixels,))


def dinov2() -> RealModel:
    """A two-layer DINOv2: a ViT whose attention and MLP outputs are each multiplied by a
    per-channel layer scale before the residual add (the epilogue op ``channel_scale``).  The
    scales start as ones; they are drawn here, so that a scale read at the wrong channel
    shows."""
    settings = {k: v for k, v in _IMAGES.items() if k != "intermediate_size"}
    encoder = _transformers_model(
        "Dinov2Model", "Dinov2Config", decoder=False, **settings, mlp_ratio=INTERMEDIATE // HIDDEN
    )
    generator = torch.Generator().manual_seed(12)
    with torch.no_grad():
        for module in encoder.modules():
            if hasattr(module, "lambda1"):
                module.lambda1.copy_(torch.rand(module.lambda1.shape, generator=generator) + 0.5)
    pixels = torch.randn(BATCH, 3, 32, 32, generator=torch.Generator().manual_seed(9))
    return RealModel("dinov2", LastHiddenState(encoder, "pixel_values").eval(), (pixels,))


def convnext() -> RealModel:
    """A two-stage ConvNeXt on 32 x 32 images (rows of 8, then 4): its 7 x 7 depthwise
    convolutions are no GEMM and stay TVM code, which the ``SlidingWindow`` rule schedules.
    Not in :data:`MODELS`: those convolutions are 18 % of what torch counts as its GEMM FLOPs,
    and none of it goes to a library.  The layer scales (drawn here, as for DINOv2) are the
    epilogue op ``channel_scale``."""
    model = _transformers_model(
        "ConvNextModel",
        "ConvNextConfig",
        decoder=False,
        hidden_sizes=[16, 32],
        depths=[1, 1],
        num_stages=2,
        image_size=32,
        patch_size=4,
    )
    generator = torch.Generator().manual_seed(13)
    with torch.no_grad():
        for module in model.modules():
            if getattr(module, "layer_scale_parameter", None) is not None:
                scale = module.layer_scale_parameter
                scale.copy_(torch.rand(scale.shape, generator=generator) + 0.5)
    pixels = torch.randn(BATCH, 3, 32, 32, generator=torch.Generator().manual_seed(10))
    return RealModel("convnext", LastHiddenState(model, "pixel_values").eval(), (pixels,))


def whisper_encoder() -> RealModel:
    """A two-layer Whisper encoder on 32 frames of 16 mel bins: two convolutions with a GELU
    each (the second of stride 2, both padded), served as GEMMs with the bias and the GELU in
    the call (:mod:`tir_byoc.relax.convolutions`)."""
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    encoder = _transformers_model(
        WhisperEncoder,
        "WhisperConfig",
        decoder=False,
        d_model=HIDDEN,
        encoder_layers=2,
        encoder_attention_heads=HEADS,
        encoder_ffn_dim=INTERMEDIATE,
        vocab_size=VOCAB,
        num_mel_bins=16,
        max_source_positions=SEQUENCE,
        use_cache=False,
    )
    frames = torch.randn(BATCH, 16, 2 * SEQUENCE, generator=torch.Generator().manual_seed(9))
    return RealModel(
        "whisper_encoder", LastHiddenState(encoder, "input_features").eval(), (frames,)
    )


def wav2vec2() -> RealModel:
    """A two-layer Wav2Vec2 on 400 samples of raw audio: two convolutions (strides 5 and 2)
    make 39 frames, and its positional embedding is a convolution in 4 groups (a kernel of
    16, padded by 8), served as one batched GEMM of a (batch, group) product each
    (:mod:`tir_byoc.relax.convolutions`)."""
    encoder = _transformers_model(
        "Wav2Vec2Model",
        "Wav2Vec2Config",
        decoder=False,
        **_BERT_LIKE,
        **model_settings.WAV2VEC2_CONVOLUTIONS,
    )
    samples = torch.randn(
        BATCH, model_settings.WAV2VEC2_SAMPLES, generator=torch.Generator().manual_seed(10)
    )
    return RealModel("wav2vec2", LastHiddenState(encoder, "input_values").eval(), (samples,))


def gpt_neox() -> RealModel:
    """A two-layer GPT-NeoX decoder (Pythia's architecture): attention and MLP in parallel,
    both added to the layer's input, so the MLP's second GEMM has two residual adds after its
    bias, an epilogue out of slot order (:mod:`tir_byoc.epilogues`)."""
    return _decoder("gpt_neox", "GPTNeoXForCausalLM", "GPTNeoXConfig", 7, **_BERT_LIKE)


def falcon() -> RealModel:
    """A two-layer Falcon decoder: multi-query attention (one key/value head) and the
    attention and MLP in parallel.  It splits its fused q/k/v projection with negative
    indices (``fused_qkv[..., [-2], :]``), which TVM 0.27 imports as an out-of-bounds read
    (:mod:`tir_byoc.relax.wrap_indices`)."""
    settings = {k: v for k, v in _BERT_LIKE.items() if k != "intermediate_size"}
    return _decoder(
        "falcon",
        "FalconForCausalLM",
        "FalconConfig",
        5,
        **settings,
        ffn_hidden_size=INTERMEDIATE,
        bos_token_id=0,
        eos_token_id=0,
    )


def encoder_layer() -> RealModel:
    """torch's own ``nn.TransformerEncoderLayer`` (``nn.MultiheadAttention`` inside)."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(
            HIDDEN, HEADS, INTERMEDIATE, batch_first=True, dropout=0.0
        ).eval()
    x = torch.randn(BATCH, SEQUENCE, HIDDEN, generator=torch.Generator().manual_seed(3))
    return RealModel("encoder_layer", layer, (x,))


#: The models, by name.
MODELS: dict[str, Callable[[], RealModel]] = {
    "bert": bert,
    "deberta": deberta,
    "clip_text": clip_text,
    "vit": vit,
    "dinov2": dinov2,
    "whisper_encoder": whisper_encoder,
    "wav2vec2": wav2vec2,
    "llama": llama,
    "gpt2": gpt2,
    "gpt_neox": gpt_neox,
    "falcon": falcon,
    "encoder_layer": encoder_layer,
}


@contextlib.contextmanager
def _plain_attention():
    """Attention as the matmuls that ``FlopCounterMode`` counts.

    In eval mode without grad ``nn.TransformerEncoderLayer`` takes a fused fast path, and on
    CPU ``scaled_dot_product_attention`` runs a flash kernel; the counter has no formula for
    either and would count their GEMMs as zero.  The math backend computes the same products
    with ``bmm``.
    """
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with sdpa_kernel(SDPBackend.MATH):
            yield
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)


def torch_gemm_flops(model: RealModel) -> dict[str, int]:
    """The GEMM FLOPs of one eager forward pass, by aten operator.

    Raises
    ------
    ValueError
        If the counter attributes FLOPs to an operator that is not a GEMM.
    """
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), _plain_attention(), counter:
        model.module(*model.inputs)
    counts = {str(op): int(n) for op, n in counter.get_flop_counts()["Global"].items() if n}
    unknown = sorted(set(counts) - GEMM_OPS)
    if unknown:
        raise ValueError(f"expected FLOPs from GEMM operators only, got some from {unknown}")
    return counts


def lower(model: RealModel) -> tvm.IRModule:
    """Export with torch, import into Relax (weights bound as constants), lower and fuse.

    The import is :func:`tir_byoc.build_model`'s (:func:`tir_byoc.frontend.import_torch`:
    ``torch.export``, then ``from_exported_program`` with integer true divisions cast to
    float first, which TVM 0.27 would import as integer divisions).  The lowering is
    :func:`tir_byoc.build_model`'s, :func:`tir_byoc.relax.pipeline.lower`: the
    reshapes around each Linear folded (:mod:`tir_byoc.relax.linear_reshapes`), so that an
    activation or a residual add after a projection fuses into its GEMM's PrimFunc, then
    ``LegalizeOps``, ``AnnotateTIROpPattern``, ``FuseOps``, ``FuseTIR``.
    """
    from tir_byoc.relax import pipeline

    mod, _ = tir_byoc.frontend.import_torch(model.module, model.inputs)
    return pipeline.lower(mod)


@dataclass(frozen=True)
class Compiled:
    """A model lowered, offloaded and built, with torch's result for its inputs.

    Attributes
    ----------
    model : RealModel
    offloaded : tvm.IRModule
        What :func:`tir_byoc.offload` made of the lowered model.
    executable : tvm.runtime.Executable
        ``offloaded`` built for llvm.
    expected : numpy.ndarray
        The eager torch model's output.
    """

    model: RealModel
    offloaded: tvm.IRModule
    executable: tvm.runtime.Executable
    expected: np.ndarray

    def run(self) -> np.ndarray:
        """The output of ``main`` on the Relax VM, for the model's inputs."""
        vm = relax.VirtualMachine(self.executable, tvm.cpu())
        args = [tvm.runtime.tensor(t.numpy()) for t in self.model.inputs]
        (output,) = vm["main"](*args)
        return output.numpy()


def compile_model(model: RealModel) -> Compiled:
    """Lower ``model``, offload it with every available backend, build it for llvm."""
    with torch.no_grad():
        expected = model.module(*model.inputs).numpy()
    offloaded = tir_byoc.offload(lower(model))
    executable = tvm.compile(offloaded, target="llvm")
    return Compiled(model, offloaded, executable, expected)


@dataclass(frozen=True)
class ExternCall:
    """One ``tir_byoc_*`` call as the offloaded module makes it.

    ``times`` is how often one call of its PrimFunc runs it (the trip count of the loops
    around it); ``batch`` is 1 except for the batched ``*_bmm_*`` entry points.
    """

    func: str
    symbol: str
    m: int
    n: int
    k: int
    batch: int
    times: int

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.batch * self.times


def _static(expr, what: str, symbol: str) -> int:
    if not isinstance(expr, tirx.IntImm):
        raise ValueError(f"{symbol}: expected a constant {what}, got {expr}")
    return int(expr.value)


def _extern_call(func: str, call: tvm.ir.Call, times: int) -> ExternCall:
    """Read M, N, K and the batch count from a call's arguments (see ``tir_byoc.h``).

    The arguments are the operand pointers, then ``m, n, k`` (int64) and ``dtypes`` (int32,
    the first int32 constant); a ``*_bmm_*`` entry point follows with ``batch0, batch1`` and
    the operands' strides.
    """
    symbol = str(call.args[0].value)
    args = list(call.args[1:])
    int32 = [isinstance(a, tirx.IntImm) and str(a.ty.dtype) == "int32" for a in args]
    dtypes = int32.index(True) if True in int32 else None
    if dtypes is None or dtypes < 3:
        raise ValueError(f"{symbol}: expected m, n, k then an int32 dtypes argument, got {args}")
    m, n, k = (_static(a, name, symbol) for a, name in zip(args[dtypes - 3 : dtypes], "mnk"))
    batch = 1
    # A bmm_ entry point has the batch after dtypes; the gemm one after dtypes and layout.
    first = {"bmm": dtypes + 1, "gemm": dtypes + 2}.get(
        "bmm" if "_bmm_" in symbol else "gemm" if symbol.endswith("_gemm") else None
    )
    if first is not None:
        batch0, batch1 = args[first], args[first + 1]
        batch = _static(batch0, "batch0", symbol) * _static(batch1, "batch1", symbol)
    return ExternCall(func, symbol, m, n, k, batch, times)


def epilogues_left_behind(mod: tvm.IRModule) -> list[str]:
    """Blocks that read an offloaded call's output inside the call's own PrimFunc.

    After the Relax fold of the Linear reshapes, an activation, gate or residual add of a GEMM
    sits in the GEMM's PrimFunc; one that is still TVM code there reads the call's output.
    """
    left = []
    for gvar, func in mod.functions_items():
        if not isinstance(func, tirx.PrimFunc):
            continue
        blocks = []
        tvm_ffi.structural_walk(func.body, (s_tir.SBlock, blocks.append))
        calls = [b for b in blocks if b.annotations and "tir_byoc.intrinsic" in b.annotations]
        outputs = {
            w.source: str(c.annotations["tir_byoc.intrinsic"]) for c in calls for w in c.writes
        }
        for block in blocks:
            for region in block.reads:
                if region.source in outputs and block not in calls:
                    left.append(
                        f"{gvar.name_hint}: block {block.name_hint} reads {region.source.name}, "
                        f"the output of {outputs[region.source]}"
                    )
    return left


def extern_calls(name: str, func: tirx.PrimFunc) -> list[ExternCall]:
    """The ``tir_byoc_*`` calls of one PrimFunc, each with the trip count of its loops."""
    found: list[ExternCall] = []
    loops: list[tirx.For] = []

    def on_loop(loop, visitor):
        loops.append(loop)
        visitor.default_visit(loop)
        loops.pop()

    def on_call(call, visitor):
        if call.op.same_as(_CALL_EXTERN) and str(call.args[0].value).startswith(SYMBOL_PREFIX):
            symbol = str(call.args[0].value)
            times = math.prod(_static(loop.extent, "loop extent", symbol) for loop in loops)
            found.append(_extern_call(name, call, times))
        visitor.default_visit(call)

    tvm_ffi.structural_visit(func.body, [(tirx.For, on_loop), (tvm.ir.Call, on_call)])
    return found


def call_sites(mod: tvm.IRModule, entry: str = "main") -> list[str]:
    """The PrimFunc of every ``R.call_tir`` run by one call of ``entry``, once per call site.

    A call of another Relax function of ``mod`` contributes that function's call sites, once
    per call.
    """
    callees: list[str] = []

    def on_call(call):
        if call.op.same_as(_CALL_TIR):
            callees.append(call.args[0].name_hint)
        elif isinstance(call.op, tvm.ir.GlobalVar) and isinstance(mod[call.op], relax.Function):
            callees.extend(call_sites(mod, call.op.name_hint))

    tvm_ffi.structural_walk(mod[entry].body, (relax.Call, on_call))
    return callees


def library_calls(mod: tvm.IRModule, entry: str = "main") -> list[ExternCall]:
    """Every library call one run of ``entry`` makes, one record per call (FLOPs: ``.flops``)."""
    sites = call_sites(mod, entry)
    calls = {callee: extern_calls(callee, mod[callee]) for callee in set(sites)}
    return [c for callee in sites for c in calls[callee]]


def refusals(offloaded: tvm.IRModule) -> list[str]:
    """Why what is left of the GEMM work was not offloaded: tir_byoc's own reasons.

    The candidates :func:`tir_byoc.explain` refused, and the matches :func:`tir_byoc.scan`
    found no intrinsic for, in the offloaded module's PrimFuncs called from ``main``.
    """
    called = set(call_sites(offloaded))
    refused = [str(r) for r in tir_byoc.explain(offloaded) if r.func in called]
    unserved = [
        f"{c.func}: {', '.join(c.blocks)} ({c.pattern}, {c.dtype}): no intrinsic: {c.reason}"
        for c in tir_byoc.scan(offloaded)
        if c.intrinsic is None and c.func in called
    ]
    return refused + unserved
