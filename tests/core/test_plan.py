"""The plan: one scan per PrimFunc per call, whichever view reads it.

Every entry point is a view of one :class:`tir_byoc.Plan`; these tests count the matcher's
scans (as inductor's tests count what fired) so that a driver that scans again is caught.
"""

import collections
from pathlib import Path

import pytest
import tvm
from support.tir_programs import (
    dense_bias_relu_blocks,
    dense_then_exp,
    intermediate_read_after_chain,
)

import tir_byoc
from tir_byoc import cli, planning
from tir_byoc.demo import lowered_mlp

MLP = Path(__file__).resolve().parents[2] / "examples" / "mlp_lowered.py"

pytestmark = pytest.mark.usefixtures("reference_backend")


@pytest.fixture
def scans(monkeypatch):
    """How many times each function name was scanned since the test started."""
    counts = collections.Counter()
    real = planning.scan_function

    def counting(name, func):
        counts[name] += 1
        return real(name, func)

    monkeypatch.setattr(planning, "scan_function", counting)
    return counts


def _module():
    return tvm.IRModule(
        {
            "chain": dense_bias_relu_blocks.with_attr("global_symbol", "chain"),
            "shared": intermediate_read_after_chain.with_attr("global_symbol", "shared"),
        }
    )


@pytest.mark.parametrize(
    "call",
    [
        lambda mod: tir_byoc.scan(mod),
        lambda mod: tir_byoc.explain(mod),
        lambda mod: tir_byoc.offload(mod),
        lambda mod: tir_byoc.Offload()(mod),
        lambda mod: tir_byoc.plan(mod).rejections,
    ],
    ids=["scan", "explain", "offload", "Offload", "plan"],
)
def test_each_entry_point_scans_each_function_once(scans, call):
    call(_module())
    assert scans == {"chain": 1, "shared": 1}


def test_a_relax_module_is_scanned_once_although_its_transposes_are_folded(scans):
    mod = lowered_mlp()
    offloaded = tir_byoc.offload(mod)
    prim_funcs = [g.name_hint for g, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert set(scans) <= set(prim_funcs) and set(scans.values()) == {1}
    assert "transpose" not in offloaded["forward"].script()  # the fold happened


@pytest.mark.parametrize("command", ["scan", "explain"])
def test_a_cli_command_scans_each_function_once(scans, capsys, command):
    assert cli.main([command, str(MLP)]) == 0
    capsys.readouterr()
    assert scans and set(scans.values()) == {1}


def test_the_cli_offload_scans_each_function_once(scans, capsys, tmp_path):
    assert cli.main(["offload", str(MLP), "-o", str(tmp_path / "out.py")]) == 0
    capsys.readouterr()
    assert scans and set(scans.values()) == {1}


def test_a_plan_keeps_the_scan_and_the_choice_apart():
    planned = tir_byoc.plan(_module())
    chain, shared = planned.functions
    assert [f.gvar.name_hint for f in planned.functions] == ["chain", "shared"]
    (choice,) = chain.choices
    assert choice.match is chain.scan.matches[0]
    assert (choice.intrinsic, choice.reason) == ("ref.dense_bias_relu", None)
    # A Choice reads as its match.
    assert choice.pattern == choice.match.pattern == "dense_bias_relu"
    assert planned.rejections == list(shared.scan.rejections) and planned.rejections
    assert planned.backends == {"ref"}
    with pytest.raises(AttributeError):
        choice.no_such_field


def test_the_meta_schedule_rule_scans_a_function_once_for_all_its_blocks(scans):
    from tir_byoc.meta_schedule import OffloadPostproc, OffloadRule

    # exp follows the chain but is not part of it: the rule visits it first, then the chain.
    func = dense_then_exp.with_attr("global_symbol", "main")
    sch = tvm.s_tir.Schedule(func)
    rule = OffloadRule(offload="always")
    for name in ("exp", "dense"):
        (sch,) = rule.apply(sch, sch.get_sblock(name))
    assert scans == {"main": 1}
    scans.clear()
    assert OffloadPostproc().apply(sch)
    assert scans == {"main": 1}


def test_explain_reads_only_the_scan_so_it_chooses_nothing(monkeypatch):
    # A view of refusals neither resolves the backend order nor asks what is available.
    monkeypatch.setenv("TIR_BYOC_BACKENDS", "no_such_backend")
    chosen = []
    real = planning.choose
    monkeypatch.setattr(planning, "choose", lambda *a, **k: chosen.append(a) or real(*a, **k))
    assert tir_byoc.explain(_module()) == tir_byoc.plan(_module()).rejections
    assert chosen == []
    with pytest.raises(ValueError, match=r"\$TIR_BYOC_BACKENDS: expected backend names"):
        tir_byoc.scan(_module())


def test_a_plan_is_a_view_and_the_offload_plans_the_module_it_folds():
    from tir_byoc.offload import offload_plan

    mod = lowered_mlp()
    planned = tir_byoc.plan(mod)
    assert planned.module.same_as(mod) and planned.declines == ()  # nothing rewritten
    assert sorted(c.pattern for c in planned.choices) == ["matmul_bias", "matmul_bias_relu"]
    # What scan, explain and offload read: the plan of the module with the copies folded.
    folded = offload_plan(mod)
    assert not folded.module.same_as(mod)
    assert [c.pattern for c in folded.choices] == [c.pattern for c in tir_byoc.scan(mod)]
    assert sorted(c.pattern for c in folded.choices) == ["dense_bias", "dense_bias_relu"]
