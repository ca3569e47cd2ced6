"""The records database: round trip, concurrent appends, corrupted lines, best and
nearest-shape picks, and compilation picking tuned options up."""

import json
import logging
import multiprocessing
import warnings
from dataclasses import replace

import numpy as np
import pytest

import polyfuse as pf
from polyfuse.autotune import records as db
from polyfuse.autotune.records import Record, Records, RecordsWarning
from polyfuse.autotune.task import Task
from polyfuse.scheduler.options import Fusion, MappingOptions

MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"


def task(m=64, k=32, n=16):
    return Task(MM, "mm", ((m, k), (k, n)), ("float32", "float32"))


def opts(tile):
    return MappingOptions(fusion=Fusion.MIN, tile_sizes=(tile, tile, 0), vector_width=8, unroll=2)


@pytest.mark.unit
def test_round_trip(tmp_path):
    path = tmp_path / "r.jsonl"
    rs = [Record.of(task(), opts(8), [1e-3, 2e-3, 3e-3]),
          Record.of(task(), opts(16), [], "timeout", "run took more than 10 s")]
    db.append(path, rs)
    back = db.load(path)
    assert back == rs
    assert back[0].cost == 1e-3 and back[0].ok   # the fastest repeat
    assert back[1].cost == np.inf and not back[1].ok
    line = json.loads(path.read_text().splitlines()[0])
    assert line["schema"] == db.SCHEMA_VERSION and line["version"] == pf.__version__
    assert line["target"] == "x86" and line["workload_key"] == task().workload_key
    assert line["options"]["tile_sizes"] == [8, 8, 0] and line["error"] == "none"


def _append_many(path, worker):
    for k in range(200):
        db.append(path, [Record.of(task(), opts(worker * 1000 + k), [1e-3])])


def test_two_processes_append_to_one_file(tmp_path):
    path = tmp_path / "r.jsonl"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append_many, args=(path, w)) for w in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # every line must be whole
        got = db.load(path)
    assert sorted(r.options.tile_sizes[0] for r in got) == sorted(
        w * 1000 + k for w in (1, 2) for k in range(200))


@pytest.mark.unit
def test_corrupted_and_foreign_lines_are_skipped_with_a_warning(tmp_path):
    path = tmp_path / "r.jsonl"
    db.append(path, [Record.of(task(), opts(8), [1e-3])])
    with open(path, "a") as f:
        f.write('{"schema": 1, "workload_key": "abc"\n')              # truncated
        f.write("not json at all\n")
        f.write(json.dumps({"schema": 99, "anything": 1}) + "\n")     # another schema
        f.write(json.dumps({"hello": "world"}) + "\n")                # foreign
    db.append(path, [Record.of(task(), opts(16), [2e-3])])
    with pytest.warns(RecordsWarning) as caught:
        got = db.load(path)
    assert len(caught) == 1   # one warning for the file, naming the lines
    assert f"{path}:2:" in str(caught[0].message) and "skipped 4 lines" in str(caught[0].message)
    assert [r.options.tile_sizes[0] for r in got] == [8, 16]


@pytest.mark.unit
def test_best_valid_record_wins():
    t = task()
    rs = Records([Record.of(t, opts(8), [3e-3]), Record.of(t, opts(16), [1e-3, 1e-3]),
                  Record.of(t, opts(32), [], "wrong_answer"), Record.of(t, opts(64), [0.5e-3], "runtime_error"),
                  Record.of(task(128), opts(4), [1e-4])])
    assert rs.options(t) == opts(16)


@pytest.mark.unit
def test_nearest_shapes_of_the_same_kernel(caplog):
    rs = Records([Record.of(task(64, 32, 16), opts(8), [1e-3]),
                  Record.of(task(1024, 1024, 1024), opts(64), [1e-1]),
                  Record.of(Task(MM.replace("mm", "other"), "other", ((900, 900), (900, 900)),
                                 ("float32", "float32")), opts(2), [1e-9])])
    with caplog.at_level(logging.DEBUG, logger="polyfuse.autotune"):
        assert rs.options(task(1000, 1000, 1000)) == opts(64)
    assert "reusing the options tuned for shapes [[1024, 1024], [1024, 1024]]" in caplog.text
    # repaired for the shapes it is reused at: no SIMD width of this machine but 1 or 2
    # divides the 30 steps of the innermost loop (k), where 8 lanes were tuned
    reused = rs.options(task(60, 30, 20))
    assert reused == replace(opts(8), vector_width=reused.vector_width) and reused.vector_width in (1, 2)
    other = Task(MM, "mm", ((64, 32), (32, 16)), ("float32", "float32"), target="aarch64")
    assert rs.options(other) is None


def test_define_and_compile_use_the_records(tmp_path):
    path = tmp_path / "r.jsonl"
    tuned = MappingOptions(fusion=Fusion.MIN, tile_sizes=(16, 16, 0), vector_width=4, unroll=3)
    t = task(48, 40, 24)
    db.append(path, [Record.of(t, tuned, [1e-4]), Record.of(t, opts(8), [2e-4])])
    mod = pf.define(MM, target="host", tuning_records=path)
    a = np.random.default_rng(0).standard_normal((48, 40)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((40, 24)).astype(np.float32)
    spec = mod.mm.specialize(a, b)
    assert spec.stages["options"] == repr(tuned)
    np.testing.assert_allclose(spec(a, b), a @ b, rtol=1e-4, atol=1e-4)
    # other shapes reuse the nearest tuned ones
    c = np.ones((50, 40), np.float32)
    assert mod.mm.specialize(c, b).stages["options"] == repr(tuned)


@pytest.mark.unit
def test_a_missing_records_file_is_an_error(tmp_path):
    with pytest.raises(pf.ArgumentError, match="no tuning records file"):
        pf.define(MM, target="host", tuning_records=tmp_path / "none.jsonl")


@pytest.mark.unit
def test_options_measured_again_count_with_their_median():
    t = task()
    lucky, steady = opts(8), opts(16)
    rs = Records([Record.of(t, lucky, [1e-3]), Record.of(t, lucky, [3e-3]), Record.of(t, lucky, [3e-3]),
                  Record.of(t, steady, [2e-3]), Record.of(t, steady, [2e-3])])
    assert rs.options(t) == steady


@pytest.mark.unit
def test_a_tuners_latest_choice_wins(tmp_path):
    t = task()
    path = tmp_path / "r.jsonl"
    db.append(path, [Record.of(t, opts(8), [1e-3]), Record.of(t, opts(16), [2e-3], chosen=True)])
    db.append(path, [Record.of(t, opts(32), [3e-3], chosen=True)])
    back = db.load(path)
    assert [r.chosen for r in back] == [False, True, True]
    assert Records(back).options(t) == opts(32)
