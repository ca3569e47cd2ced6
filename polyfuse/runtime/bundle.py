"""Ahead-of-time bundles, after Glow's: a compiled model as an object file and a C header.

:func:`write_bundle` writes, for a model compiled for ``x86`` or ``aarch64``:

* ``NAME.o``: every kernel and one entry point, ``int NAME(const uint8_t *weights,
  uint8_t *activations, const void *const *inputs, void *const *outputs)``;
* ``NAME.h``: the entry point, the inputs' and outputs' names, shapes, dtypes and
  bytes, and the sizes and alignment of the weights and activation regions;
* ``NAME.weights.bin``: the constants, each at an aligned offset;
* ``main.c``: an example that loads the weights, reads the inputs from files (or
  makes some), runs one inference and prints the outputs.

The entry point needs no Python and no allocator: the caller provides every buffer,
aligned to ``NAME_ALIGNMENT`` bytes. It returns 0, or ``k + 1`` when kernel ``k`` read
a tensor out of bounds through a checked index: one taken from another tensor, or one
the compiler could not prove in bounds (outputs are then undefined). Bundles are single-threaded unless built with ``threads=True``: then
``NAME.o`` also holds polyfuse's thread pool in C with pthreads (link with
``-pthread``; ``polyfuse_set_num_threads(n)`` sizes it, else ``$POLYFUSE_NUM_THREADS``,
else every online CPU). The variable is read as the in-process runtime reads it
(``native/num_threads.h``): a whole number from 1 to 4096; any other value is named on
stderr and ignored.

:func:`polyfuse.runtime.link.link_program` makes the object: each kernel's optimized
LLVM module linked into one module with the entry point, only the entry point exported.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from polyfuse.errors import ArgumentError, TargetError, UnsupportedOpError
from polyfuse.ir.graph import Graph
from polyfuse.runtime.link import link_program
from polyfuse.runtime.program import CompiledPlan, ProgramLayout
from polyfuse.targets import Target
from polyfuse.targets.cpu import target_machine

NATIVE_DIR = Path(__file__).parent / "native"
ALIGNMENT = 64
MAX_RANK = 8   # the header's shape arrays

# names the entry point cannot take: the example's main, C's keywords
_RESERVED = frozenset("""main auto break case char const continue default do double else enum
extern float for goto if inline int long register restrict return short signed sizeof static
struct switch typedef union unsigned void volatile while""".split())

# the dtypes bundle tensors may have (main.c reads and prints each) and their C element types
_C_TYPES = {"float32": "float", "float64": "double", "int8": "int8_t", "int16": "int16_t",
            "int32": "int32_t", "int64": "int64_t", "uint8": "uint8_t", "bool": "uint8_t",
            "uint16": "uint16_t", "uint32": "uint32_t", "uint64": "uint64_t",
            "float16": "uint16_t", "bfloat16": "uint16_t"}


class Bundled(Protocol):
    """What a bundle is written from: a compiled model
    (:class:`~polyfuse.runtime.model.CompiledModel`, which this module does not import)."""

    @property
    def target(self) -> Target: ...

    @property
    def graph(self) -> Graph: ...

    def plan_for(self, shapes: Mapping[str, tuple[int, ...]] | None = None) -> CompiledPlan: ...


def write_bundle(model: Bundled, out_dir: str | Path, name: str = "model", *,
                 threads: bool = False, shapes: Mapping[str, tuple[int, ...]] | None = None) -> list[Path]:
    """Write ``model``'s bundle (see the module docstring) into ``out_dir`` for the
    input ``shapes`` (default: those given to ``compile`` or of its latest run); the
    paths written."""
    target = model.target
    if not target.backend.bundles:
        raise TargetError(f"bundles are built for x86 or aarch64, not {target}; compile the "
                          "model with target='x86' or target='aarch64'")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or name in _RESERVED or name.startswith("polyfuse_"):
        raise ArgumentError(f"a bundle's name is a C identifier (it names the entry point) other "
                            f"than main, a C keyword or polyfuse_*; got {name!r}")
    narrow = [v for v in model.graph.inputs + model.graph.outputs if v.type.dtype.is_narrow]
    if narrow:   # the plan holds them in their storage types, which C callers would see
        raise ArgumentError(f"bundles take no tensors of the narrow types (float8, float4, int4, "
                            f"int2); '{narrow[0].name}' is {narrow[0].type.dtype}")
    plan = model.plan_for(shapes)
    tail = plan.plan.tail
    if tail is not None:
        what = ("has outputs whose sizes are" if tail.trims else "needs values" if tail.waits
                else "branches or loops on values")
        raise UnsupportedOpError(f"node '{tail.node.name}' ({tail.node.op}) {what} computed at run "
                                 "time, which a bundle's program cannot hold; only graphs planned "
                                 "whole (loops and branches on data included) bundle")
    # the plan's program (native or emulated) has laid its calls out already
    layout = plan.program.layout if plan.program is not None else ProgramLayout.of(plan)
    for t in layout.inputs + layout.outputs:
        if str(t.dtype) not in _C_TYPES or len(t.shape) > MAX_RANK:
            raise ArgumentError(f"bundles take tensors of rank {MAX_RANK} or less of "
                                f"{', '.join(_C_TYPES)}; '{t.name}' is {t.dtype}{list(t.shape)}")
    weights, offsets = layout.weights(ALIGNMENT)
    module = link_program(layout, target, name, offsets, threads)
    obj = target_machine(target).emit_object(module)
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ArgumentError(f"cannot write the bundle into {out}: {err.strerror}") from None
    paths = [out / f"{name}.o", out / f"{name}.h", out / f"{name}.weights.bin", out / "main.c"]
    if threads:
        obj = _with_thread_pool(obj, target)
    paths[0].write_bytes(obj)
    paths[1].write_text(header(layout, name, target, len(weights), threads))
    paths[2].write_bytes(weights)
    paths[3].write_text(example_main(layout, name, threads))
    return paths


def _with_thread_pool(obj: bytes, target: Target) -> bytes:
    """``obj`` and polyfuse's thread pool (``native/thread_pool.c``) as one relocatable
    object, made with the target's C compiler."""
    from polyfuse.runtime.cross import c_compiler
    cc = c_compiler(target)
    with tempfile.TemporaryDirectory(prefix="polyfuse-bundle-") as tmp:
        kernels, pool, both = Path(tmp, "kernels.o"), Path(tmp, "pool.o"), Path(tmp, "bundle.o")
        kernels.write_bytes(obj)
        for command in ([*cc, "-O2", "-std=c11", "-fPIC", "-c", str(NATIVE_DIR / "thread_pool.c"), "-o", str(pool)],
                        [*cc, "-r", "-nostdlib", str(kernels), str(pool), "-o", str(both)]):
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                raise TargetError(f"{Path(cc[0]).name} could not build the thread pool into the "
                                  f"bundle: {done.stderr.strip()[-2000:]}")
        return both.read_bytes()


