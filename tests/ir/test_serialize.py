"""Records to JSON and back (polyfuse.ir.serialize): every field of every record, strictly."""

import dataclasses
import enum
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from polyfuse.errors import RecordError
from polyfuse.ir.loops import Packing
from polyfuse.ir.serialize import decode, encode, schema
from polyfuse.runtime.cuda import CudaLayout
from polyfuse.runtime.program import Layout
from polyfuse.targets.cuda import LaunchInfo

pytestmark = pytest.mark.unit


def through_json(kind, record):
    return decode(kind, json.loads(json.dumps(encode(record))))


names = st.text("abcXY_0123456789=[]", min_size=1, max_size=12)
shapes = st.lists(st.integers(0, 10_000), max_size=5).map(tuple)
dtypes = st.sampled_from(["float32", "bfloat16", "int64", "uint8", "bool"])
packings = st.integers(1, 4).flatmap(lambda rank: st.builds(
    Packing, names, st.lists(st.integers(-64, 64), min_size=rank, max_size=rank).map(tuple),
    st.lists(st.lists(st.integers(-512, 512), max_size=4).map(tuple), min_size=rank, max_size=rank).map(tuple),
    st.booleans()))
layouts = st.builds(
    Layout, names, st.lists(names, max_size=4).map(tuple),
    st.lists(st.tuples(names, shapes, dtypes, st.booleans()), max_size=3).map(tuple),
    st.booleans(), st.lists(names, max_size=2).map(tuple),
    st.lists(st.tuples(names, shapes, packings), max_size=3).map(tuple), st.lists(names, max_size=2).map(tuple))
cuda_layouts = st.builds(
    CudaLayout, names, st.lists(st.tuples(names, shapes, dtypes), max_size=3).map(tuple),
    st.lists(st.tuples(names, shapes, dtypes, st.booleans()), max_size=3).map(tuple),
    st.lists(st.tuples(names, dtypes), max_size=2).map(tuple), st.booleans(),
    st.lists(st.builds(LaunchInfo, names, st.integers(1, 2**31), st.tuples(*[st.integers(1, 1024)] * 3)),
             max_size=3).map(tuple))


@given(layouts)
def test_every_cpu_layout_round_trips(layout):
    assert through_json(Layout, layout) == layout


@given(cuda_layouts)
def test_every_cuda_layout_round_trips(layout):
    assert through_json(CudaLayout, layout) == layout


def test_a_padded_packing_stays_padded():
    packing = Packing("B", (0,), ((64, 1),), padded=True)
    assert through_json(Packing, packing).padded
    assert encode(packing) == {"source": "B", "offsets": [0], "coefs": [[64, 1]], "padded": True}


@pytest.mark.parametrize("damage", [
    lambda j: j.pop("padded"),                        # a field missing
    lambda j: j.update(extra=1),                      # a field unknown
    lambda j: j.update(padded=1),                     # an int for a bool
    lambda j: j.update(offsets=[0, 1.5]),             # a float for an int
    lambda j: j.update(offsets=0),                    # no list
    lambda j: j.update(coefs=[["1"]]),                # a str for an int
    lambda j: j.update(source=None),                  # None for a str
])
def test_a_damaged_record_is_refused(damage):
    j = encode(Packing("B", (0,), ((64, 1),), padded=True))
    damage(j)
    with pytest.raises(RecordError, match="Packing"):
        decode(Packing, j)


def test_fixed_tuples_optional_fields_and_enums():
    class Kind(enum.Enum):
        A = "a"
        B = "b"

    @dataclasses.dataclass(frozen=True)
    class R:
        kind: Kind
        block: tuple[int, int, int]
        scale: float
        note: str | None
        tags: dict[str, list[int]]

    r = R(Kind.B, (1, 2, 3), 0.5, None, {"x": [1, 2]})
    assert through_json(R, r) == r
    assert through_json(R, dataclasses.replace(r, note="n", scale=2.0)).note == "n"
    with pytest.raises(RecordError, match="3 values expected"):
        decode(R, {**encode(r), "block": [1, 2]})
    with pytest.raises(RecordError, match="no Kind"):
        decode(R, {**encode(r), "kind": "c"})
    with pytest.raises(RecordError, match="does not save"):
        encode(R(Kind.A, (1, 2, 3), 1.0, None, {"x": [object()]}))   # type: ignore[list-item]


def test_the_schema_follows_the_fields():
    @dataclasses.dataclass(frozen=True)
    class Inner:
        a: int

    def outer(inner_type):
        @dataclasses.dataclass(frozen=True)
        class Outer:
            items: tuple[inner_type, ...]
        return Outer

    @dataclasses.dataclass(frozen=True)
    class Inner2:   # noqa: F811 - the same record with one field more
        a: int
        b: bool = False
    Inner2.__qualname__ = Inner.__qualname__
    assert schema(outer(Inner)) == schema(outer(Inner))
    assert schema(outer(Inner)) != schema(outer(Inner2))   # a field added in a nested record
    assert schema(Layout) != schema(CudaLayout)
