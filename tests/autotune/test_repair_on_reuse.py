"""Options reused from the records of other shapes come back valid for the task: placed on
its loop nest by index name and repaired into its search space; records keep the tile
sizes by name and the definition they were tuned for, and older record files still load."""

import json

import numpy as np
import pytest

import polyfuse as pf
from polyfuse.autotune import records as db
from polyfuse.autotune.records import Record, Records
from polyfuse.autotune.space import SearchSpace
from polyfuse.autotune.task import Task
from polyfuse.scheduler.options import Fusion, MappingOptions

MM = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"
F32 = ("float32", "float32")
# tuned at 256 x 256 x 256: cache tiles larger than the small task's extents, 8 x 32
# register blocks, 16 lanes, 8 jammed rows
TUNED = MappingOptions(fusion=Fusion.MIN, reorder_reductions=True, tile_sizes=(64, 128, 64),
                       register_tile=(8, 32, 0), point_order=(2, 0, 1), vector_width=16, unroll=2,
                       unroll_jam=8)
STENCIL = "def f(float(N,W) I) -> (O) { O(n, j, w) +=! I(n, w + j + k) where j in 0:2, k in 0:3 }"


def mm(m, k, n, target="x86"):
    return Task(MM, "mm", ((m, k), (k, n)), F32, target)


def test_options_reused_at_smaller_shapes_are_repaired_and_compute_the_product(tmp_path):
    path = tmp_path / "r.jsonl"
    big, small = mm(256, 256, 256), mm(20, 12, 24)
    db.append(path, [Record.of(big, TUNED, [1e-3])])
    space = SearchSpace.of_target(small)
    assert space.violations(TUNED)   # as tuned, they do not fit the small task
    records = Records.open(path)
    assert records.options(big) == TUNED   # the exact workload: as tuned
    reused = records.options(small)
    assert space.violations(reused) == []
    sizes = dict(zip(space.nest.members, reused.tile_sizes))
    assert sizes == {"m": 20, "n": 24, "k": 12}   # cut to the extents
    assert reused.register_tile == (5, 0, 0)       # 5 rows divide 20; 24 columns are the whole tile
    assert reused.unroll_jam == 5 and 24 % reused.vector_width == 0 and reused.vector_width > 1
    assert reused.point_order == (2, 0, 1) and reused.fusion is Fusion.MIN

    mod = pf.define(MM, target="x86", tuning_records=path)
    a = np.random.default_rng(0).standard_normal((20, 12)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((12, 24)).astype(np.float32)
    spec = mod.mm.specialize(a, b)
    assert spec.stages["options"] == repr(reused)
    np.testing.assert_allclose(spec(a, b), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_options_map_by_index_name_onto_a_definition_of_the_same_family(tmp_path):
    two = Task(STENCIL, "f", ((8, 70),), ("float32",))
    one = Task(STENCIL.replace("0:2", "0:1"), "f", ((8, 70),), ("float32",))
    assert one.family_key == two.family_key and one.workload_key != two.workload_key
    tuned = MappingOptions(tile_sizes=(4, 2, 32, 0), point_order=(3, 0, 1, 2))   # n j w k; k n j w
    path = tmp_path / "r.jsonl"
    db.append(path, [Record.of(two, tuned, [1e-4])])
    reused = Records.open(path).options(one)   # members n, w, k: j has one value here
    assert reused.tile_sizes == (4, 32, 0) and reused.point_order == (2, 0, 1)
    x = np.random.default_rng(2).standard_normal((8, 70)).astype(np.float32)
    got = pf.define(one.source, target="x86", tuning_records=path).f(x)
    want = sum(x[:, k:k + 68] for k in range(3))[:, None, :]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.unit
def test_records_store_named_options_and_the_definition_they_replay():
    t = mm(48, 40, 24)
    record = Record.of(t, TUNED, [1e-4])
    line = record.to_json()
    assert line["named_options"]["tile_sizes"] == {"m": 64, "n": 128, "k": 64}
    assert line["named_options"]["point_order"] == ["k", "m", "n"]
    assert line["definition"] == str(t.definition)
    back = Record.from_json(json.loads(json.dumps(line)))
    assert back == record and back.named == record.named
    replay = back.task()
    assert replay.workload_key == t.workload_key and replay.sizes == {"M": 48, "K": 40, "N": 24}


@pytest.mark.unit
def test_a_record_of_an_older_file_still_loads_and_is_repaired_by_position(tmp_path):
    old = {"schema": 1, "version": "0.1.0", "target": "x86", "workload_key": mm(64, 64, 64).workload_key,
           "family_key": mm(64, 64, 64).family_key, "entry": "mm", "name": "mm",
           "shapes": [[64, 64], [64, 64]], "dtypes": ["float32", "float32"],
           "options": TUNED.to_json(), "costs": [1e-3], "error": "none", "message": "",
           "timestamp": 1.7e9, "chosen": False}
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(old) + "\n")
    [record] = db.load(path)
    assert record.options == TUNED and record.named is None and record.definition == ""
    records = Records([record])
    assert records.options(mm(64, 64, 64)) == TUNED
    small = mm(20, 12, 24)
    assert records.options(small) == SearchSpace.of_target(small).repair(TUNED)
    assert records.options(small).tile_sizes == (20, 24, 12)
    with pytest.raises(pf.ArgumentError, match="no definition text"):
        record.task()
