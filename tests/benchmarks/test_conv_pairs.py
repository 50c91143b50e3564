"""benchmarks/conv_pairs.py: a selection of nothing is refused in one line, and a child's row
becomes the table's with the ratios."""

import pytest
from support.benchmark_modules import benchmark_modules


@pytest.fixture(scope="module")
def conv_pairs():
    with benchmark_modules("conv_pairs") as (module,):
        yield module


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--batches", "0"], "a batch or thread count below 1; expected 1 or more"),
        (["--threads", "two"], "--threads two: expected comma-separated integers"),
        (["--repeats", "0"], "--repeats 0 measures nothing; expected 1 or more"),
        (["--rounds", "-1"], "--rounds -1 measures nothing; expected 1 or more"),
    ],
    ids=["batch", "threads", "repeats", "rounds"],
)
def test_a_selection_of_nothing_is_one_line_and_status_2(conv_pairs, capsys, argv, expected):
    with pytest.raises(SystemExit) as exited:
        conv_pairs.main(argv)
    out, err = capsys.readouterr()
    assert exited.value.code == 2 and out == ""
    assert expected in err and "Traceback" not in err
    assert err.count("\n") == 1 and err.startswith("conv_pairs.py: error:")


def test_a_row_holds_the_medians_and_their_ratios(conv_pairs):
    row = {"batch": 8, "pairs": 5, "paired": 90.0, "separate": 120.0, "onnxruntime": 100.0}
    assert conv_pairs.table_row(2, row) == "| 2 | 8 | 5 | 90.00 | 120.00 | 0.750 | 100.00 | 0.900 |"
