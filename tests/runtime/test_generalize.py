"""Kernel texts generalized over the sizes two plans change (polyfuse.runtime.generalize):
which integers become sizes, what a template matches, and that its text at the matched
sizes is exactly the text it matched (so its kernel computes the same thing)."""

import re

import pytest

import polyfuse as pf
from polyfuse.frontends.tc import parse_definition
from polyfuse.runtime.generalize import Generalizer, Text, generalize

pytestmark = pytest.mark.unit


def gather(batch: int, seq: int) -> str:
    """A Gather of a flattened (batch * seq) table, as the ONNX lowering writes it."""
    return (f"def k(bool({batch * seq}, 1) X, int64({batch}, 1, 1, {seq}) I) -> (bool({batch}, 1, 1, {seq}, 1) Y) {{\n"
            f"  Y(i0, i1, i2, i3, i4) = X((I(i0, i1, i2, i3) < 0 ? I(i0, i1, i2, i3) + {batch * seq} : "
            f"I(i0, i1, i2, i3)), i4) where i0 in 0:{batch}, i1 in 0:1, i2 in 0:1, i3 in 0:{seq}, i4 in 0:1\n}}")


def dense(rows: int, width: int, scale: float = 0.5) -> str:
    return (f"def fused(float32({rows}, 768) A, float32(768, {width}) B) -> (float32({rows}, {width}) Y, "
            f"float32({rows}, {width}) T) {{\n"
            f"  T(m, n) +=! A(m, k) * B(k, n) where m in 0:{rows}, n in 0:{width}, k in 0:768\n"
            f"  Y(m, n) = T(m, n) * {scale} where m in 0:{rows}, n in 0:{width}\n}}")


def sized(template_source: str, sizes: dict[str, int]) -> str:
    """The template's text with its sizes' values written in (expressions evaluated)."""
    def value(m: re.Match) -> str:
        return str(eval(m.group(0), {}, dict(sizes)))   # noqa: S307 (sizes and integers only)
    return re.sub(r"\([^(){}:]*S\d+[^(){}:,]*\)|\bS\d+\b", value, template_source)


def test_integers_that_differ_become_one_size_per_pair_of_values():
    t = generalize([Text.of(gather(1, 7)), Text.of(gather(2, 33))])
    assert t is not None and t.names == ("S0", "S1", "S2")
    # 7 -> 66 is the table's rows (declared by X); 1 -> 2 the batch; 7 -> 33 the sequence
    assert "bool(S0, 1) X" in t.source and "int64(S1, 1, 1, S2) I" in t.source and "+ S0 :" in t.source
    assert "i0 in 0:S1" in t.source and "i3 in 0:S2" in t.source and "i1 in 0:1" in t.source
    parse_definition(t.source)   # a TC definition with sizes
    for batch, seq in ((1, 7), (2, 33), (3, 40), (8, 1)):
        sizes = t.match(Text.of(gather(batch, seq)))
        assert sizes == {"S0": batch * seq, "S1": batch, "S2": seq}
        assert sized(t.source, sizes) == gather(batch, seq)


def test_a_size_no_input_declares_is_an_expression_of_those_that_are():
    first = dense(7, 768).replace("where m in 0:7, n", "where m in 0:14, n", 1)
    second = dense(33, 768).replace("where m in 0:33, n", "where m in 0:66, n", 1)
    t = generalize([Text.of(first), Text.of(second)])
    assert t is not None and "m in 0:(2 * S0)" in t.source
    third = dense(50, 768).replace("where m in 0:50, n", "where m in 0:100, n", 1)
    assert t.match(Text.of(third)) == {"S0": 50}
    assert t.match(Text.of(third.replace("0:100", "0:101"))) is None   # 2 * S0 checked, not assumed


