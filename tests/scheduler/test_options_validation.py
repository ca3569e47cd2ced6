"""Mapping options and the thread pool's size refuse bad values with an OptionError that names
the field, the value and what is allowed; the obvious spellings are converted."""

import json

import numpy as np
import pytest

import polyfuse as pf
from polyfuse.runtime import native
from polyfuse.scheduler.options import Fusion, MappingOptions

SQ = "def sq(float(N) X) -> (Y) { Y(i) = X(i) * X(i) }"


@pytest.mark.unit
@pytest.mark.parametrize("bad, words", [
    ({"tile_sizes": (32, -1)}, ["tile_sizes[1]", "-1", "from 0 to"]),
    ({"register_tile": (-4,)}, ["register_tile[0]", "-4"]),
    ({"fusion": "bogus"}, ["fusion", "'bogus'", "'max'", "'min'"]),
    ({"intra_tile_fusion": 3}, ["intra_tile_fusion", "3"]),
    ({"unroll": "2"}, ["unroll", "'2'", "integer", "str"]),
    ({"vector_width": 4.0}, ["vector_width", "4.0", "float"]),
    ({"tile_sizes": None}, ["tile_sizes", "tuple of integers", "None"]),
    ({"tile_sizes": "32"}, ["tile_sizes", "tuple of integers"]),
    ({"tile_sizes": (8, 2.5)}, ["tile_sizes[1]", "2.5"]),
    ({"num_threads": None}, ["num_threads", "None"]),
    ({"num_threads": -1}, ["num_threads", "from 0 to 4096"]),
    ({"unroll": 10**9}, ["unroll", "from 1 to 64"]),
    ({"unroll_jam": 0}, ["unroll_jam", "from 1 to 64"]),
    ({"parallel": 2}, ["parallel", "from 0 to 1"]),
    ({"fix_sizes": 1}, ["fix_sizes", "True or False"]),
    ({"use_shared_memory": "yes"}, ["use_shared_memory", "True or False"]),
    ({"tile_order": (0, 0)}, ["tile_order", "permutation"]),
    ({"point_order": [2, 0]}, ["point_order", "permutation"]),
    ({"block": (64, 64)}, ["block", "1024"]),
    ({"grid": -1}, ["grid", "-1"]),
    ({"tile_sizes": (True,)}, ["tile_sizes[0]", "bool"]),
])
def test_bad_values_are_refused_naming_field_and_value(bad, words):
    with pytest.raises(pf.OptionError) as err:
        MappingOptions(**bad)
    for w in words:
        assert w in str(err.value)


@pytest.mark.unit
def test_obvious_spellings_are_converted():
    o = MappingOptions(fusion="MIN", intra_tile_fusion="preserve_coincident", tile_sizes=[32, 8],
                       register_tile=np.array([4, 2]).tolist(), unroll=np.int64(4),
                       fix_sizes=np.bool_(True))
    assert o == MappingOptions(fusion=Fusion.MIN, intra_tile_fusion=Fusion.PRESERVE,
                               tile_sizes=(32, 8), register_tile=(4, 2), unroll=4, fix_sizes=True)
    assert type(o.unroll) is int and type(o.fix_sizes) is bool
    hash(o)   # hashable: the tuner keys dicts by options


@pytest.mark.unit
def test_from_json_round_trips_and_refuses_bad_json():
    o = MappingOptions(fusion=Fusion.MIN, tile_sizes=(16, 4), unroll=2)
    assert MappingOptions.from_json(json.loads(json.dumps(o.to_json()))) == o
    with pytest.raises(pf.OptionError, match=r"unknown mapping options \['tile'\].*known: fusion"):
        MappingOptions.from_json({"tile": [1]})
    with pytest.raises(pf.OptionError, match="JSON object"):
        MappingOptions.from_json([1, 2])
    with pytest.raises(pf.OptionError, match="fix_sizes must be True or False"):
        MappingOptions.from_json({"fix_sizes": "false"})
    with pytest.raises(pf.OptionError, match="unroll must be an integer"):
        MappingOptions.from_json({"unroll": 2.5})


@pytest.mark.unit
@pytest.mark.parametrize("bad", [{"tile_sizes": (32,)}, "max", 4])
def test_entries_refuse_options_of_the_wrong_type(bad):
    with pytest.raises(pf.OptionError, match="options= takes a polyfuse.scheduler.options.MappingOptions"):
        pf.define(SQ, target="reference", options=bad)
    with pytest.raises(pf.OptionError, match=r"compile\(\): options="):
        pf.compile(b"not read: the options are checked first", options=bad)


@pytest.mark.unit
def test_dict_options_get_a_hint():
    with pytest.raises(pf.OptionError, match=r"MappingOptions\(\*\*options\)"):
        pf.define(SQ, options={"unroll": 2})


def test_good_options_still_compile_and_run():
    x = np.arange(19, dtype=np.float32)
    mod = pf.define(SQ, target="host", options=MappingOptions(tile_sizes=[8], unroll=2, fusion="min"))
    np.testing.assert_array_equal(mod.sq(x), x * x)


@pytest.mark.unit
@pytest.mark.parametrize("bad", [0, -1, 5000, "4", 2.0, True, 2**70])
def test_thread_pool_size_is_checked(bad):
    before = native.get_num_threads()
    with pytest.raises(pf.OptionError, match=r"set_num_threads\(\): the number of threads must "
                                             "be an integer from 1 to 4096"):
        native.set_num_threads(bad)
    assert native.get_num_threads() == before
