"""Bring your own intrinsic, end to end: the forum MLP with its first layer on toy_cg_thflow.

Run ``python examples/toy_cg_thflow/run_mlp.py [--out DIR]``.  It registers the C kernel
(``toy_intrinsic.py``), lowers the MLP 64x800 -> Linear(500) -> ReLU -> Linear(10) with Relax,
offloads, builds, runs and compares with NumPy, exports one shared library, and runs that
library in a fresh Python process that never imports tir_byoc.  Exit status 0 means every
result agreed with NumPy and the toy kernel computed the first layer each time.
"""

from __future__ import annotations

import argparse
import ctypes
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import toy_intrinsic
import tvm
from tvm import relax
from tvm.relax.frontend import nn

import tir_byoc
from tir_byoc import toolchain
from tir_byoc.demo import MLP, default_schedule, mlp_reference, mlp_weights

BATCH, IN_FEATURES = 64, 800

# What the fresh process runs: TVM and NumPy only.
FRESH_PROCESS = """
import ctypes, sys
import numpy as np
import tvm
from tvm import relax
library, data = sys.argv[1], np.load(sys.argv[2])
vm = relax.VirtualMachine(tvm.runtime.load_module(library), tvm.cpu())
inputs = [tvm.runtime.tensor(data[name]) for name in ("x", "w1", "b1", "w2", "b2")]
result = vm["forward"](*inputs).numpy()
error = float(np.abs(result - data["expected"]).max())
calls = ctypes.CDLL(library).toy_cg_thflow_calls()
print(f"{error:.2e} {calls} {'tir_byoc' in sys.modules}")
"""


def lower_mlp(batch: int = BATCH) -> tvm.IRModule:
    """The MLP as Relax lowers it, keeping nn.Linear's (N, K) weights: dense patterns."""
    spec = {"forward": {"x": nn.spec.Tensor((batch, IN_FEATURES), "float32")}}
    mod, _ = MLP().export_tvm(spec=spec)
    return tvm.transform.Sequential(
        [
            relax.transform.FuseTransposeMatmul(),  # x @ W.T stays one dense, no transpose
            relax.transform.LegalizeOps(),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FuseOps(),
            relax.transform.FuseTIR(),
        ]
    )(mod)


def toy_calls() -> int:
    """How many times the toy kernel ran in this process."""
    library = ctypes.CDLL(str(toolchain.load_backend("toy_cg_thflow")))
    library.toy_cg_thflow_calls.restype = ctypes.c_int64
    return library.toy_cg_thflow_calls()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="directory for the exported library")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="toy_cg_thflow-"))
    print(f"registered {toy_intrinsic.INTRINSIC.name} from {toy_intrinsic.SOURCE.name}")

    # Step 1. Lower the model and see what tir_byoc would do with it.
    mod = lower_mlp()
    for match in tir_byoc.scan(mod):
        print(f"  {match.func}: {match.pattern} -> {match.intrinsic or match.reason}")

    # Step 2. Offload, schedule what is left, build and run in this process.
    target = tvm.target.Target("llvm")
    built = tvm.compile(default_schedule(tir_byoc.offload(mod), target), target=target)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, IN_FEATURES)).astype("float32")
    params = mlp_weights(rng)
    before = toy_calls()
    vm = relax.VirtualMachine(built, tvm.cpu())
    result = vm["forward"](*[tvm.runtime.tensor(a) for a in (x, *params)]).numpy()
    expected = mlp_reference(x, *params)
    error, calls = float(np.abs(result - expected).max()), toy_calls() - before
    print(f"built and ran here: max abs difference {error:.2e}, toy kernel calls {calls}")
    ok = error < 1e-4 and calls == 1

    # Step 3. Export one library with the intrinsics linked in; run it in a fresh process.
    library = tir_byoc.export_library(built, out / "mlp_toy_cg_thflow.so")
    data = out / "mlp_inputs.npz"
    names = ("x", "w1", "b1", "w2", "b2")
    np.savez(data, expected=expected, **dict(zip(names, (x, *params))))
    fresh = subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS, str(library), str(data)],
        capture_output=True,
        text=True,
        check=False,
    )
    if fresh.returncode != 0:
        print(f"the fresh process failed: {fresh.stderr.strip().splitlines()[-1:]}")
        return 1
    fresh_error, fresh_calls, imported = fresh.stdout.split()
    print(
        f"exported {library.name}; a fresh Python loaded it: max abs difference {fresh_error}, "
        f"toy kernel calls {fresh_calls}, tir_byoc imported: {imported}"
    )
    ok = ok and float(fresh_error) < 1e-4 and fresh_calls == "1" and imported == "False"
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
