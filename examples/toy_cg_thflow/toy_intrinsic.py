"""Register the toy_cg_thflow kernel with tir_byoc: the few lines a user writes.

Importing this module makes tir_byoc offload every float32 dense + bias + relu chain to
``toy_cg_thflow_dense_bias_relu`` (toy_cg_thflow.c).  On the command line::

    tir-byoc --plugin examples/toy_cg_thflow/toy_intrinsic.py intrinsics
"""

from pathlib import Path

import tir_byoc

SOURCE = Path(__file__).resolve().parent / "toy_cg_thflow.c"

INTRINSIC = tir_byoc.register_intrinsic(
    "toy_cg_thflow.dense_bias_relu",  # <backend>.<variant>: the backend is toy_cg_thflow
    pattern="dense_bias_relu",  # Y = relu(X @ W.T + b), W stored (N, K)
    extern_symbol="toy_cg_thflow_dense_bias_relu",
    source=SOURCE,
    dtypes=["float32"],
    priority=1000,  # preferred over the bundled backends (oneDNN 200, OpenBLAS 100, ref 0)
)
