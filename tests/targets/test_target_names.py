"""A CPU or feature LLVM does not know is a TargetError when the target is given (LLVM
itself would print a warning, ignore the name, and might abort the process)."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

import polyfuse as pf

SQ = "def sq(float(N) X) -> (Y) { Y(i) = X(i) * X(i) }"


@pytest.mark.unit
@pytest.mark.parametrize("spec, unknown", [("x86:foo", "'foo'"), ("x86+bogus", "'+bogus'"),
                                           ("aarch64:nope+sve", "'nope'"), ("x86:skylake+avx9", "'+avx9'")])
def test_unknown_cpu_or_feature_is_refused_at_define(spec, unknown):
    with pytest.raises(pf.TargetError, match=f"LLVM does not know {re.escape(unknown)}.*'host' for"):
        pf.define(SQ, target=spec)


@pytest.mark.parametrize("spec", ["x86:skylake+avx2", "x86:x86-64"])
def test_known_names_compile_and_run(spec):
    x = np.arange(5, dtype=np.float32)
    np.testing.assert_array_equal(pf.define(SQ, target=spec).sq(x), x * x)


def test_the_cli_says_one_line_and_nothing_of_llvm(tmp_path):
    path = tmp_path / "sq.tc"
    path.write_text(SQ + "\n")
    out = subprocess.run([sys.executable, "-m", "polyfuse.cli", "compile", str(path), "--input-shapes",
                          "X:[8]", "--target", "x86:foo", "--dump", "asm"],
                         capture_output=True, text=True, timeout=120, env=os.environ)
    assert out.returncode == 1
    assert out.stderr.startswith("polyfuse: error: target 'x86:foo': LLVM does not know 'foo'")
    assert out.stderr.count("\n") == 1 and "not a recognized" not in out.stderr


def _foreign_x86():
    """A named x86 target whose code needs a feature this CPU lacks, and that feature."""
    import llvmlite.binding as llvm
    present = {f for f, on in llvm.get_host_cpu_features().items() if on}
    for spec, feature in (("x86:skylake-avx512", "avx512f"), ("x86:skylake-avx512+avx512fp16", "avx512fp16"),
                          ("x86:skylake-avx512+amx-fp16", "amx-fp16")):
        if feature not in present:
            return spec, feature
    pytest.skip("this CPU has every feature the foreign targets ask for")


def test_code_for_a_cpu_this_one_is_not_is_refused_before_it_runs(tmp_path):
    """Called here it would stop at its first instruction of the missing feature (SIGILL):
    a kernel or a model compiled for such a target raises a TargetError naming it, and
    still compiles, prints and bundles."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    spec, feature = _foreign_x86()
    a = np.ones((64, 64), np.float32)
    kernel = pf.define("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }",
                       target=spec).mm
    assert "vfmadd" in kernel.specialize(a, a).stages["asm"]
    with pytest.raises(pf.TargetError, match=f"needs {feature}.*target='host'"):
        kernel(a, a)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])],
                              [numpy_helper.from_array(a, "W")])
    model = pf.compile(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), target=spec)
    with pytest.raises(pf.TargetError, match=feature):
        model.run({"x": a})
    assert (tmp_path / "net.o") in model.save_bundle(tmp_path, "net")
    host = pf.define("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }", target="host")
    np.testing.assert_array_equal(host.mm(a, a), a @ a)
