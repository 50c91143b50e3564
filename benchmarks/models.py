"""Whole models, side by side: torch eager, torch.compile, ONNX Runtime, TVM and tir_byoc.

Entry point: ``python benchmarks/models.py`` (``make bench-models``).  Each thread count runs in
a child process of its own, with every pool (torch's, TVM's, OpenMP's, ONNX Runtime's) told
that count before any library loads; inside it, for each model and batch, every column is
built, checked against torch eager, and then timed in interleaved rounds (a round times each
column once, for about ``--budget`` seconds; the table keeps each column's median over the
rounds).  Peak memory is measured apart (``--memory``): one fresh process per cell builds and
runs only that column, and reports its peak resident set above the same process's footprint
once the libraries are imported; for the TVM columns, also the model as deployed ("deployed"):
a fresh process that loads the exported library and runs it, above ``import tvm``.

The models are built from transformers configs (and torch's ``nn.TransformerEncoder``) with
random weights; nothing is downloaded.  They keep the base models' widths (768 hidden, 12
heads) with ``--layers`` layers (default 2: a layer's cost is the same in a 12-layer model,
and a run stays within minutes on a 2-core machine), and return the last hidden state (no
language-model head).  Decoders take the additive float causal mask that eager attention adds
(TVM 0.27 cannot compile the boolean one transformers builds).  On request, three models whose
transformer follows convolutions: ``whisper`` (Whisper-small's encoder on ``2 x --sequence``
frames of 80 mel bins: two conv1d), ``vit`` (ViT-base on 224 x 224 images: a 16 x 16 patch
embedding) and ``wav2vec2`` (Wav2Vec2-base on raw samples making ``--sequence`` frames: seven
conv1d, then a positional conv1d of 16 groups).

Columns: ``torch`` (eager, ``inference_mode``), ``torch.compile`` (inductor, default mode),
``onnxruntime`` (``torch.onnx.export`` then ORT's CPU provider, all graph optimisations),
``tvm`` (``build_model(offload=False)``: TVM's lowering and the default rules of
:mod:`tir_byoc.schedules`), ``tir_byoc`` (``build_model``: offloaded, the rest under the same
rules); with ``--tune-trials N`` also ``tvm+ms`` and ``tir_byoc+ms`` (MetaSchedule, N trials per
model).  Tuning is cached: a model's database, per column and budget, is kept in
``--work-dir``, and once there it is built as it is (``build_model(tune_trials=0,
work_dir=...)``), by later runs and by the other thread counts of the same run (so with the
default ``--threads 1,2`` the 2-thread cells build what was tuned at one thread; the note says
where each was tuned and how long it took; delete the directory to tune again); on request
``tir_byoc-plain`` (every weight left plain, to compare with packing's choice),
``tir_byoc-native-conv`` (convolutions left to TVM's code, as before
:mod:`tir_byoc.relax.convolutions`) and ``tir_byoc-<backend>`` (one backend only:
``tir_byoc-onednn`` beside the default, which gives fp32 to MKL).

Each tir_byoc column's time is also split by its profile (:meth:`tir_byoc.Model.profile`)
into the PrimFuncs that call an intrinsic ("library": the GEMMs with their epilogues) and the
rest ("TVM code"); ``torch / library`` is the most that build could gain over torch eager with
the rest taking no time at all.  The ONNX Runtime column is split likewise by ORT's own
profiler, into its GEMM and convolution nodes (MLAS's kernels; an activation is a node of its
own there) and the other nodes: set beside tir_byoc's library time, it says whose GEMMs are
faster where ORT wins.  Each cell also has its "GEMM floor": the model's GEMM FLOPs
(torch's ``FlopCounterMode``) at the best fp32 GEMM rate torch reaches in the same process on
the FFN's shapes; ``torch / floor`` is the most any fp32 build, whatever runs its GEMMs, could
gain over torch eager unless its GEMMs ran faster than that.  Its "FMA bound" is the same
FLOPs at the cores' own fp32 multiply-add peak (``fma_peak.c``, at the cell's thread count):
``torch / FMA bound`` is the most any fp32 build computing these products could gain.

libgomp reads its idle spin (``GOMP_SPINCOUNT``) once per process, and torch eager and tir_byoc
want opposite ones at two threads or more (benchmarks/HISTORY.md, "libgomp's idle spin").  By
default (``--gomp-spincount own``) each side runs at its own: torch's columns at libgomp's
default, as a torch user gets them, and TVM's at tir_byoc's setting, as ``import tir_byoc``
gives them; then each cell runs a child per side and round, the sides alternated, and the table
keeps each column's median over its children.  At one thread the spin plays no part and one
child times every column in interleaved rounds.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from timing import median_ms_in

from tir_byoc.frontend import causal_mask
from tir_byoc.threads import IDLE_DEFAULTS

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "models"
MODELS = ("bert", "gpt2", "llama", "encoder")
#: Models run on request (``--models whisper,vit,wav2vec2,convnext``): convolutions before the
#: transformer, and ConvNeXt's convolutions throughout.
CONV_MODELS = ("whisper", "vit", "wav2vec2", "convnext")
#: Convolutional networks run on request (``--models resnet50,mobilenet_v2,vgg``): the model
#: zoo's (:data:`tir_byoc.testing.cnns.CNNS`), 224 x 224, batch norm calibrated.
CNN_MODELS = ("resnet50", "mobilenet_v2", "vgg")
COLUMNS = ("torch", "torch.compile", "onnxruntime", "tvm", "tir_byoc")
#: The columns run at libgomp's own idle spin under ``--gomp-spincount own``: the peers, as
#: their users run them; every other column is TVM's and runs at tir_byoc's setting.
PEER_COLUMNS = ("torch", "torch.compile", "onnxruntime")
TUNED_COLUMNS = ("tvm+ms", "tir_byoc+ms")
#: tir_byoc with every weight left plain (each of :data:`PACK_SETTINGS` set to ``plain``),
#: beside packing's choice; not a default column (``--columns ...,tir_byoc-plain``).
PLAIN_COLUMN = "tir_byoc-plain"
#: tir_byoc with its convolutions left to TVM's code (the lowering without
#: ``tir_byoc.relax.convolutions``), beside the default, which serves them as GEMMs; not a
#: default column.
NATIVE_CONV_COLUMN = "tir_byoc-native-conv"
#: The variables that name a backend's packed form, read by its pack function at build time.
PACK_SETTINGS = ("TIR_BYOC_ONEDNN_PACK", "TIR_BYOC_MKL_PACK")
#: tir_byoc on one backend only, ``tir_byoc-<backend>`` (``backends=[<backend>]``), e.g.
#: ``tir_byoc-onednn`` beside ``tir_byoc`` (MKL first for fp32); not default columns.
BACKEND_COLUMN = "tir_byoc-"
HIDDEN, HEADS, INTERMEDIATE = 768, 12, 3072
#: Relative tolerance of a column's output against torch eager's (fp32, summation order).
TOLERANCE = 1e-3


# --------------------------------------------------------------------------------------
# The models
# --------------------------------------------------------------------------------------


def build(name: str, layers: int, batch: int, sequence: int):
    """(torch module in eval mode, example input) of one model; random weights, seed 0.

    Built as the tests' models are (:func:`tir_byoc.testing.models.from_config`), at the base
    models' widths: BERT-base's (768 hidden, 12 heads, 3072) but for LLaMA's (4 key/value
    heads, 2048, 32000 tokens); ``vit`` and ``convnext`` (ConvNeXt-T's widths, ``layers``
    blocks per stage) on 224 x 224 images, ``whisper`` (Whisper-small's encoder) on
    ``2 x sequence`` frames of 80 mel bins, ``wav2vec2`` (Wav2Vec2-base) on the raw 16 kHz
    samples making ``sequence`` frames of 20 ms.  Decoders return the last hidden state under
    the causal mask.
    """
    from tir_byoc.testing import cnns, models

    known = MODELS + CONV_MODELS + CNN_MODELS
    if name not in known:
        raise ValueError(f"benchmarks/models.py: expected a model of {known}, got {name!r}")
    if name in CNN_MODELS:
        network = cnns.CNNS[name](batch=batch)
        return network.module, network.inputs[0]
    torch.manual_seed(0)

    def drawn(*shape):
        return torch.randn(*shape, generator=torch.Generator().manual_seed(1))

    if name == "encoder":
        layer = torch.nn.TransformerEncoderLayer(
            HIDDEN, HEADS, INTERMEDIATE, dropout=0.0, batch_first=True
        )
        model = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        return model.eval(), drawn(batch, sequence, HIDDEN)
    base = dict(hidden_size=HIDDEN, num_hidden_layers=layers, num_attention_heads=HEADS)
    base["intermediate_size"] = INTERMEDIATE
    llama = dict(base, num_key_value_heads=4, intermediate_size=2048, vocab_size=32000)
    gpt2 = dict(n_embd=HIDDEN, n_layer=layers, n_head=HEADS, n_inner=INTERMEDIATE)
    whisper = dict(d_model=HIDDEN, encoder_layers=layers, encoder_attention_heads=HEADS)
    whisper.update(encoder_ffn_dim=INTERMEDIATE, num_mel_bins=80, max_source_positions=sequence)
    images, frames = (batch, 3, 224, 224), (batch, 80, 2 * sequence)
    samples = (batch, 320 * (sequence - 1) + 400)  # Wav2Vec2's strides: 5 2 2 2 2 2 2
    convnext, wav2vec2 = dict(depths=[layers] * 4), dict(num_hidden_layers=layers)
    # name: (config, model, settings, model arguments, argument, input shape or None: ids)
    specs = {
        "bert": ("BertConfig", "BertModel", base, NO_POOLER, "input_ids", None),
        "gpt2": ("GPT2Config", "GPT2Model", dict(gpt2, **NO_CACHE), None, "input_ids", None),
        "llama": ("LlamaConfig", "LlamaModel", dict(llama, **NO_CACHE), None, "input_ids", None),
        "whisper": ("WhisperConfig", WHISPER, whisper, None, "input_features", frames),
        "vit": ("ViTConfig", "ViTModel", base, NO_POOLER, "pixel_values", images),
        "convnext": ("ConvNextConfig", "ConvNextModel", convnext, None, "pixel_values", images),
        "wav2vec2": ("Wav2Vec2Config", "Wav2Vec2Model", wav2vec2, None, "input_values", samples),
    }
    config, model_class, settings, model_args, argument, shape = specs[name]
    model = models.from_config(config, model_class, settings, model_args)
    mask = causal_mask(sequence) if name in ("gpt2", "llama") else None
    ids = torch.randint(0, 1000, (batch, sequence), generator=torch.Generator().manual_seed(1))
    return models.last_hidden_state(model, argument, mask), ids if shape is None else drawn(*shape)


NO_POOLER, NO_CACHE = {"add_pooling_layer": False}, {"use_cache": False}
WHISPER = "models.whisper.modeling_whisper.WhisperEncoder"


# --------------------------------------------------------------------------------------
# The columns: each returns a callable running one inference on the example input
# --------------------------------------------------------------------------------------


def column(name: str, model, x, threads: int, args):
    """A no-argument callable that runs ``model`` on ``x`` the way column ``name`` does."""

    if name == "torch":
        return lambda: model(x)
    if name == "torch.compile":
        compiled = torch.compile(model)
        compiled(x)
        return lambda: compiled(x)
    if name == "onnxruntime":
        return _onnxruntime(model, x, threads)
    import tir_byoc

    tune = name.endswith("+ms")
    plain = name == PLAIN_COLUMN
    work_dir, trials, tuning = None, 0, ""
    if tune:
        # The database holds schedules for one target: this machine's CPU (build_model's default).
        cpu = tir_byoc.model.host_target().attrs.get("mcpu", "generic")
        work_dir = Path(args.work_dir) / f"{args.model_key}-{name}-t{args.tune_trials}-{cpu}"
        tuning = _tuning_note(work_dir, cached=True)
        trials = 0 if tuning else args.tune_trials
    if plain:  # read by the backends' pack functions while this build packs, and only then
        os.environ.update(dict.fromkeys(PACK_SETTINGS, "plain"))
    from tir_byoc.relax import pipeline

    lowering = pipeline.BEFORE_LEGALIZE
    if name == NATIVE_CONV_COLUMN:
        from tir_byoc.relax.convolutions import ConvolutionsAsGemms

        pipeline.BEFORE_LEGALIZE = tuple(p for p in lowering if p is not ConvolutionsAsGemms)
    start = time.perf_counter()
    try:
        built = tir_byoc.build_model(
            model,
            (x,),
            offload=name.startswith("tir_byoc"),
            backends=_backends(name),
            tune_trials=trials,
            work_dir=work_dir,
        )
    finally:
        pipeline.BEFORE_LEGALIZE = lowering
        if plain:
            for setting in PACK_SETTINGS:
                del os.environ[setting]
    if tune and not tuning:
        seconds = time.perf_counter() - start
        (work_dir / TUNED_FILE).write_text(json.dumps({"threads": threads, "seconds": seconds}))
        tuning = _tuning_note(work_dir, cached=False)

    def run():
        return built(x)

    run.built = built  # for the deployed peak memory (memory_child)
    run.tuning = tuning
    return run


#: What a tuned column writes in its work_dir once tuned: the threads it tuned at, how long.
TUNED_FILE = "models_tuned.json"


def _backends(name: str) -> list[str] | None:
    """The backends a column offloads to: one for ``tir_byoc-<backend>``, else the default."""
    if not name.startswith(BACKEND_COLUMN) or name in (PLAIN_COLUMN, NATIVE_CONV_COLUMN):
        return None
    return [name[len(BACKEND_COLUMN) :]]


def _tuning_note(work_dir: Path, cached: bool) -> str:
    """How the database in ``work_dir`` was tuned, for the note; ``""`` if it was not."""
    path = work_dir / TUNED_FILE
    if not path.is_file():
        return ""
    tuned = json.loads(path.read_text())
    note = f"tuned at {tuned['threads']} thread(s) in {tuned['seconds']:.0f} s"
    return note + (", cached" if cached else "")


def _onnxruntime(model, x, threads: int):
    path = Path(tempfile.mkdtemp()) / "model.onnx"
    torch.onnx.export(model, (x,), str(path), dynamo=True, external_data=False)
    session = _onnxruntime_session(path, threads)
    feed = {session.get_inputs()[0].name: x.numpy()}

    def run():
        return torch.from_numpy(session.run(None, feed)[0])

    run.split = lambda: _onnxruntime_split(path, threads, feed)
    return run


def _onnxruntime_session(path: Path, threads: int, profile_prefix: str | None = None):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    if profile_prefix:
        options.enable_profiling = True
        options.profile_file_prefix = profile_prefix
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


#: The ONNX Runtime nodes that are a GEMM (with what its graph optimisations fused into one: a
#: bias in ``Gemm``, a scale or transpose in ``FusedMatMul``), and its convolutions, whose
#: work tir_byoc's library time holds too (im2col and a GEMM, :mod:`tir_byoc.relax.convolutions`).
ONNX_GEMM_OPS = frozenset({"Gemm", "MatMul", "FusedMatMul", "FusedGemm", "Conv", "FusedConv"})


def _onnxruntime_split(path: Path, threads: int, feed, runs: int = 10) -> dict:
    """Where ONNX Runtime spends a run, from its own profiler, on a second session of the same
    model: ``ort_gemm_ms`` in its GEMM nodes (:data:`ONNX_GEMM_OPS`, MLAS's kernels),
    ``ort_rest_ms`` in every other node; each the mean of ``runs`` runs after three warm-up
    runs (the warm-up runs are profiled too, and left out)."""
    session = _onnxruntime_session(path, threads, str(path.parent / "profile"))
    for _ in range(3):
        session.run(None, feed)
    for _ in range(runs):
        session.run(None, feed)
    trace = Path(session.end_profiling())
    events = json.loads(trace.read_text())
    trace.unlink()
    return _node_times(events, runs)


def _node_times(events: list[dict], runs: int) -> dict:
    """``ort_gemm_ms`` and ``ort_rest_ms`` per run from an ONNX Runtime profile's events: the
    kernel times of the nodes of the last ``runs`` runs (``model_run`` events mark each run)."""
    model_runs = sorted(e["ts"] for e in events if e.get("name") == "model_run")
    if len(model_runs) < runs:
        raise ValueError(f"the ONNX Runtime profile holds {len(model_runs)} runs, not {runs}")
    since = model_runs[-runs]
    gemm = rest = 0
    for event in events:
        if event.get("cat") != "Node" or not event["name"].endswith("_kernel_time"):
            continue
        if event["ts"] < since:
            continue
        if event["args"]["op_name"] in ONNX_GEMM_OPS:
            gemm += event["dur"]
        else:
            rest += event["dur"]
    return {"ort_gemm_ms": gemm / runs / 1e3, "ort_rest_ms": rest / runs / 1e3}


def _agrees(result, expected) -> str:
    """``""`` if ``result`` equals torch eager's output within :data:`TOLERANCE`, else why not."""
    result = torch.as_tensor(result)
    scale = float(expected.abs().max())
    error = float((result - expected).abs().max())
    return "" if error <= TOLERANCE * max(scale, 1.0) else f"max |diff| {error:.3g} vs torch"


#: A column whose one run takes longer than this many seconds is timed by that one run.
SLOW_SECONDS = 3.0


def _median_ms(run, budget: float) -> float:
    start = time.perf_counter()
    run()
    once = time.perf_counter() - start
    if once > SLOW_SECONDS:
        return once * 1e3
    return median_ms_in(run, budget)


# --------------------------------------------------------------------------------------
# The child process of one thread count
# --------------------------------------------------------------------------------------


def child(args) -> list[dict]:

    torch.set_num_threads(args.threads)
    rows = []
    for model_name in args.models:
        for batch in args.batches:
            key = f"{model_name}-b{batch}-s{args.sequence}-l{args.layers}"
            args.model_key = key
            model, x = build(model_name, args.layers, batch, args.sequence)
            with torch.inference_mode():
                expected = model(x)
            runs, notes = {}, {}
            for name in args.columns:
                start = time.perf_counter()
                try:
                    with torch.inference_mode():
                        run = column(name, model, x, args.threads, args)
                        notes[name] = _agrees(run(), expected)
                    if not notes[name]:  # a wrong result is reported, not timed
                        runs[name] = run
                except Exception as error:  # a column that fails is a row with its reason
                    notes[name] = f"failed: {type(error).__name__}: {str(error)[:160]}"
                    notes[name] = notes[name].replace("\n", " ")
                build_s = time.perf_counter() - start
                print(f"  {key} {name}: built in {build_s:.0f} s {notes[name]}", file=sys.stderr)
            times = {name: [] for name in runs}
            with torch.inference_mode():
                for _ in range(args.rounds):
                    for name, run in runs.items():
                        if times[name] and times[name][-1] > 1e3 * SLOW_SECONDS:
                            continue  # one timed run is enough to say it is this slow
                        times[name].append(_median_ms(run, args.budget))
            for name, measured in times.items():
                if measured and measured[-1] > 1e3 * SLOW_SECONDS:
                    notes[name] = f"one timed run (over {SLOW_SECONDS:.0f} s)"
            splits = {
                name: _split(run.built, x)
                for name, run in runs.items()
                if name.startswith("tir_byoc") and hasattr(run, "built")
            }
            if hasattr(runs.get("onnxruntime"), "split"):
                splits["onnxruntime"] = runs["onnxruntime"].split()
            floor = _gemm_floor(model, x, args.budget, args.threads)
            for name in args.columns:
                ms = statistics.median(times[name]) if name in times else None
                rows.append(
                    {
                        "model": model_name,
                        "batch": batch,
                        "threads": args.threads,
                        "column": name,
                        "ms": ms,
                        "note": notes.get(name, ""),
                        "tuning": getattr(runs.get(name), "tuning", ""),
                        **splits.get(name, {}),
                        **floor,
                    }
                )
    return rows


#: GEMM shapes (M, K, N) whose best rate under torch is the machine's fp32 GEMM rate of a
#: cell's floor: the FFN's two GEMMs at batch 8 (M = 8 x 128), the largest of these models.
PEAK_SHAPES = ((1024, 768, 3072), (1024, 3072, 768))


def _gemm_floor(model, x, budget: float, threads: int = 1) -> dict:
    """``model``'s GEMM GFLOP on ``x`` (``gemm_gflop``), the best fp32 GEMM rate torch
    reaches here on :data:`PEAK_SHAPES` (``peak_gflops``), measured now, at this process's
    threads, and the cores' multiply-add peak at ``threads`` (``fma_gflops``, :func:`_fma_peak`);
    :func:`_ratios` makes a cell's floor and FMA bound of them (its children may measure several).

    The models use eager attention, so every FLOP ``FlopCounterMode`` counts is a GEMM's (or a
    convolution's, the GEMM of its im2col).  ``nn.TransformerEncoder`` is counted in training
    mode: in eval mode it takes its fused fast path, whose one operator the counter does not
    know; the GEMMs are the same (dropout has none).  The others are counted as they run:
    Wav2Vec2's feature extractor asks for gradients in training mode.
    """
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    training = model.training
    fast_path = any(isinstance(m, torch.nn.TransformerEncoder) for m in model.modules())
    model.train(fast_path or training)
    try:
        with counter, torch.no_grad():  # Wav2Vec2's weight norm fails under inference mode
            model(x)
    finally:
        model.train(training)
    gflop = counter.get_total_flops() / 1e9
    if not gflop:
        raise ValueError(f"benchmarks/models.py: FlopCounterMode counted no GEMM in {model}")
    peak = 0.0
    with torch.inference_mode():
        for m, k, n in PEAK_SHAPES:
            a, w = torch.randn(m, k), torch.randn(n, k)
            ms = _median_ms(lambda a=a, w=w: torch.nn.functional.linear(a, w), budget)
            peak = max(peak, 2 * m * k * n / ms / 1e6)
    return {"gemm_gflop": gflop, "peak_gflops": peak, "fma_gflops": _fma_peak(threads)}


def _fma_peak(threads: int) -> float:
    """The fp32 multiply-add peak of ``threads`` cores in GFLOP/s, measured now by
    ``fma_peak.c`` (compiled for this CPU on first use, kept beside the results)."""
    from tir_byoc import toolchain

    source = HERE / "fma_peak.c"
    binary = RESULTS.parent / "bin" / "fma_peak"
    if not binary.exists() or binary.stat().st_mtime < source.stat().st_mtime:
        binary.parent.mkdir(parents=True, exist_ok=True)
        compiler = toolchain.c_compiler().path
        flags = ["-O2", "-march=native", "-ffp-contract=fast", "-pthread"]
        subprocess.run([compiler, *flags, str(source), "-o", str(binary)], check=True)
    done = subprocess.run([str(binary), str(threads)], capture_output=True, text=True, check=True)
    return float(done.stdout)


def _split(built, x) -> dict:
    """Where a tir_byoc build spends its time, from its profile: ``library_ms`` in the
    PrimFuncs that call an intrinsic (the GEMMs and their epilogues), ``tvm_ms`` in the rest.
    ``library_ms`` is a floor for this build: no schedule of the rest goes below it."""
    with torch.inference_mode():
        profile = built.profile(x, repeat=10, warmup=3)
    library = profile.offloaded_share * profile.total_ms
    return {"library_ms": library, "tvm_ms": profile.total_ms - library}


def memory_child(args) -> dict:
    """Peak RSS above the imported libraries' footprint, of building and running one column."""

    import tir_byoc  # noqa: F401  (its import is part of the baseline, not of the column)

    torch.set_num_threads(args.threads)
    (model_name,), (batch,), (name,) = args.models, args.batches, args.columns
    args.model_key = f"{model_name}-b{batch}-s{args.sequence}-l{args.layers}"
    baseline = _rss_mb()
    model, x = build(model_name, args.layers, batch, args.sequence)
    with torch.inference_mode():
        run = column(name, model, x, args.threads, args)
        for _ in range(3):
            run()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    deployed = _deployed_mb(run.built, x) if hasattr(run, "built") else None
    return {
        "model": model_name,
        "batch": batch,
        "column": name,
        "peak_mb": peak - baseline,
        "deployed_mb": deployed,
    }


_DEPLOYED = """
import sys, numpy as np, tvm
from tvm import relax
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) / 1024
base = status("VmRSS:")
vm = relax.VirtualMachine(tvm.runtime.load_module(sys.argv[1]), tvm.cpu())
x = tvm.runtime.tensor(np.load(sys.argv[2]))
for _ in range(3):
    vm["main"](x)
print(status("VmHWM:") - base)
"""


def _deployed_mb(built, x) -> float:
    """Peak RSS (VmHWM) above the resident set after ``import tvm`` of a fresh process that
    loads ``built``'s exported library and runs it: the model as deployed, without the torch
    model it was built from."""
    directory = Path(tempfile.mkdtemp())
    library = built.export_library(directory / "model.so")
    import numpy as np

    np.save(directory / "x.npy", x.numpy())
    command = [sys.executable, "-c", _DEPLOYED, str(library), str(directory / "x.npy")]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return float(done.stdout.split()[-1])


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _environment(threads: int, gomp_spincount: str) -> dict:
    env = dict(os.environ)
    for variable in ("OMP_NUM_THREADS", "TVM_NUM_THREADS", "MKL_NUM_THREADS"):
        env[variable] = str(threads)
    # The child imports torch first, which loads libgomp before tir_byoc could set its spin.
    env.pop("GOMP_SPINCOUNT", None)
    if gomp_spincount != "default":
        env["GOMP_SPINCOUNT"] = gomp_spincount
    return env


def _run_child(argv: list[str], threads: int, gomp_spincount: str):
    command = [sys.executable, __file__, *argv]
    env = _environment(threads, gomp_spincount)
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"benchmarks/models.py: child {' '.join(argv)} exited {done.returncode}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------
# The parent: table, CSV, chart
# --------------------------------------------------------------------------------------


def _ratios(rows: list[dict]) -> None:
    by_cell = {}
    for row in rows:
        by_cell.setdefault((row["model"], row["batch"], row["threads"]), {})[row["column"]] = row
    for cell in by_cell.values():
        eager = cell.get("torch", {}).get("ms")
        # The cell's floor at the best rate any of its children measured (one per side).
        peaks = [
            (row["peak_gflops"], row["gemm_gflop"])
            for row in cell.values()
            if row.get("peak_gflops")
        ]
        peak, gflop = max(peaks) if peaks else (None, None)
        floor = gflop / peak * 1e3 if peaks else None
        fma = max((row.get("fma_gflops") or 0 for row in cell.values()), default=0)
        for row in cell.values():
            row["torch/this"] = eager / row["ms"] if eager and row["ms"] else None
            if eager and row.get("library_ms"):
                row["torch/library"] = eager / row["library_ms"]
            if floor:
                row["floor_ms"] = floor
                row["torch/floor"] = eager / floor if eager else None
            if fma and gflop:
                row["fma_ms"] = gflop / fma * 1e3
                row["torch/fma"] = eager / row["fma_ms"] if eager else None


def _table(rows: list[dict], columns: list[str]) -> str:
    split = "tir_byoc" in columns and any(row.get("library_ms") for row in rows)
    floors = any(row.get("floor_ms") for row in rows)
    fma = any(row.get("fma_ms") for row in rows)
    ort_split = any(row.get("ort_gemm_ms") for row in rows)
    header = "| model | batch | threads | " + " | ".join(columns) + " | torch / tir_byoc |"
    if split:
        header += " tir_byoc: library + TVM code | torch / library |"
    if ort_split:
        header += " ONNX Runtime: GEMM nodes + other nodes |"
    if floors:
        header += " GEMM floor | torch / floor |"
    if fma:
        header += " FMA bound | torch / FMA bound |"
    width = len(columns) + 4 + 2 * split + ort_split + 2 * floors + 2 * fma
    lines = [header, "|" + " --- |" * width]
    cells = {}
    for row in rows:
        cells.setdefault((row["model"], row["batch"], row["threads"]), {})[row["column"]] = row
    for (model, batch, threads), cell in cells.items():
        values = []
        for name in columns:
            row = cell.get(name)
            if row is None or row["ms"] is None:
                values.append("failed" if row and row["note"] else "-")
            else:
                memory = [
                    f"{row[key]:.0f} MB{suffix}"
                    for key, suffix in (("peak_mb", ""), ("deployed_mb", " deployed"))
                    if row.get(key) is not None
                ]
                values.append(f"{row['ms']:.1f}" + (f" ({', '.join(memory)})" if memory else ""))
        ratio = cell.get("tir_byoc", {}).get("torch/this")
        values.append(f"{ratio:.2f}" if ratio else "-")
        if split:
            row = cell.get("tir_byoc", {})
            if row.get("library_ms"):
                values.append(f"{row['library_ms']:.1f} + {row['tvm_ms']:.1f}")
                bound = row.get("torch/library")
                values.append(f"{bound:.2f}" if bound else "-")
            else:
                values += ["-", "-"]
        if ort_split:
            row = cell.get("onnxruntime", {})
            if row.get("ort_gemm_ms") is not None:
                values.append(f"{row['ort_gemm_ms']:.1f} + {row['ort_rest_ms']:.1f}")
            else:
                values.append("-")
        if floors:
            row = next((r for r in cell.values() if r.get("floor_ms")), {})
            bound = row.get("torch/floor")
            values.append(f"{row['floor_ms']:.1f}" if row else "-")
            values.append(f"{bound:.2f}" if bound else "-")
        if fma:
            row = next((r for r in cell.values() if r.get("fma_ms")), {})
            bound = row.get("torch/fma")
            values.append(f"{row['fma_ms']:.1f}" if row else "-")
            values.append(f"{bound:.2f}" if bound else "-")
        lines.append(f"| {model} | {batch} | {threads} | " + " | ".join(values) + " |")
    return "\n".join(lines)


def _chart(rows: list[dict], columns: list[str], path: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    cells = sorted({(r["model"], r["batch"], r["threads"]) for r in rows})
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(cells)), 4))
    width = 0.8 / len(columns)
    for i, name in enumerate(columns):
        values = []
        for cell in cells:
            row = next(
                (
                    r
                    for r in rows
                    if (r["model"], r["batch"], r["threads"]) == cell and r["column"] == name
                ),
                None,
            )
            values.append(row["torch/this"] if row and row.get("torch/this") else 0)
        ax.bar([c + i * width for c in range(len(cells))], values, width, label=name)
    ax.set_xticks([c + 0.4 - width / 2 for c in range(len(cells))])
    ax.set_xticklabels([f"{m}\nb{b} t{t}" for m, b, t in cells], fontsize=8)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylabel("speed-up over torch eager (higher is faster)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return str(path)


def _spincount(value: str) -> str:
    if value not in ("own", "default") and not value.isdigit():
        raise argparse.ArgumentTypeError(
            f"expected a count of spins, 'own' or 'default', got {value!r}"
        )
    return value


def _spin_note(spincount: str) -> str:
    if spincount != "own":
        return spincount
    return (
        f"own: torch's columns libgomp's default, TVM's {IDLE_DEFAULTS['GOMP_SPINCOUNT']} "
        "(at 2+ threads a child per side and round, alternated)"
    )


def _one_spin(spincount: str) -> str:
    """The one setting of ``--gomp-spincount`` for a child that runs columns of both sides."""
    return IDLE_DEFAULTS["GOMP_SPINCOUNT"] if spincount == "own" else spincount


def _time_children(args, threads: int) -> list[tuple[list[str], str]]:
    """(argv, GOMP_SPINCOUNT) of each timing child of one thread count, in the order they run.

    One child times every cell and column in ``--rounds`` interleaved rounds, unless
    ``--gomp-spincount own`` with more than one thread: then each cell gets two children per
    round, one round each, the peers (:data:`PEER_COLUMNS`) at libgomp's default and TVM's
    columns at tir_byoc's setting, in alternating order (A B, B A, A B, ...), so that a drift
    of the machine during the cell weighs on both sides alike; :func:`_merge` takes the medians.
    """

    def argv(models, batches, columns, rounds):
        return [
            "--child",
            "time",
            "--threads",
            str(threads),
            "--models",
            ",".join(models),
            "--batches",
            ",".join(map(str, batches)),
            "--columns",
            ",".join(columns),
            "--rounds",
            str(rounds),
        ]

    if args.gomp_spincount != "own" or threads == 1:
        everything = argv(args.models, args.batches, args.columns, args.rounds)
        return [(everything, _one_spin(args.gomp_spincount))]
    sides = [
        ([c for c in args.columns if c in PEER_COLUMNS], "default"),
        ([c for c in args.columns if c not in PEER_COLUMNS], IDLE_DEFAULTS["GOMP_SPINCOUNT"]),
    ]
    sides = [(columns, spin) for columns, spin in sides if columns]
    return [
        (argv([model], [batch], columns, 1), spin)
        for model in args.models
        for batch in args.batches
        for round_ in range(args.rounds)
        for columns, spin in (sides if round_ % 2 == 0 else sides[::-1])
    ]


#: Row fields :func:`_merge` takes the median of, over the children that timed a column.
MEDIAN_FIELDS = ("ms", "library_ms", "tvm_ms", "ort_gemm_ms", "ort_rest_ms", "gemm_gflop")
MEDIAN_FIELDS += ("peak_gflops", "fma_gflops")


def _merge(rows: list[dict]) -> list[dict]:
    """One row per cell and column: the median of each of :data:`MEDIAN_FIELDS` over the
    children that timed it (one child each, unless :func:`_time_children` split the sides)."""
    merged: dict[tuple, dict] = {}
    seen: dict[tuple, list[dict]] = {}
    for row in rows:
        key = (row["model"], row["batch"], row["threads"], row["column"])
        seen.setdefault(key, []).append(row)
    for key, group in seen.items():
        row = dict(group[0])
        for field in MEDIAN_FIELDS:
            values = [r[field] for r in group if r.get(field) is not None]
            row[field] = statistics.median(values) if values else None
        notes = dict.fromkeys(r["note"] for r in group if r["note"])
        row["note"] = "; ".join(notes)
        row["processes"] = len(group)
        merged[key] = row
    return list(merged.values())


def parse(argv=None) -> argparse.Namespace:
    """The command line, with ``models``, ``batches`` and ``columns`` as lists."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--sequence", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--columns", default=",".join(COLUMNS))
    parser.add_argument("--tune-trials", type=int, default=0)
    parser.add_argument("--work-dir", default=str(RESULTS / "metaschedule"))
    parser.add_argument("--budget", type=float, default=1.0, help="seconds per timed cell")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--memory", action="store_true", help="also measure peak memory")
    parser.add_argument(
        "--gomp-spincount",
        type=_spincount,
        default="own",
        help="libgomp's idle spin: 'own' (default), torch's columns at libgomp's default and "
        "TVM's at tir_byoc's, in a child per side at 2+ threads; or one setting for every "
        "column, a count or 'default' (libgomp's)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--child", choices=("time", "memory"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.models = args.models.split(",")
    args.batches = [int(b) for b in args.batches.split(",")]
    args.columns = args.columns.split(",")
    if args.tune_trials and not args.child:
        args.columns += [c for c in TUNED_COLUMNS if c not in args.columns]
    return args


def main(argv=None) -> int:
    args = parse(argv)
    if args.child:
        args.threads = int(args.threads)
        result = child(args) if args.child == "time" else memory_child(args)
        print(json.dumps(result))
        return 0
    # Step 1. Times, in the children of each thread count (_time_children).
    common = [
        "--sequence",
        str(args.sequence),
        "--layers",
        str(args.layers),
        "--tune-trials",
        str(args.tune_trials),
        "--work-dir",
        args.work_dir,
        "--budget",
        str(args.budget),
    ]
    rows = []
    for threads in [int(t) for t in args.threads.split(",")]:
        print(f"{threads} thread(s):", file=sys.stderr)
        for argv, spin in _time_children(args, threads):
            rows += _run_child([*common, *argv], threads, spin)
    rows = _merge(rows)
    # Step 2. Peak memory, one child per cell (one thread: memory does not depend on it).
    if args.memory:
        for row in rows:
            if row["threads"] != 1 or row["ms"] is None:
                continue
            peak = _run_child(
                [
                    *common,
                    "--child",
                    "memory",
                    "--threads",
                    "1",
                    "--models",
                    row["model"],
                    "--batches",
                    str(row["batch"]),
                    "--columns",
                    row["column"],
                ],
                1,
                _one_spin(args.gomp_spincount),
            )
            for other in rows:
                if (other["model"], other["batch"], other["column"]) == (
                    row["model"],
                    row["batch"],
                    row["column"],
                ):
                    other["peak_mb"] = peak["peak_mb"]
                    other["deployed_mb"] = peak["deployed_mb"]
    # Step 3. Ratios, table, CSV, chart.
    _ratios(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "models.csv", "w", newline="") as f:
        fields = ["model", "batch", "threads", "column", "ms", "torch/this", "peak_mb"]
        fields += ["deployed_mb", "library_ms", "tvm_ms", "torch/library"]
        fields += ["ort_gemm_ms", "ort_rest_ms"]
        fields += ["gemm_gflop", "peak_gflops", "floor_ms", "torch/floor"]
        fields += ["fma_gflops", "fma_ms", "torch/fma", "processes"]
        fields += ["tuning", "note"]
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    from report import machine

    print(
        f"machine: {machine()}; sequence {args.sequence}, {args.layers} layers; "
        f"GOMP_SPINCOUNT {_spin_note(args.gomp_spincount)}; ms, medians"
    )
    print(_table(rows, args.columns))
    for row in rows:
        said = "; ".join(part for part in (row.get("tuning"), row["note"]) if part)
        if said:
            print(f"- {row['model']} b{row['batch']} t{row['threads']} {row['column']}: {said}")
    chart = _chart(rows, args.columns, args.out / "models.png")
    if chart:
        print(f"chart: {chart}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
