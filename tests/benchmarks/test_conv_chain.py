"""benchmarks/conv_chain.py reads MobileNetV2's convolutions off the model as it runs them, and
refuses a selection of nothing in one line."""

import itertools

import pytest
from support.benchmark_modules import benchmark_modules


@pytest.fixture(scope="module")
def conv_chain():
    with benchmark_modules("conv_chain") as (module,):
        yield module


def test_the_chain_is_mobilenet_v2s_convolutions_in_the_order_they_run(conv_chain):
    pytest.importorskip("transformers")
    layers = conv_chain.mobilenet_v2_layers()
    # The stem (3 x 3, then a depthwise and a 1 x 1), 16 inverted residual blocks of three
    # convolutions each, then the last 1 x 1: 52.
    assert len(layers) == 52
    first = layers[0]
    assert first[:9] == (3, 32, 1, 224, 224, 3, 2, 0, 1)  # TensorFlow's SAME at stride 2
    for before, after in itertools.pairwise(layers):
        o, _, h, _, k, s, pad_l, pad_r = before[1:9]
        # Each layer reads the one before: its channels and its output's size (square).
        assert after[0] == o
        assert after[3] == (h + pad_l + pad_r - k) // s + 1 and after[4] == after[3]
    depthwise = [row for row in layers if row[2] > 1]
    assert len(depthwise) == 17 and all(row[2] == row[0] == row[1] for row in depthwise)
    residuals = [(i, row[10]) for i, row in enumerate(layers) if row[10] >= 0]
    assert len(residuals) == 10
    for at, source in residuals:
        # The add reads the input of the block's expand layer, of the projection's shape.
        assert layers[source][5] == 1 and layers[source][2] == 1 and at == source + 2
        assert layers[source][0] == layers[at][1] and layers[source][3] == layers[at][3]
        assert layers[at][9] == 0  # a projection has no ReLU6
    assert sum(row[9] for row in layers) == 52 - 17  # ReLU6 on all but the projections


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--batches", "0"], "--batches and --threads take comma-separated counts"),
        (["--threads", "two"], "--batches and --threads take comma-separated counts"),
        (["--repeats", "0"], "--repeats 0 measures nothing; expected 1 or more"),
        (["--rounds", "-1"], "--rounds -1 measures nothing; expected 1 or more"),
    ],
    ids=["batch", "threads", "repeats", "rounds"],
)
def test_a_selection_of_nothing_is_one_line_and_status_2(conv_chain, capsys, argv, expected):
    with pytest.raises(SystemExit) as exited:
        conv_chain.main(argv)
    out, err = capsys.readouterr()
    assert exited.value.code == 2 and out == ""
    assert expected in err and "Traceback" not in err
    assert err.count("\n") == 1 and err.startswith("conv_chain.py: error:")


def test_the_in_model_table_sets_each_call_beside_its_layer(conv_chain, capsys):
    # Three layers: the model's calls take 1.1, 1.0 and 2.0 times the chain's steps.
    row = {
        "batch": 8,
        "separate_steps": [("a", 0.100), ("b", 0.200), ("c", 0.050)],
        "model": {"calls_us": [110.0, 200.0, 100.0], "run_ms": 0.5},
    }
    conv_chain.print_in_model([(2, row)])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == "| 2 | 8 | 0.35 | 0.41 | 1.171 | 2 | 2: 100 / 50 us | 0.50 |"


def test_a_model_whose_calls_are_not_its_layers_says_so(conv_chain, capsys):
    row = {"batch": 1, "separate_steps": [("a", 0.1)], "model": {"calls_us": [], "run_ms": 1.0}}
    conv_chain.print_in_model([(1, row)])
    assert capsys.readouterr().out.strip().endswith("| 1 | 1 | 1 layers, 0 calls |")
