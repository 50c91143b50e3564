"""TIR functions that tests in several folders use: the matcher's and the rewrite's baselines."""

from tvm.script import tirx as T


@T.prim_func(s_tir=True)
def dense_bias_relu_blocks(
    X: T.Buffer((8, 16), "float32"),
    W: T.Buffer((12, 16), "float32"),
    B: T.Buffer((12,), "float32"),
    Out: T.Buffer((8, 12), "float32"),
):
    Y = T.sblock_alloc_buffer((8, 12))
    Z = T.sblock_alloc_buffer((8, 12))
    for i, j, k in T.grid(8, 12, 16):
        with T.sblock("dense"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                Y[vi, vj] = T.float32(0)
            Y[vi, vj] = Y[vi, vj] + X[vi, vk] * W[vj, vk]
    for i, j in T.grid(8, 12):
        with T.sblock("bias"):
            vi, vj = T.axis.remap("SS", [i, j])
            Z[vi, vj] = Y[vi, vj] + B[vj]
    for i, j in T.grid(8, 12):
        with T.sblock("relu"):
            vi, vj = T.axis.remap("SS", [i, j])
            Out[vi, vj] = T.max(Z[vi, vj], T.float32(0))


@T.prim_func(s_tir=True)
def reordered_loops_and_operands(
    A: T.Buffer((6, 10), "float32"),
    Wt: T.Buffer((10, 4), "float32"),
    bias: T.Buffer((1, 4), "float32"),
    C: T.Buffer((6, 4), "float32"),
):
    acc = T.sblock_alloc_buffer((6, 4))
    for kk, jj, ii in T.grid(10, 4, 6):
        with T.sblock("mm"):
            r = T.axis.reduce(10, kk)
            col = T.axis.spatial(4, jj)
            row = T.axis.spatial(6, ii)
            with T.init():
                acc[row, col] = T.Cast("float32", 0)
            acc[row, col] = Wt[r, col] * A[row, r] + acc[row, col]
    for jj, ii in T.grid(4, 6):
        with T.sblock("epilogue"):
            col, row = T.axis.remap("SS", [jj, ii])
            C[row, col] = T.max(T.float32(0.0), bias[0, col] + acc[row, col])


@T.prim_func(s_tir=True)
def intermediate_read_after_chain(
    X: T.Buffer((6, 8), "float32"),
    W: T.Buffer((5, 8), "float32"),
    B: T.Buffer((5,), "float32"),
    Out: T.Buffer((6, 5), "float32"),
    Raw: T.Buffer((6, 5), "float32"),
):
    Y = T.sblock_alloc_buffer((6, 5))
    for i, j, k in T.grid(6, 5, 8):
        with T.sblock("dense"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                Y[vi, vj] = T.float32(0)
            Y[vi, vj] = Y[vi, vj] + X[vi, vk] * W[vj, vk]
    for i, j in T.grid(6, 5):
        with T.sblock("T_add"):
            vi, vj = T.axis.remap("SS", [i, j])
            Out[vi, vj] = Y[vi, vj] + B[vj]
    for i, j in T.grid(6, 5):
        with T.sblock("exp"):
            vi, vj = T.axis.remap("SS", [i, j])
            Raw[vi, vj] = T.exp(Y[vi, vj])


@T.prim_func(s_tir=True)
def dense_then_exp(
    X: T.Buffer((6, 8), "float32"), W: T.Buffer((5, 8), "float32"), Out: T.Buffer((6, 5), "float32")
):
    Y = T.sblock_alloc_buffer((6, 5))
    for i, j, k in T.grid(6, 5, 8):
        with T.sblock("dense"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                Y[vi, vj] = T.float32(0)
            Y[vi, vj] = Y[vi, vj] + X[vi, vk] * W[vj, vk]
    for i, j in T.grid(6, 5):
        with T.sblock("exp"):
            vi, vj = T.axis.remap("SS", [i, j])
            Out[vi, vj] = T.exp(Y[vi, vj])


@T.prim_func(s_tir=True)
def two_layers(
    X: T.Buffer((4, 6), "float32"),
    W1: T.Buffer((5, 6), "float32"),
    B1: T.Buffer((5,), "float32"),
    W2: T.Buffer((3, 5), "float32"),
    Out: T.Buffer((4, 3), "float32"),
):
    Y1 = T.sblock_alloc_buffer((4, 5))
    H = T.sblock_alloc_buffer((4, 5))
    for i, j, k in T.grid(4, 5, 6):
        with T.sblock("dense1"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                Y1[vi, vj] = T.float32(0)
            Y1[vi, vj] = Y1[vi, vj] + X[vi, vk] * W1[vj, vk]
    for i, j in T.grid(4, 5):
        with T.sblock("bias_relu1"):
            vi, vj = T.axis.remap("SS", [i, j])
            H[vi, vj] = T.max(Y1[vi, vj] + B1[vj], T.float32(0))
    for i, j, k in T.grid(4, 3, 5):
        with T.sblock("dense2"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                Out[vi, vj] = T.float32(0)
            Out[vi, vj] = Out[vi, vj] + H[vi, vk] * W2[vj, vk]