def _macro(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "_", text).upper()


def header(layout: ProgramLayout, name: str, target: Target, weights_bytes: int, threads: bool) -> str:
    """``NAME.h``: the entry point and everything a caller needs to give it buffers."""
    up = _macro(name)
    lines = [f"// {name}.h: the polyfuse bundle '{name}' for {target} ({target.triple}"
             + (f", {target.cpu}" if target.cpu else "") + ").",
             f"// Link {name}.o into the program"
             + (" with -pthread (it holds polyfuse's thread pool)." if threads else
                "; the code is single-threaded."),
             f"#ifndef {up}_H", f"#define {up}_H", "", "#include <stdint.h>", "",
             f"#define {up}_ALIGNMENT {ALIGNMENT}  /* every buffer below is aligned to this */",
             f"#define {up}_WEIGHTS_SIZE {weights_bytes}u  /* bytes of {name}.weights.bin */",
             f"#define {up}_ACTIVATIONS_SIZE {layout.arena_bytes}u  /* scratch; no contents kept */",
             f"#define {up}_NUM_INPUTS {len(layout.inputs)}",
             f"#define {up}_NUM_OUTPUTS {len(layout.outputs)}",
             f"#define {up}_THREADS {int(threads)}", ""]
    for kind, tensors in (("INPUT", layout.inputs), ("OUTPUT", layout.outputs)):
        used: set[str] = set()
        for k, t in enumerate(tensors):
            macro = f"{up}_{kind}_{_macro(t.name)}"
            macro = macro if macro not in used else f"{macro}_{k}"
            used.add(macro)
            lines.append(f"/* {kind.lower()} {k}: \"{t.name}\" {t.dtype}{list(t.shape)} */")
            lines.append(f"#define {macro} {k}")
            lines.append(f"#define {macro}_SIZE {t.nbytes}u")
    lines += ["", "struct polyfuse_tensor_info {", "    const char *name;",
              "    const char *dtype;   /* numpy's name: float32, int64, bfloat16, ... */",
              "    int rank;", f"    int64_t shape[{MAX_RANK}];", "    uint64_t bytes;", "};", ""]
    for kind, tensors in (("inputs", layout.inputs), ("outputs", layout.outputs)):
        rows = ", ".join(
            f'{{"{t.name}", "{t.dtype}", {len(t.shape)}, {{{", ".join(map(str, t.shape)) or "0"}}}, {t.nbytes}u}}'
            for t in tensors)
        lines.append(f"static const struct polyfuse_tensor_info {name}_{kind}[] = {{{rows}}};")
    lines += ["",
              "/* Runs one inference. weights: the contents of the weights file; activations:",
              f" * {up}_ACTIVATIONS_SIZE bytes of scratch; inputs[k], outputs[k]: the tensors, in",
              " * the order above, C-contiguous. All aligned to the alignment above. Returns 0, or",
              " * k + 1 when kernel k read a tensor out of bounds through a checked index (an",
              " * index input held a value outside its dimension). */",
              f"int {name}(const uint8_t *weights, uint8_t *activations, const void *const *inputs,",
              "         void *const *outputs);"]
    if threads:
        lines += ["", "/* The thread pool's size (default: $POLYFUSE_NUM_THREADS, else every CPU). */",
                  "void polyfuse_set_num_threads(int n);", "int polyfuse_get_num_threads(void);"]
    lines += ["", f"#endif  /* {up}_H */", ""]
    return "\n".join(lines)


