"""Tuning settings refuse bad values with an OptionError that names the setting, the
value and what is allowed."""

import pytest

import polyfuse as pf
from polyfuse.autotune.measure import MeasureConfig
from polyfuse.autotune.records import Records
from polyfuse.autotune.task import Task
from polyfuse.autotune.tuner import TuneConfig, tune

pytestmark = pytest.mark.unit

SQ = "def sq(float(N) X) -> (Y) { Y(i) = X(i) * X(i) }"


@pytest.mark.parametrize("bad", [5, ["a.jsonl"], 2.0])
def test_tuning_records_of_the_wrong_type(bad):
    with pytest.raises(pf.OptionError, match="tuning_records must be the path of a records file"):
        pf.define(SQ, tuning_records=bad)


def test_tuning_records_that_are_a_directory(tmp_path):
    with pytest.raises(pf.ArgumentError, match="is a directory"):
        Records.open(tmp_path)


@pytest.mark.parametrize("bad, words", [
    ({"trials": -1}, ["trials", ">= 1"]), ({"trials": "8"}, ["trials", "str"]),
    ({"timeout": float("nan")}, ["timeout", "nan"]), ({"jobs": -2}, ["jobs", "0: all cores"]),
    ({"strategy": "annealing"}, ["annealing", "'genetic' or 'random'"]),
    ({"repeat": 0}, ["repeat"]), ({"batch": 1.5}, ["batch"]),
])
def test_tune_config_refuses_nonsense(bad, words):
    with pytest.raises(pf.OptionError) as err:
        TuneConfig(**bad)
    for w in words:
        assert w in str(err.value)


@pytest.mark.parametrize("bad", [{"number": "5"}, {"run_timeout": None}, {"rtol": -1.0},
                                 {"seed": -3}, {"jobs": 2.0}])
def test_measure_config_refuses_nonsense(bad):
    name = next(iter(bad))
    with pytest.raises(pf.OptionError, match=f"MeasureConfig: {name} must be"):
        MeasureConfig(**bad)


def test_tune_output_must_be_a_file_path(tmp_path):
    task = Task(SQ, "sq", ((8,),), ("float32",))
    with pytest.raises(pf.OptionError, match="is a directory; give the path of a records file"):
        tune(task, tmp_path)
    with pytest.raises(pf.OptionError, match="output is the path of the records file"):
        tune(task, 5)
    assert list(tmp_path.iterdir()) == []