@pytest.mark.parametrize("other", [
    dense(40, 3072),              # a constant of the template (the width) differs
    dense(40, 768, scale=0.25),   # a float: part of the skeleton
    dense(40, 768).replace("Y(m, n) = T(m, n)", "Y(n, m) = T(m, n)"),
])
def test_a_text_matches_only_with_the_template_s_constants_and_skeleton(other):
    t = generalize([Text.of(dense(7, 768)), Text.of(dense(33, 768))])
    assert t is not None and t.match(Text.of(dense(40, 768))) == {"S0": 40}
    assert t.match(Text.of(other)) is None


def test_one_size_must_have_one_value_in_a_match():
    t = generalize([Text.of(dense(7, 768)), Text.of(dense(33, 768))])
    assert t is not None
    assert t.match(Text.of(dense(40, 768).replace("float32(40, 768) T", "float32(41, 768) T"))) is None


def test_texts_that_differ_in_a_float_or_not_at_all_have_no_template():
    assert generalize([Text.of(dense(7, 768, 0.5)), Text.of(dense(33, 768, 0.25))]) is None
    assert generalize([Text.of(dense(7, 768)), Text.of(dense(7, 768))]) is None


def test_an_integer_no_size_gives_is_a_size_the_caller_gives():
    """3 -> 5 where the rows go 7 -> 33: no expression of the inputs' sizes, so a size of
    its own (a Range's start, say), bound by a match and given by the caller."""
    def ranged(rows, start):
        return (f"def k(float32({rows}) X) -> (float32({rows}) Y) {{\n"
                f"  Y(i) = X(i) + float32(int64(i) + int64({start})) where i in 0:{rows}\n}}")
    t = generalize([Text.of(ranged(7, 3)), Text.of(ranged(33, 5))])
    assert t is not None and t.names == ("S0", "S1") and "int64(S1)" in t.source
    assert t.match(Text.of(ranged(40, 9))) == {"S0": 40, "S1": 9}
    d = parse_definition(t.source, t.names)
    assert d.sizes == ("S0", "S1")
    with pytest.raises(pf.errors.TCSemanticError):
        parse_definition(t.source)   # only a caller that gives S1 may parse it


def test_three_texts_fit_sums_and_check_the_fits():
    """With a third text, a + b * S0 + c * S1 is determined: the total of two lengths
    (an output of S0 + S1 rows) fits, and a wrong two-text fit is refused."""
    def concat(n, m):
        return (f"def k(float32({n}, 4) A, float32({m}, 4) B) -> (float32({n + m}, 4) Y) {{\n"
                f"  Y(i, j) = A(i, j) where i in 0:{n}, j in 0:4\n"
                f"  Y(i + {n}, j) = B(i, j) where i in 0:{m}, j in 0:4\n}}")
    texts = [Text.of(concat(n, m)) for n, m in ((5, 3), (2, 9), (7, 7))]
    t = generalize(texts)
    assert t is not None and "float32((S0 + S1), 4) Y" in t.source
    assert t.match(Text.of(concat(11, 4))) == {"S0": 11, "S1": 4}
    squares = [Text.of(dense(n, 768).replace("n in 0:768\n", f"n in 0:{n * n}\n", 1)) for n in (7, 100, 128)]
    t = generalize(squares)   # 49, 10000 fit 107 * S0 - 700 too; 16384 does not
    assert t is None or "S0 * S0" in t.source


def test_size_names_avoid_the_text_s_names():
    text = dense(7, 768).replace("A", "S0")
    t = generalize([Text.of(text), Text.of(dense(33, 768).replace("A", "S0"))])
    assert t is not None and t.names == ("S0_",)
    parse_definition(t.source)


def test_a_generalizer_generalizes_across_plans_only_and_keeps_constants():
    g = Generalizer(parse_definition)
    assert g.find(dense(7, 768)) is None and g.find(dense(7, 3072)) is None   # one plan's two widths
    g.remember([dense(7, 768), dense(7, 3072)])
    wide = g.find(dense(33, 3072))     # the nearest earlier text: the 3072-wide one
    assert wide is not None and wide.sizes == {"S0": 33} and "float32(768, 3072) B" in wide.template.source
    narrow = g.find(dense(33, 768))
    assert narrow is not None and "float32(768, 768) B" in narrow.template.source
    g.remember([dense(33, 768), dense(33, 3072)])
    again = g.find(dense(50, 3072))
    assert again is not None and again.template is wide.template and again.sizes == {"S0": 50}


