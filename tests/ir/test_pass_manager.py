"""The pass manager verifies what each pass returns, once per IR object: IR is
immutable, so an object a manager of the same kind checked before (a pass that returned
its input unchanged) is not checked again; anything new is."""

from dataclasses import dataclass

import pytest

from polyfuse.errors import IRVerificationError
from polyfuse.ir.passes import PassManager

pytestmark = pytest.mark.unit


@dataclass(frozen=True)
class Box:
    value: int


class Counting(PassManager[Box]):
    checked: list[int] = []

    def check(self, ir: Box) -> None:
        Counting.checked.append(ir.value)
        if ir.value < 0:
            raise IRVerificationError("negative")


def test_an_unchanged_ir_object_is_checked_once_and_a_new_one_always():
    Counting.checked = []
    same = lambda b: b   # noqa: E731
    start = Box(1)
    out = Counting([lambda b: Box(b.value + 1), same, same], verify=True).run(start)
    assert out == Box(2) and Counting.checked == [2]   # the input unchecked, its successor once
    Counting([same], verify=True).run(out)   # a later run on the checked object: nothing new
    assert Counting.checked == [2]
    Counting([same], verify=True).run(Box(2))   # an equal but other object is checked
    assert Counting.checked == [2, 2]
    with pytest.raises(IRVerificationError, match="in ir pass '<lambda>' on unit '\\?': negative"):
        Counting([lambda b: Box(-1)], verify=True).run(start)