def example_main(layout: ProgramLayout, name: str, threads: bool) -> str:
    """``main.c``: load the weights, read each input from a file named on the command
    line (or fill it with a fixed pattern), run once, print every output."""
    up = _macro(name)
    return f'''// An example program for the polyfuse bundle '{name}': loads {name}.weights.bin,
// reads each input from a raw file (C order, the dtype in {name}.h) or fills it with
// a fixed pattern when no file is given, runs one inference and prints the outputs.
//
//   cc main.c {name}.o -o {name}_main -lm{" -pthread" if threads else ""}
//   ./{name}_main [{name}.weights.bin] [input0.bin ...]

#define _POSIX_C_SOURCE 200112L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "{name}.h"

static void *aligned(uint64_t bytes) {{
    void *p = NULL;
    if (posix_memalign(&p, {up}_ALIGNMENT, bytes ? bytes : {up}_ALIGNMENT) != 0) {{
        fprintf(stderr, "out of memory\\n");
        exit(1);
    }}
    return memset(p, 0, bytes ? bytes : {up}_ALIGNMENT);
}}

static void load(const char *path, void *dst, uint64_t bytes) {{
    FILE *f = fopen(path, "rb");
    if (!f) {{
        fprintf(stderr, "cannot open %s\\n", path);
        exit(1);
    }}
    if (bytes && fread(dst, 1, bytes, f) != bytes) {{
        fprintf(stderr, "%s: expected %llu bytes\\n", path, (unsigned long long)bytes);
        exit(1);
    }}
    fclose(f);
}}

static double half_to_double(uint16_t h, int bfloat) {{
    uint32_t bits;
    if (bfloat) {{
        bits = (uint32_t)h << 16;
    }} else {{
        uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 31, frac = h & 1023;
        if (exp == 0 && frac == 0) bits = sign;
        else if (exp == 31) bits = sign | 0x7f800000u | (frac << 13);
        else if (exp == 0) {{  /* subnormal: normalize */
            exp = 113;
            while (!(frac & 1024)) {{ frac <<= 1; --exp; }}
            bits = sign | (exp << 23) | ((frac & 1023) << 13);
        }} else bits = sign | ((exp + 112) << 23) | (frac << 13);
    }}
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}}

static double element(const void *data, const char *dtype, uint64_t i) {{
    if (!strcmp(dtype, "float32")) return ((const float *)data)[i];
    if (!strcmp(dtype, "float64")) return ((const double *)data)[i];
    if (!strcmp(dtype, "float16")) return half_to_double(((const uint16_t *)data)[i], 0);
    if (!strcmp(dtype, "bfloat16")) return half_to_double(((const uint16_t *)data)[i], 1);
    if (!strcmp(dtype, "int8")) return ((const int8_t *)data)[i];
    if (!strcmp(dtype, "int16")) return ((const int16_t *)data)[i];
    if (!strcmp(dtype, "int32")) return ((const int32_t *)data)[i];
    if (!strcmp(dtype, "int64")) return (double)((const int64_t *)data)[i];
    if (!strcmp(dtype, "uint16")) return ((const uint16_t *)data)[i];
    if (!strcmp(dtype, "uint32")) return ((const uint32_t *)data)[i];
    if (!strcmp(dtype, "uint64")) return (double)((const uint64_t *)data)[i];
    return ((const uint8_t *)data)[i];  /* uint8, bool */
}}

static void fill_pattern(void *data, const char *dtype, uint64_t bytes) {{
    /* small values every dtype holds: 0.25 * ((i % 7) - 3) for floats, i % 7 for ints */
    uint64_t n = bytes / (strstr(dtype, "64") ? 8 : strstr(dtype, "32") ? 4 :
                          strstr(dtype, "16") ? 2 : 1);
    for (uint64_t i = 0; i < n; ++i) {{
        double v = 0.25 * (double)((int)(i % 7) - 3);
        if (!strcmp(dtype, "float32")) ((float *)data)[i] = (float)v;
        else if (!strcmp(dtype, "float64")) ((double *)data)[i] = v;
        else if (strstr(dtype, "int32")) ((int32_t *)data)[i] = (int32_t)(i % 7);
        else if (strstr(dtype, "int64")) ((int64_t *)data)[i] = (int64_t)(i % 7);
        else if (!strcmp(dtype, "uint16")) ((uint16_t *)data)[i] = (uint16_t)(i % 7);
        else if (strstr(dtype, "int8") || !strcmp(dtype, "bool")) ((uint8_t *)data)[i] = (uint8_t)(i % 2);
    }}
}}

int main(int argc, char **argv) {{
    const char *weights_path = argc > 1 ? argv[1] : "{name}.weights.bin";
    uint8_t *weights = aligned({up}_WEIGHTS_SIZE);
    uint8_t *activations = aligned({up}_ACTIVATIONS_SIZE);
    void *inputs[{up}_NUM_INPUTS + 1], *outputs[{up}_NUM_OUTPUTS + 1];
    load(weights_path, weights, {up}_WEIGHTS_SIZE);
    for (int k = 0; k < {up}_NUM_INPUTS; ++k) {{
        inputs[k] = aligned({name}_inputs[k].bytes);
        if (argc > 2 + k) load(argv[2 + k], inputs[k], {name}_inputs[k].bytes);
        else fill_pattern(inputs[k], {name}_inputs[k].dtype, {name}_inputs[k].bytes);
    }}
    for (int k = 0; k < {up}_NUM_OUTPUTS; ++k) outputs[k] = aligned({name}_outputs[k].bytes);

    int status = {name}(weights, activations, (const void *const *)inputs, outputs);
    if (status != 0) {{
        fprintf(stderr, "{name}: kernel %d read a tensor out of bounds\\n", status - 1);
        return 1;
    }}
    for (int k = 0; k < {up}_NUM_OUTPUTS; ++k) {{
        const struct polyfuse_tensor_info *t = &{name}_outputs[k];
        uint64_t count = 1;
        printf("%s %s [", t->name, t->dtype);
        for (int d = 0; d < t->rank; ++d) {{
            printf(d ? ", %lld" : "%lld", (long long)t->shape[d]);
            count *= (uint64_t)t->shape[d];
        }}
        printf("]\\n");
        for (uint64_t i = 0; i < count; ++i)
            printf(i + 1 < count ? "%.9g " : "%.9g\\n", element(outputs[k], t->dtype, i));
    }}
    return 0;
}}
'''