def test_a_template_tc_refuses_leaves_the_text_as_it_is():
    """Where the template's text does not parse (a size where TC takes none), the text is
    compiled as it is: no template, and no error for the caller."""
    from polyfuse.errors import TCSemanticError

    def refuse(source, sizes):
        raise TCSemanticError("expected an integer literal here", None, source)
    g = Generalizer(refuse)
    g.remember([dense(7, 768)])
    assert g.find(dense(33, 768)) is None
    real = Generalizer(parse_definition)
    real.remember([dense(7, 768)])
    assert real.find(dense(33, 768)) is not None


def test_a_step_whose_text_never_changed_keeps_it_over_another_step_s():
    """Issue 36: compiling ahead, a decoding step's projection has the same text at every
    probe size (one token, its weights' widths); another step's near text (another width)
    must not make its width a size, which would leave the weights unpacked."""
    g = Generalizer(parse_definition)
    g.remember([dense(1, 3072), dense(1, 2304), dense(1, 3072), dense(1, 2304)],
               ["c_fc", "c_attn", "c_fc", "c_attn"])
    assert g.find(dense(1, 3072), "c_fc") is None
    other = g.find(dense(1, 3072), "")   # a text of no known step still pairs with the nearest
    assert other is not None and other.sizes == {"S0": 3072}
    g.remember([dense(5, 3072)], ["c_fc"])   # where the step's own text changes, it generalizes
    own = g.find(dense(9, 3072), "c_fc")
    assert own is not None and own.sizes == {"S0": 9} and "float32(768, 3072) B" in own.template.source


def scale(rows: int, cols: int) -> str:
    return (f"def k(float32({rows}, {cols}) X, float32({cols}) s) -> (float32({rows}, {cols}) Y) {{\n"
            f"  Y(i, j) = max(X(i, j) * s(j), 0.0) where i in 0:{rows}, j in 0:{cols}\n}}")


def test_texts_of_one_plan_alike_in_all_but_sizes_share_a_template_without_reductions():
    g = Generalizer(parse_definition)
    g.alike([scale(4, 8), scale(9, 8)])            # two: each keeps its own kernel
    assert g.find(scale(4, 8)) is None
    plan = [scale(4, 8), scale(9, 8), scale(3, 16), scale(9, 8)]
    g.alike(plan)
    found = [g.find(t) for t in plan]
    assert all(f is not None for f in found) and len({f.template for f in found}) == 1
    assert [f.sizes for f in found[:3]] == [{"S0": 4, "S1": 8}, {"S0": 9, "S1": 8}, {"S0": 3, "S1": 16}]
    assert "float32(S0, S1) X, float32(S1) s" in found[0].template.source
    g.alike([dense(7, 768), dense(33, 768), dense(50, 768)])   # contractions: sizes decide their tiles
    assert g.find(dense(7, 768)) is None


def strided(rows: int, cols: int) -> str:
    return (f"def k(float32({2 * rows}, {cols}) X) -> (float32({rows}, {cols}) Y) {{\n"
            f"  Y(i, j) = X(2 * i, j) where i in 0:{rows}, j in 0:{cols}\n}}")


def test_texts_of_one_plan_that_read_strided_keep_their_own_sizes():
    """(GoogLeNet's Winograd input transforms, which read X(4 * t + k), shared a kernel
    for symbolic sizes and ran 10-27x slower)"""
    g = Generalizer(parse_definition)
    g.alike([strided(4, 8), strided(9, 8), strided(3, 16)])
    assert g.find(strided(4, 8)) is None
