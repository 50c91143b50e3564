"""Loop nests that almost compute dense + bias + relu, for ``tir-byoc explain``.

Each PrimFunc has the forum's first layer (64x800 input, 500 outputs) with one thing
wrong, the kind of difference that makes a pattern matcher stay silent.  Try::

    tir-byoc scan examples/near_misses.py
    tir-byoc explain examples/near_misses.py
    tir-byoc explain examples/near_misses.py --func half_k
"""

from tvm.script import tirx as T


@T.prim_func(s_tir=True)
def bias_by_row(
    X: T.Buffer((64, 800), "float32"),
    W: T.Buffer((500, 800), "float32"),
    b: T.Buffer((500,), "float32"),
    Y: T.Buffer((64, 500), "float32"),
):
    C = T.sblock_alloc_buffer((64, 500))
    for i, j, k in T.grid(64, 500, 800):
        with T.sblock("dense"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + X[vi, vk] * W[vj, vk]
    for i, j in T.grid(64, 500):
        with T.sblock("T_add"):
            vi, vj = T.axis.remap("SS", [i, j])
            Y[vi, vj] = C[vi, vj] + b[vi]  # b[vj] would be a bias over the outputs


@T.prim_func(s_tir=True)
def init_one(
    X: T.Buffer((64, 800), "float32"),
    W: T.Buffer((500, 800), "float32"),
    b: T.Buffer((500,), "float32"),
    Y: T.Buffer((64, 500), "float32"),
):
    C = T.sblock_alloc_buffer((64, 500))
    for i, j, k in T.grid(64, 500, 800):
        with T.sblock("dense"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(1)
            C[vi, vj] = C[vi, vj] + X[vi, vk] * W[vj, vk]
    for i, j in T.grid(64, 500):
        with T.sblock("T_add"):
            vi, vj = T.axis.remap("SS", [i, j])
            Y[vi, vj] = C[vi, vj] + b[vj]


@T.prim_func(s_tir=True)
def half_k(
    X: T.Buffer((64, 800), "float32"),
    W: T.Buffer((500, 800), "float32"),
    Y: T.Buffer((64, 500), "float32"),
):
    for i, j, k in T.grid(64, 500, 400):
        with T.sblock("dense"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                Y[vi, vj] = T.float32(0)
            Y[vi, vj] = Y[vi, vj] + X[vi, vk] * W[vj, vk]


@T.prim_func(s_tir=True)
def leaky(
    X: T.Buffer((64, 800), "float32"),
    W: T.Buffer((500, 800), "float32"),
    Y: T.Buffer((64, 500), "float32"),
):
    C = T.sblock_alloc_buffer((64, 500))
    for i, j, k in T.grid(64, 500, 800):
        with T.sblock("dense"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                C[vi, vj] = T.float32(0)
            C[vi, vj] = C[vi, vj] + X[vi, vk] * W[vj, vk]
    for i, j in T.grid(64, 500):
        with T.sblock("leaky_relu"):
            vi, vj = T.axis.remap("SS", [i, j])
            # max(z, a z) is a leaky relu for 0 <= a <= 1; with a = 1.5 it is max(z, 1.5 z).
            Y[vi, vj] = T.max(C[vi, vj], C[vi, vj] * T.float32(1.5))


@T.prim_func(s_tir=True)
def split_k(
    X: T.Buffer((64, 800), "float32"),
    W: T.Buffer((500, 800), "float32"),
    Y: T.Buffer((64, 500), "float32"),
):
    for i, j, k0, k1 in T.grid(64, 500, 50, 16):
        with T.sblock("dense"):
            vi, vj = T.axis.remap("SS", [i, j])
            vk = T.axis.reduce(800, k0 * 16 + k1)
            with T.init():
                Y[vi, vj] = T.float32(0)
            Y[vi, vj] = Y[vi, vj] + X[vi, vk] * W[vj, vk]


@T.prim_func(s_tir=True)
def batched_first_weight_only(
    X: T.Buffer((4, 64, 800), "float32"),
    W: T.Buffer((4, 500, 800), "float32"),
    Y: T.Buffer((4, 64, 500), "float32"),
):
    for n, i, j, k in T.grid(4, 64, 500, 800):
        with T.sblock("bmm"):
            vn, vi, vj, vk = T.axis.remap("SSSR", [n, i, j, k])
            with T.init():
                Y[vn, vi, vj] = T.float32(0)
            Y[vn, vi, vj] = Y[vn, vi, vj] + X[vn, vi, vk] * W[0, vj, vk]


@T.prim_func(s_tir=True)
def fp16_dense(
    X: T.Buffer((64, 800), "float16"),
    W: T.Buffer((500, 800), "float16"),
    Y: T.Buffer((64, 500), "float32"),
):
    for i, j, k in T.grid(64, 500, 800):
        with T.sblock("dense"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                Y[vi, vj] = T.float32(0)
            Y[vi, vj] = Y[vi, vj] + T.Cast("float32", X[vi, vk]) * T.Cast("float32", W[vj, vk])
