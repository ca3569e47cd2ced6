"""A records file with garbage in it keeps working: bad lines are skipped with one
warning, and the good records still choose the options a kernel compiles with."""

import json
import warnings

import numpy as np
import pytest

import polyfuse as pf
from polyfuse.autotune import records as db
from polyfuse.autotune.records import Record, Records, RecordsWarning
from polyfuse.autotune.task import Task
from polyfuse.scheduler.options import MappingOptions

MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"
TASK = Task(MM, "mm", ((12, 8), (8, 6)), ("float32", "float32"), "x86")
TUNED = MappingOptions(tile_sizes=(4, 2, 8), unroll=2)


def good_line() -> dict:
    return Record.of(TASK, TUNED, [1e-4]).to_json()


def changed(**fields) -> str:
    return json.dumps({**good_line(), **fields}) + "\n"


GARBAGE = [
    "not json at all\n",
    json.dumps(good_line())[:70] + "\n",                       # truncated
    b"\x00\xff\xfe\x80 bytes that are not UTF-8 \x01\n",
    "[" * 50_000 + "\n",                                          # nesting past the JSON parser
    "null\n", "[1, 2, 3]\n", '"a string"\n',
    changed(costs="fast"), changed(costs=[None]), changed(shapes=[[12, 8.5], [8, 6]]),
    changed(shapes=7), changed(dtypes=[1, 2]), changed(chosen="false"), changed(timestamp="now"),
    changed(workload_key=None), changed(schema="1"),
    changed(options={"tile_sizes": [-4]}), changed(options={"fusion": "sideways"}),
    changed(options={"no_such_option": 1}), changed(options=[1]),
    json.dumps({k: v for k, v in good_line().items() if k != "target"}) + "\n",   # a field missing
]


def write(path, lines):
    path.write_bytes(b"".join(x if isinstance(x, bytes) else x.encode() for x in lines))


@pytest.mark.unit
def test_garbage_lines_are_skipped_with_one_warning(tmp_path):
    path = tmp_path / "tune.jsonl"
    write(path, GARBAGE[:3] + [json.dumps(good_line()) + "\n"] + GARBAGE[3:])
    with pytest.warns(RecordsWarning) as caught:
        got = db.load(path)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert f"skipped {len(GARBAGE)} lines" in message and f"{path}:1:" in message
    assert f"and {len(GARBAGE) - db.SKIPPED_SHOWN} more" in message
    assert [r.options for r in got] == [TUNED]


@pytest.mark.unit
def test_unknown_top_level_keys_are_ignored(tmp_path):
    path = tmp_path / "tune.jsonl"
    write(path, [changed(added_by_a_later_version={"x": 1})])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        [record] = db.load(path)
    assert record.options == TUNED


def test_good_records_still_apply_among_garbage(tmp_path):
    path = tmp_path / "tune.jsonl"
    write(path, GARBAGE[::2] + [json.dumps(good_line()) + "\n"] + GARBAGE[1::2])
    with pytest.warns(RecordsWarning):
        records = Records.open(path)
    assert records.options(TASK) == TUNED
    with pytest.warns(RecordsWarning):
        kernel = pf.define(MM, target="x86", tuning_records=path).mm
    a = np.random.default_rng(0).standard_normal((12, 8)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((8, 6)).astype(np.float32)
    spec = kernel.specialize(a, b)
    assert spec.stages["options"] == repr(TUNED)
    np.testing.assert_allclose(kernel(a, b), a @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.unit
def test_a_file_of_only_garbage_gives_no_records(tmp_path):
    path = tmp_path / "tune.jsonl"
    write(path, GARBAGE)
    with pytest.warns(RecordsWarning, match="the 0 valid records are used"):
        assert Records.open(path).options(TASK) is None
