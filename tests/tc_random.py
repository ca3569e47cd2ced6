"""Random TC programs for property tests (hypothesis strategies)."""

import re

from hypothesis import strategies as st

SIZES = ["N", "M", "K"]
DTYPES = ["float32", "float16", "float64", "int32", "int64"]
INDICES = ["i", "j", "k"]


@st.composite
def programs(draw):
    n_inputs = draw(st.integers(1, 3))
    inputs = []
    for t in range(n_inputs):
        rank = draw(st.integers(1, 3))
        sizes = draw(st.lists(st.sampled_from(SIZES), min_size=rank, max_size=rank))
        inputs.append((f"T{t}", draw(st.sampled_from(DTYPES)), sizes))

    def read(depth):
        name, _, sizes = draw(st.sampled_from(inputs))
        idx = draw(st.permutations(INDICES))[:len(sizes)]
        parts = [f"{i} + {draw(st.integers(0, 2))}" if draw(st.booleans()) else i for i in idx]
        return f"{name}({', '.join(parts)})"

    def expr(depth):
        choice = draw(st.integers(0, 9 if depth < 3 else 2))
        if choice <= 1:
            return read(depth)
        if choice == 2:
            return draw(st.sampled_from(["2", "0.5", "3.25", "1", "N", "i"]))
        a, b = expr(depth + 1), expr(depth + 1)
        if choice in (3, 4):
            return f"({a} {draw(st.sampled_from(['+', '-', '*', '/']))} {b})"
        if choice == 5:
            return f"{draw(st.sampled_from(['exp', 'tanh', 'fabs', 'sqrt', 'floor']))}({a})"
        if choice == 6:
            return f"({a} {draw(st.sampled_from(['<', '>=', '==']))} {b} ? {a} : {b})"
        if choice == 7:
            return f"{draw(st.sampled_from(['float', 'double', 'int32', 'float16']))}({a})"
        if choice == 8:
            return f"-{a}"
        return f"{draw(st.sampled_from(['fmax', 'min', 'pow']))}({a}, {b})"

    statements, outputs = [], []
    for s in range(draw(st.integers(1, 3))):
        rhs = read(0) + " * " + expr(0) if draw(st.booleans()) else expr(0)
        used = [i for i in INDICES if re.search(rf"\b{i}\b", rhs)]
        if not used:
            rhs = f"{read(0)} + {rhs}"
            used = [i for i in INDICES if re.search(rf"\b{i}\b", rhs)]
        op = draw(st.sampled_from(["=", "+=!", "max=!", "*=!", "min=!"]))
        lhs = used if op == "=" else draw(st.lists(st.sampled_from(used), unique=True))
        statements.append(f"  O{s}({', '.join(lhs)}) {op} {rhs}")
        outputs.append(f"O{s}")
    params = ", ".join(f"{dt}({', '.join(sz)}) {name}" for name, dt, sz in inputs)
    return f"def f({params}) -> ({', '.join(outputs)}) {{\n" + "\n".join(statements) + "\n}\n"


