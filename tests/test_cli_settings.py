"""The command line refuses garbage settings with one 'polyfuse: error:' line that says
what is allowed, and reads records files with garbage in them."""

import json

import numpy as np
import pytest

from polyfuse import cli
from polyfuse.autotune import records as db
from polyfuse.autotune.records import Record, RecordsWarning
from polyfuse.autotune.task import Task
from polyfuse.scheduler.options import MappingOptions

pytestmark = pytest.mark.unit

AX = "def ax(float a, float(N) X) -> (Y) { Y(i) = a * X(i) }\n"


def error_of(argv, capsys):
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("polyfuse: error: ") and err.count("\n") == 1, err
    return err


@pytest.fixture
def tc(tmp_path):
    path = tmp_path / "ax.tc"
    path.write_text(AX)
    return path


@pytest.mark.parametrize("flags, words", [
    (["--trials", "-1"], ["trials must be an integer >= 1", "-1"]),
    (["--timeout", "nan"], ["timeout must be a number >= 0.001 (seconds)", "nan"]),
    (["--jobs", "-2"], ["jobs must be an integer >= 0 (0: all cores)"]),
    (["--repeat", "0"], ["repeat must be an integer >= 1"]),
    (["--seed", "-5"], ["seed must be an integer >= 0"]),
])
def test_tune_refuses_bad_numbers(tmp_path, capsys, flags, words):
    path = tmp_path / "sq.tc"
    path.write_text("def sq(float(N) X) -> (Y) { Y(i) = X(i) * X(i) }\n")
    err = error_of(["tune", str(path), "--input-shapes", "X:[8]", "-o", str(tmp_path / "r.jsonl"),
                    *flags], capsys)
    for w in words:
        assert w in err
    assert not (tmp_path / "r.jsonl").exists()


def test_run_refuses_a_negative_repeat_and_a_scalar_given_as_an_array(tmp_path, tc, capsys):
    feeds = tmp_path / "in.npz"
    np.savez(feeds, a=np.ones(3, np.float32), X=np.ones(4, np.float32))
    assert "'a' is a scalar parameter; give it as a 0-d array" in error_of(
        ["run", str(tc), "--inputs", str(feeds), "--target", "reference"], capsys)
    assert "--repeat is a number of timed runs (>= 0), got -2" in error_of(
        ["run", str(tc), "--inputs", str(feeds), "--repeat", "-2"], capsys)
    np.savez(feeds, a=np.float32(3), X=np.arange(4, dtype=np.float32))
    out = tmp_path / "out.npz"
    assert cli.main(["run", str(tc), "--inputs", str(feeds), "--target", "reference",
                     "--outputs", str(out)]) == 0
    with np.load(out) as f:
        np.testing.assert_array_equal(f["Y"], 3 * np.arange(4, dtype=np.float32))


def test_records_of_a_directory_or_a_missing_file(tmp_path, capsys):
    assert "no records file" in error_of(["records", "show", str(tmp_path / "none.jsonl")], capsys)
    assert "(it is a directory)" in error_of(["records", "show", str(tmp_path)], capsys)


def test_records_with_garbage_lines_still_show_and_distill(tmp_path, capsys):
    task = Task("def sq(float(N) X) -> (Y) { Y(i) = X(i) * X(i) }", "sq", ((8,),), ("float32",))
    path = tmp_path / "r.jsonl"
    db.append(path, [Record.of(task, MappingOptions(unroll=2), [1e-4])])
    with open(path, "a") as f:
        f.write("{truncated\n" + json.dumps({"schema": 1, "costs": "x"}) + "\n\x00\x01\n")
    with pytest.warns(RecordsWarning, match="skipped 3 lines"):
        assert cli.main(["records", "distill", str(path), "-o", str(tmp_path / "d.jsonl")]) == 0
    [best] = db.load(tmp_path / "d.jsonl")
    assert best.options == MappingOptions(unroll=2)
