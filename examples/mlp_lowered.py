# The forum MLP, 64x800 -> Linear(500) -> ReLU -> Linear(10), as Relax lowers it:
# nn.Module.export_tvm, then LegalizeOps, AnnotateTIROpPattern, FuseOps and FuseTIR.
# Written from tir_byoc.demo.lowered_mlp() by tir_byoc.tvmscript.write; tests/cli/test_cli.py
# checks that it still equals what the demo lowers.
from __future__ import annotations

from tvm.script import ir as I
from tvm.script import tirx as T
from tvm.tirx.layout import Axis
from tvm.script import relax as R


@I.ir_module
class Module:
    @T.prim_func(private=True, s_tir=True)
    def fused_matmul1_add1(relu: T.Buffer((T.int64(64), T.int64(500)), "float32"), permute_dims1: T.Buffer((T.int64(500), T.int64(10)), "float32"), fc2_bias: T.Buffer((T.int64(10),), "float32"), T_add_intermediate: T.Buffer((T.int64(64), T.int64(10)), "float32")):
        T.func_attr({"tirx.noalias": True})
        # with T.sblock("root"):
        matmul_intermediate = T.sblock_alloc_buffer((T.int64(64), T.int64(10)))
        for i0, i1, k in T.grid(T.int64(64), T.int64(10), T.int64(500)):
            with T.sblock("matmul"):
                v_i0, v_i1, v_k = T.axis.remap("SSR", [i0, i1, k])
                T.reads(relu[v_i0, v_k], permute_dims1[v_k, v_i1])
                T.writes(matmul_intermediate[v_i0, v_i1])
                with T.init():
                    matmul_intermediate[v_i0, v_i1] = T.float32(0.0)
                matmul_intermediate[v_i0, v_i1] = matmul_intermediate[v_i0, v_i1] + relu[v_i0, v_k] * permute_dims1[v_k, v_i1]
        for ax0, ax1 in T.grid(T.int64(64), T.int64(10)):
            with T.sblock("T_add"):
                v_ax0, v_ax1 = T.axis.remap("SS", [ax0, ax1])
                T.reads(matmul_intermediate[v_ax0, v_ax1], fc2_bias[v_ax1])
                T.writes(T_add_intermediate[v_ax0, v_ax1])
                T_add_intermediate[v_ax0, v_ax1] = matmul_intermediate[v_ax0, v_ax1] + fc2_bias[v_ax1]

    @T.prim_func(private=True, s_tir=True)
    def fused_matmul_add_relu(x: T.Buffer((T.int64(64), T.int64(800)), "float32"), permute_dims: T.Buffer((T.int64(800), T.int64(500)), "float32"), fc1_bias: T.Buffer((T.int64(500),), "float32"), compute_intermediate: T.Buffer((T.int64(64), T.int64(500)), "float32")):
        T.func_attr({"tirx.noalias": True})
        # with T.sblock("root"):
        matmul_intermediate = T.sblock_alloc_buffer((T.int64(64), T.int64(500)))
        T_add_intermediate = T.sblock_alloc_buffer((T.int64(64), T.int64(500)))
        for i0, i1, k in T.grid(T.int64(64), T.int64(500), T.int64(800)):
            with T.sblock("matmul"):
                v_i0, v_i1, v_k = T.axis.remap("SSR", [i0, i1, k])
                T.reads(x[v_i0, v_k], permute_dims[v_k, v_i1])
                T.writes(matmul_intermediate[v_i0, v_i1])
                with T.init():
                    matmul_intermediate[v_i0, v_i1] = T.float32(0.0)
                matmul_intermediate[v_i0, v_i1] = matmul_intermediate[v_i0, v_i1] + x[v_i0, v_k] * permute_dims[v_k, v_i1]
        for ax0, ax1 in T.grid(T.int64(64), T.int64(500)):
            with T.sblock("T_add"):
                v_ax0, v_ax1 = T.axis.remap("SS", [ax0, ax1])
                T.reads(matmul_intermediate[v_ax0, v_ax1], fc1_bias[v_ax1])
                T.writes(T_add_intermediate[v_ax0, v_ax1])
                T_add_intermediate[v_ax0, v_ax1] = matmul_intermediate[v_ax0, v_ax1] + fc1_bias[v_ax1]
        for i0, i1 in T.grid(T.int64(64), T.int64(500)):
            with T.sblock("compute"):
                v_i0, v_i1 = T.axis.remap("SS", [i0, i1])
                T.reads(T_add_intermediate[v_i0, v_i1])
                T.writes(compute_intermediate[v_i0, v_i1])
                compute_intermediate[v_i0, v_i1] = T.max(T_add_intermediate[v_i0, v_i1], T.float32(0.0))

    @T.prim_func(private=True, s_tir=True)
    def transpose(fc1_weight: T.Buffer((T.int64(500), T.int64(800)), "float32"), T_transpose: T.Buffer((T.int64(800), T.int64(500)), "float32")):
        T.func_attr({"op_pattern": 2, "tirx.noalias": True})
        # with T.sblock("root"):
        for ax0, ax1 in T.grid(T.int64(800), T.int64(500)):
            with T.sblock("T_transpose"):
                v_ax0, v_ax1 = T.axis.remap("SS", [ax0, ax1])
                T.reads(fc1_weight[v_ax1, v_ax0])
                T.writes(T_transpose[v_ax0, v_ax1])
                T_transpose[v_ax0, v_ax1] = fc1_weight[v_ax1, v_ax0]

    @T.prim_func(private=True, s_tir=True)
    def transpose1(fc2_weight: T.Buffer((T.int64(10), T.int64(500)), "float32"), T_transpose: T.Buffer((T.int64(500), T.int64(10)), "float32")):
        T.func_attr({"op_pattern": 2, "tirx.noalias": True})
        # with T.sblock("root"):
        for ax0, ax1 in T.grid(T.int64(500), T.int64(10)):
            with T.sblock("T_transpose"):
                v_ax0, v_ax1 = T.axis.remap("SS", [ax0, ax1])
                T.reads(fc2_weight[v_ax1, v_ax0])
                T.writes(T_transpose[v_ax0, v_ax1])
                T_transpose[v_ax0, v_ax1] = fc2_weight[v_ax1, v_ax0]

    @R.function
    def forward(x: R.Tensor((64, 800), dtype="float32"), fc1_weight: R.Tensor((500, 800), dtype="float32"), fc1_bias: R.Tensor((500,), dtype="float32"), fc2_weight: R.Tensor((10, 500), dtype="float32"), fc2_bias: R.Tensor((10,), dtype="float32")) -> R.Tensor((64, 10), dtype="float32"):
        R.func_attr({"num_input": 1})
        cls = Module
        with R.dataflow():
            permute_dims = R.call_tir(cls.transpose, (fc1_weight,), out_ty=R.Tensor((800, 500), dtype="float32"))
            lv = R.call_tir(cls.fused_matmul_add_relu, (x, permute_dims, fc1_bias), out_ty=R.Tensor((64, 500), dtype="float32"))
            permute_dims1 = R.call_tir(cls.transpose1, (fc2_weight,), out_ty=R.Tensor((500, 10), dtype="float32"))
            gv = R.call_tir(cls.fused_matmul1_add1, (lv, permute_dims1, fc2_bias), out_ty=R.Tensor((64, 10), dtype="float32"))
            R.output(gv)
        return gv
