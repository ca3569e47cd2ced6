// polyfuse._native: the runtime that generated kernels call into.
//
// - a persistent thread pool behind a C ABI parallel-for (polyfuse_parallel_for),
//   which JIT-compiled code binds by address;
// - aligned numpy buffers;
// - call(): runs a kernel `void kernel(void** args)` with the GIL released;
// - Program: a model's kernel calls over one arena, with its loops and branches, run by one call.
// The Python face, with the full contract, is polyfuse/runtime/native.py.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <pthread.h>
#include <sys/mman.h>

#include <cstdlib>
#include <algorithm>
#include <chrono>
#include <optional>
#include <cstring>
#include <tuple>
#include <map>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <string>
#include <vector>

#include "num_threads.h"
#include "thread_pool.h"

namespace py = pybind11;

extern "C" {
void polyfuse_parallel_for(polyfuse_body body, int64_t n, void* ctx);
void polyfuse_parallel_for_threads(polyfuse_body body, int64_t n, void* ctx, int64_t num_threads);
}

namespace {

using polyfuse::t_inside_parallel;
using polyfuse::ThreadPool;

constexpr int kMaxThreads = POLYFUSE_MAX_THREADS;

// Never deleted: joining threads during interpreter or process teardown can hang.
ThreadPool* g_pool = nullptr;

// The pool's size from $POLYFUSE_NUM_THREADS (num_threads.h); a refused value warns.
int default_num_threads() {
    char problem[256];
    int n = polyfuse_num_threads_from_env(problem, sizeof problem);
    if (problem[0] != '\0' && PyErr_WarnEx(PyExc_RuntimeWarning, problem, 1) < 0) throw py::error_already_set();
    return n;
}

// ---- aligned buffers ------------------------------------------------------

std::atomic<int64_t> g_aligned_buffers_live{0};

// Freed buffers of 1 MiB or more are kept (up to kKeepBytes in all) and handed out again
// for the same size: a kernel that returns a fresh 64 MiB output every call then writes
// memory that is already mapped instead of taking thousands of page faults.
constexpr size_t kKeepMin = size_t(1) << 20;
constexpr size_t kKeepBytes = size_t(512) << 20;

// Buffers of a huge page or more (outputs, a model's arena, prepacked weights) start on a
// huge page boundary, span whole huge pages and ask the kernel for transparent huge pages
// (madvise, what Linux's default "madvise" mode waits for): a kernel sweeping megabytes
// at a row's stride then touches one TLB entry per 2 MiB instead of one per 4 KiB.
constexpr size_t kHugePage = size_t(2) << 20;
std::atomic<bool> g_huge_pages{true};

struct BufferPool {
    std::mutex mutex;
    std::unordered_map<void*, std::pair<size_t, size_t>> sizes;  // live block -> bytes, alignment
    std::map<std::pair<size_t, size_t>, std::vector<void*>> free_blocks;
    size_t kept = 0;

    void* take(size_t bytes, size_t alignment) {
        bool huge = bytes >= kHugePage && g_huge_pages.load(std::memory_order_relaxed);
        if (huge) {
            alignment = std::max(alignment, kHugePage);
            bytes = (bytes + kHugePage - 1) / kHugePage * kHugePage;
        }
        std::lock_guard<std::mutex> lock(mutex);
        auto it = free_blocks.find({bytes, alignment});
        void* p = nullptr;
        if (it != free_blocks.end() && !it->second.empty()) {
            p = it->second.back();
            it->second.pop_back();
            kept -= bytes;
        } else if (posix_memalign(&p, alignment, bytes) != 0) {
            return nullptr;
        } else if (huge) {
#ifdef MADV_HUGEPAGE
            madvise(p, bytes, MADV_HUGEPAGE);  // advice only: without THP the pages stay small
#endif
        }
        sizes[p] = {bytes, alignment};
        return p;
    }

    void give_back(void* p) {
        std::lock_guard<std::mutex> lock(mutex);
        auto it = sizes.find(p);
        auto [bytes, alignment] = it->second;
        sizes.erase(it);
        if (bytes >= kKeepMin && kept + bytes <= kKeepBytes) {
            free_blocks[{bytes, alignment}].push_back(p);
            kept += bytes;
        } else {
            std::free(p);
        }
    }
};

BufferPool& pool() {
    static BufferPool* instance = new BufferPool();  // never destroyed: capsules may outlive exit
    return *instance;
}

void free_aligned(void* p) {
    pool().give_back(p);
    g_aligned_buffers_live.fetch_sub(1, std::memory_order_relaxed);
}

py::array empty_aligned(const std::vector<py::ssize_t>& shape, const py::dtype& dtype, size_t alignment,
                        bool zero) {
    if (alignment == 0 || (alignment & (alignment - 1)) != 0)
        throw py::value_error("alignment must be a power of two, got " + std::to_string(alignment));
    if (py::bool_(dtype.attr("hasobject")))
        throw py::type_error("empty_aligned cannot hold Python objects (dtype " + std::string(py::str(dtype)) + ")");
    if (dtype.itemsize() == 0)
        throw py::type_error("empty_aligned needs a dtype with a size, got " + std::string(py::str(dtype)));
    size_t bytes = static_cast<size_t>(dtype.itemsize());
    for (py::ssize_t d : shape) {
        if (d < 0) throw py::value_error("negative dimension " + std::to_string(d) + " in shape");
        if (__builtin_mul_overflow(bytes, static_cast<size_t>(d), &bytes) || bytes > PTRDIFF_MAX)
            throw py::value_error("array is too big");
    }
    // posix_memalign wants at least pointer alignment
    void* data = pool().take(std::max<size_t>(bytes, 1), std::max(alignment, sizeof(void*)));
    if (data == nullptr) throw std::bad_alloc();
    if (zero) std::memset(data, 0, bytes);
    g_aligned_buffers_live.fetch_add(1, std::memory_order_relaxed);
    py::capsule owner(data, free_aligned);  // the array's base; frees the memory with it
    return py::array(dtype, shape, std::vector<py::ssize_t>{}, data, owner);
}

bool is_aligned(const py::array& array, size_t alignment) {
    if (alignment == 0) throw py::value_error("alignment must be positive");
    return reinterpret_cast<uintptr_t>(array.data()) % alignment == 0;
}

// ---- call() ---------------------------------------------------------------

typedef void (*kernel_fn)(void** args);
union Slot {  // where a scalar argument lives while the kernel runs
    int64_t i;
    double d;
};
constexpr size_t kInlineArgs = 16;

PyObject* g_np_integer = nullptr;  // numpy.integer, numpy.bool_, numpy.floating
PyObject* g_np_bool = nullptr;
PyObject* g_np_floating = nullptr;

bool is_instance(PyObject* obj, PyObject* type) {
    return PyObject_TypeCheck(obj, reinterpret_cast<PyTypeObject*>(type));
}

// Points *ptr at the argument; on failure sets a TypeError naming args[i], returns false.
bool convert_argument(PyObject* obj, Py_ssize_t i, void** ptr, Slot* slot, py::object* keep) {
    if (py::isinstance<py::array>(obj)) {
        auto array = py::reinterpret_borrow<py::array>(obj);
        if (!(array.flags() & py::array::c_style)) {
            PyErr_Format(PyExc_TypeError, "call(): args[%zd] is not a C-contiguous array", i);
            return false;
        }
        *ptr = const_cast<void*>(array.data());
        *keep = std::move(array);  // alive until the kernel returns, even if the list is mutated
        return true;
    }
    if (is_instance(obj, g_np_bool)) {  // numpy.bool_ has no __index__
        slot->i = PyObject_IsTrue(obj);
        *ptr = slot;
        return true;
    }
    if (PyLong_Check(obj) || is_instance(obj, g_np_integer)) {
        PyObject* index = PyNumber_Index(obj);
        if (index == nullptr) return false;
        slot->i = PyLong_AsLongLong(index);
        Py_DECREF(index);
        if (slot->i == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "call(): args[%zd] = %R does not fit in int64", i, obj);
            return false;
        }
        *ptr = slot;
        return true;
    }
    if (PyFloat_Check(obj) || is_instance(obj, g_np_floating)) {
        slot->d = PyFloat_AsDouble(obj);
        if (slot->d == -1.0 && PyErr_Occurred()) return false;
        *ptr = slot;
        return true;
    }
    PyErr_Format(PyExc_TypeError, "call(): args[%zd] is a %s; expected a numpy array, an int or a float", i,
                 Py_TYPE(obj)->tp_name);
    return false;
}

// call(fn_address, args): a raw METH_FASTCALL function, because pybind11's dispatcher
// costs more than the whole conversion below.
PyObject* call(PyObject*, PyObject* const* argv, Py_ssize_t argc) {
    if (argc != 2) {
        PyErr_Format(PyExc_TypeError, "call() takes 2 arguments (fn_address, args), got %zd", argc);
        return nullptr;
    }
    if (!PyLong_Check(argv[0])) {
        PyErr_Format(PyExc_TypeError, "call(): fn_address must be an int, got %s", Py_TYPE(argv[0])->tp_name);
        return nullptr;
    }
    auto fn = reinterpret_cast<kernel_fn>(PyLong_AsVoidPtr(argv[0]));
    if (fn == nullptr) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "call(): fn_address is 0");
        return nullptr;
    }
    PyObject* seq = argv[1];
    if (!PyList_Check(seq) && !PyTuple_Check(seq)) {
        PyErr_Format(PyExc_TypeError, "call(): args must be a list or a tuple, got %s", Py_TYPE(seq)->tp_name);
        return nullptr;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    void* inline_ptrs[kInlineArgs];
    Slot inline_slots[kInlineArgs];
    py::object inline_keep[kInlineArgs];
    std::vector<void*> heap_ptrs;
    std::vector<Slot> heap_slots;
    std::vector<py::object> heap_keep;
    void** ptrs = inline_ptrs;
    Slot* slots = inline_slots;
    py::object* keep = inline_keep;
    if (static_cast<size_t>(n) > kInlineArgs) {
        try {
            heap_ptrs.resize(n), heap_slots.resize(n), heap_keep.resize(n);
        } catch (const std::bad_alloc&) {
            return PyErr_NoMemory();
        }
        ptrs = heap_ptrs.data(), slots = heap_slots.data(), keep = heap_keep.data();
    }
    // The list cannot change while we hold the GIL, so its items are read directly.
    PyObject** items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; ++i)
        if (!convert_argument(items[i], i, &ptrs[i], &slots[i], &keep[i])) return nullptr;
    Py_BEGIN_ALLOW_THREADS
    fn(ptrs);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

PyMethodDef g_methods[] = {
    {"call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(call)), METH_FASTCALL,
     "call(fn_address, args): run `void kernel(void** args)` with the GIL released."},
    {nullptr, nullptr, 0, nullptr},
};

// ---- test kernels ---------------------------------------------------------
// Kernels shaped like generated code, for the tests and for measuring call().

void noop_kernel(void**) {}

void add_body(int64_t begin, int64_t end, void* ctx) {  // out[i] = a[i] + b[i]
    auto args = static_cast<void**>(ctx);
    auto a = static_cast<const float*>(args[0]), b = static_cast<const float*>(args[1]);
    auto out = static_cast<float*>(args[2]);
    for (int64_t i = begin; i < end; ++i) out[i] = a[i] + b[i];
}
void add_kernel(void** args) {  // (float32 a[n], float32 b[n], float32 out[n], int64 n)
    polyfuse_parallel_for(add_body, *static_cast<int64_t*>(args[3]), args);
}

void count_body(int64_t begin, int64_t end, void* ctx) {
    auto counts = static_cast<int64_t*>(ctx);
    for (int64_t i = begin; i < end; ++i) __atomic_fetch_add(&counts[i], 1, __ATOMIC_RELAXED);
}
void count_kernel(void** args) {  // (int64 counts[n], int64 n, int64 num_threads): counts[i] += 1
    polyfuse_parallel_for_threads(count_body, *static_cast<int64_t*>(args[1]), args[0],
                                  *static_cast<int64_t*>(args[2]));
}

struct Rows {
    int64_t* counts;
    int64_t m;
};
void nested_rows_body(int64_t begin, int64_t end, void* ctx) {
    auto rows = static_cast<Rows*>(ctx);
    for (int64_t i = begin; i < end; ++i) polyfuse_parallel_for(count_body, rows->m, rows->counts + i * rows->m);
}
void nested_count_kernel(void** args) {  // (int64 counts[n, m], int64 n, int64 m): nested regions
    Rows rows{static_cast<int64_t*>(args[0]), *static_cast<int64_t*>(args[2])};
    polyfuse_parallel_for(nested_rows_body, *static_cast<int64_t*>(args[1]), &rows);
}

const std::pair<const char*, kernel_fn> kTestKernels[] = {
    {"noop", noop_kernel}, {"add", add_kernel}, {"count", count_kernel}, {"nested_count", nested_count_kernel}};

uintptr_t test_kernel_address(const std::string& name) {
    for (const auto& [known, fn] : kTestKernels)
        if (name == known) return reinterpret_cast<uintptr_t>(fn);
    throw py::key_error("no test kernel '" + name + "'; known: noop, add, count, nested_count");
}

}  // namespace

extern "C" void polyfuse_parallel_for(polyfuse_body body, int64_t n, void* ctx) {
    g_pool->parallel_for(body, n, ctx, 0);
}

extern "C" void polyfuse_parallel_for_threads(polyfuse_body body, int64_t n, void* ctx, int64_t num_threads) {
    g_pool->parallel_for(body, n, ctx, num_threads);
}

// --- programs: a compiled model's kernels, run by one call -------------------------------
//
// A program is a list of instructions run from a program counter: kernel calls, copies
// between argument locations, int64 counters, and jumps (a loop or a branch the data
// decides runs here, not in Python).

// Where an argument points: into the arena, an input or output array (by position), a
// fixed address (a constant the caller keeps alive), or the program's error slot.
enum ArgBase : int { kArena = 0, kInput = 1, kOutput = 2, kFixed = 3, kError = 4 };

struct ProgramArg {
    int base;
    int64_t index;   // input/output position, or the fixed address
    int64_t offset;  // bytes from the base
};

using ArgTuple = std::tuple<int, int64_t, int64_t>;

enum Op : int { kCall, kCopy, kSet, kIncrement, kJump, kJumpUnless, kJumpIfAtLeast };

struct Instruction {
    Op op;
    // kCall: its arguments; kCopy: destination, source[, row]; kSet, kIncrement: the
    // destination; kJumpUnless: the bool tested; kJumpIfAtLeast: the counter, the limit
    std::vector<ProgramArg> args;
    kernel_fn fn = nullptr;
    std::vector<std::pair<size_t, size_t>> zero;  // kCall: (argument, bytes) cleared before the call
    int64_t call = -1;    // kCall: its position among the calls (errors, times)
    int64_t value = 0;    // kCopy: bytes (per row); kSet: the value
    int64_t bytes = 0;    // kSet: the destination's bytes (1 to 8, little-endian)
    size_t target = 0;    // jumps: the instruction run next
};

class Program {
  public:
    void add(uintptr_t fn, const std::vector<ArgTuple>& args, const std::vector<std::pair<size_t, size_t>>& zero) {
        Instruction ins{kCall, arguments(args)};
        ins.fn = reinterpret_cast<kernel_fn>(fn);
        if (ins.fn == nullptr) throw py::value_error("Program.add: fn is 0");
        for (auto& [arg, bytes] : zero)
            if (arg >= ins.args.size()) throw py::value_error("Program.add: zeroed argument out of range");
        ins.zero = zero;
        ins.call = calls_++;
        width_ = std::max(width_, ins.args.size());
        code_.push_back(std::move(ins));
    }

    void copy(const ArgTuple& dst, const ArgTuple& src, int64_t bytes, std::optional<ArgTuple> row) {
        if (bytes < 0) throw py::value_error("Program.copy: negative size");
        std::vector<ArgTuple> args{dst, src};
        if (row) args.push_back(*row);
        Instruction ins{kCopy, arguments(args)};
        ins.value = bytes;
        code_.push_back(std::move(ins));
    }

    void set(const ArgTuple& dst, int64_t value, int64_t bytes) {
        if (bytes < 1 || bytes > 8) throw py::value_error("Program.set: bytes must be 1 to 8");
        Instruction ins{kSet, arguments({dst})};
        ins.value = value, ins.bytes = bytes;
        code_.push_back(std::move(ins));
    }

    void increment(const ArgTuple& counter) { code_.push_back(Instruction{kIncrement, arguments({counter})}); }

    void jump(size_t target) { jump_to(Instruction{kJump, {}}, target); }

    void jump_unless(const ArgTuple& cond, size_t target) { jump_to(Instruction{kJumpUnless, arguments({cond})}, target); }

    void jump_if_at_least(const ArgTuple& counter, const ArgTuple& limit, size_t target) {
        jump_to(Instruction{kJumpIfAtLeast, arguments({counter, limit})}, target);
    }

    // Runs the instructions from the first; returns -1, or the position (among the calls)
    // of the call that reported an out-of-bounds index through the error slot (nothing
    // runs after it).
    int64_t run(py::array arena, const std::vector<py::array>& inputs, const std::vector<py::array>& outputs,
                std::optional<py::array_t<double>> times) {
        double* seconds = nullptr;
        if (times) {
            if (times->size() < calls_) throw py::value_error("Program.run: times needs one slot per call");
            seconds = times->mutable_data();
        }
        for (const Instruction& ins : code_)
            if (ins.target > code_.size()) throw py::value_error("Program.run: a jump past the end of the program");
        std::vector<char*> in, out;
        for (auto& a : inputs) in.push_back(static_cast<char*>(const_cast<void*>(a.data())));
        for (auto& a : outputs) out.push_back(static_cast<char*>(const_cast<void*>(a.data())));
        char* base = static_cast<char*>(arena.mutable_data());
        if (in.size() < inputs_ || out.size() < outputs_)
            throw py::value_error("Program.run: too few input or output arrays");
        std::vector<void*> ptrs(std::max<size_t>(width_, 3));
        int64_t error = 0;
        py::gil_scoped_release release;
        for (size_t pc = 0; pc < code_.size();) {
            const Instruction& ins = code_[pc++];
            for (size_t i = 0; i < ins.args.size(); ++i) {
                const ProgramArg& a = ins.args[i];
                char* p = a.base == kArena    ? base
                          : a.base == kInput  ? in[a.index]
                          : a.base == kOutput ? out[a.index]
                          : a.base == kFixed  ? reinterpret_cast<char*>(a.index)
                                              : reinterpret_cast<char*>(&error);
                ptrs[i] = p + a.offset;
            }
            switch (ins.op) {
                case kCall: {
                    auto start = std::chrono::steady_clock::now();
                    for (auto& [arg, bytes] : ins.zero) std::memset(ptrs[arg], 0, bytes);
                    ins.fn(ptrs.data());
                    if (seconds)
                        seconds[ins.call] +=
                            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
                    if (error) return ins.call;
                    break;
                }
                case kCopy: {
                    char* dst = static_cast<char*>(ptrs[0]);
                    if (ins.args.size() == 3) dst += *static_cast<int64_t*>(ptrs[2]) * ins.value;
                    std::memmove(dst, ptrs[1], ins.value);
                    break;
                }
                case kSet:
                    std::memcpy(ptrs[0], &ins.value, ins.bytes);  // the low bytes: little-endian targets
                    break;
                case kIncrement:
                    ++*static_cast<int64_t*>(ptrs[0]);
                    break;
                case kJump:
                    pc = ins.target;
                    break;
                case kJumpUnless:
                    if (!*static_cast<uint8_t*>(ptrs[0])) pc = ins.target;
                    break;
                case kJumpIfAtLeast:
                    if (*static_cast<int64_t*>(ptrs[0]) >= *static_cast<int64_t*>(ptrs[1])) pc = ins.target;
                    break;
            }
        }
        return -1;
    }

    size_t size() const { return static_cast<size_t>(calls_); }

    // Each call as (fn, [(base, index, offset)], [(argument, bytes)]): what tests compare.
    py::list describe() const {
        py::list out;
        for (const Instruction& ins : code_) {
            if (ins.op != kCall) continue;
            py::list args;
            for (const ProgramArg& a : ins.args) args.append(py::make_tuple(a.base, a.index, a.offset));
            py::list zero;
            for (auto& [arg, bytes] : ins.zero) zero.append(py::make_tuple(arg, bytes));
            out.append(py::make_tuple(reinterpret_cast<uintptr_t>(ins.fn), args, zero));
        }
        return out;
    }

    // A copy with some numbers of its calls changed (a plan template's program at new
    // sizes): `fns`, (call, fn) rows; `args`, (call, argument, base, index, offset) rows;
    // `zero`, (call, argument, bytes) rows, which replace the zeroing of each call they
    // name (rows of 0 bytes dropped).
    Program patched(const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& fns,
                    const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& args,
                    const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& zero) const {
        auto rows = [](const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& a, py::ssize_t width) {
            if (a.size() == 0) return py::ssize_t(0);
            if (a.ndim() != 2 || a.shape(1) != width)
                throw py::value_error("Program.patched: rows of " + std::to_string(width) + " numbers expected");
            return a.shape(0);
        };
        py::ssize_t nf = rows(fns, 2), na = rows(args, 5), nz = rows(zero, 3);
        const int64_t *f = fns.data(), *a = args.data(), *z = zero.data();
        Program out(*this);
        std::vector<size_t> at;  // each call's instruction
        for (size_t pc = 0; pc < out.code_.size(); ++pc)
            if (out.code_[pc].op == kCall) at.push_back(pc);
        auto call = [&](int64_t k) -> Instruction& {
            if (k < 0 || static_cast<size_t>(k) >= at.size()) throw py::value_error("Program.patched: no such call");
            return out.code_[at[k]];
        };
        for (py::ssize_t i = 0; i < nf; ++i) {
            if (f[2 * i + 1] == 0) throw py::value_error("Program.patched: fn is 0");
            call(f[2 * i]).fn = reinterpret_cast<kernel_fn>(f[2 * i + 1]);
        }
        for (py::ssize_t i = 0; i < na; ++i) {
            const int64_t* r = a + 5 * i;
            Instruction& ins = call(r[0]);
            if (r[1] < 0 || static_cast<size_t>(r[1]) >= ins.args.size())
                throw py::value_error("Program.patched: no such argument");
            ins.args[r[1]] = out.arguments({ArgTuple{static_cast<int>(r[2]), r[3], r[4]}})[0];
        }
        for (py::ssize_t i = 0; i < nz; ++i) call(z[3 * i]).zero.clear();
        for (py::ssize_t i = 0; i < nz; ++i) {
            const int64_t* r = z + 3 * i;
            Instruction& ins = call(r[0]);
            if (r[1] < 0 || static_cast<size_t>(r[1]) >= ins.args.size() || r[2] < 0)
                throw py::value_error("Program.patched: bad zeroed argument");
            if (r[2]) ins.zero.emplace_back(r[1], r[2]);
        }
        return out;
    }

  private:
    std::vector<ProgramArg> arguments(const std::vector<ArgTuple>& args) {
        std::vector<ProgramArg> out;
        for (auto& [base, index, offset] : args) {
            if (base < kArena || base > kError) throw py::value_error("Program: bad argument base");
            if ((base == kInput || base == kOutput) && index < 0)
                throw py::value_error("Program: negative array position");
            if (base == kInput) inputs_ = std::max(inputs_, static_cast<size_t>(index) + 1);
            if (base == kOutput) outputs_ = std::max(outputs_, static_cast<size_t>(index) + 1);
            out.push_back({base, index, offset});
        }
        return out;
    }

    void jump_to(Instruction ins, size_t target) {
        ins.target = target;
        code_.push_back(std::move(ins));
    }

    std::vector<Instruction> code_;
    int64_t calls_ = 0;
    size_t width_ = 0;                 // the most arguments of one call
    size_t inputs_ = 0, outputs_ = 0;  // the input and output arrays the instructions use
};

// polyfuse.ir.plan.first_fit over numbered values, for a plan template's every call
// (runtime/template_program.py): the values defined at event k are
// values[bounds[k]:bounds[k + 1]], each live to its event last[v], of size[v] bytes;
// returns each value's offset (-1 for one never defined) and the arena's bytes.
py::tuple first_fit(const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& bounds,
                    const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& values,
                    const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& last,
                    const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& size) {
    py::ssize_t n = last.size();
    if (size.size() != n || bounds.size() < 1) throw py::value_error("first_fit: one last event and size per value");
    const int64_t *b = bounds.data(), *vs = values.data(), *l = last.data(), *sz = size.data();
    py::array_t<int64_t> offsets(n);
    int64_t* off = offsets.mutable_data();
    std::fill(off, off + n, -1);
    struct Block {
        int64_t offset, size, value;
        bool operator<(const Block& o) const {
            return offset != o.offset ? offset < o.offset : size != o.size ? size < o.size : value < o.value;
        }
    };
    std::vector<Block> live;
    int64_t arena = 0;
    for (py::ssize_t k = 0; k + 1 < bounds.size(); ++k) {
        if (b[k] < 0 || b[k + 1] < b[k] || b[k + 1] > values.size()) throw py::value_error("first_fit: bad bounds");
        live.erase(std::remove_if(live.begin(), live.end(), [&](const Block& x) { return l[x.value] < k; }),
                   live.end());
        for (int64_t i = b[k]; i < b[k + 1]; ++i) {
            int64_t v = vs[i];
            if (v < 0 || v >= n || sz[v] < 0) throw py::value_error("first_fit: bad value");
            int64_t offset = 0;
            for (const Block& x : live) {
                if (offset + sz[v] <= x.offset) break;
                offset = std::max(offset, x.offset + x.size);
            }
            off[v] = offset;
            Block blk{offset, sz[v], v};
            live.insert(std::upper_bound(live.begin(), live.end(), blk), blk);
            arena = std::max(arena, offset + sz[v]);
        }
    }
    return py::make_tuple(offsets, arena);
}

PYBIND11_MODULE(_native, m) {
    m.doc() = "polyfuse native runtime; use it through polyfuse.runtime.native";
    g_pool = new ThreadPool(default_num_threads());
    // A forked child has none of the parent's workers: give it a fresh, lazy pool.
    pthread_atfork(nullptr, nullptr, [] { g_pool = new ThreadPool(g_pool->num_threads()); });

    py::module_ numpy = py::module_::import("numpy");
    g_np_integer = py::object(numpy.attr("integer")).release().ptr();  // kept for the process's life
    g_np_bool = py::object(numpy.attr("bool_")).release().ptr();
    g_np_floating = py::object(numpy.attr("floating")).release().ptr();
    if (PyModule_AddFunctions(m.ptr(), g_methods) < 0) throw py::error_already_set();

    m.def("get_num_threads", [] { return g_pool->num_threads(); });
    m.def(
        "set_num_threads",
        [](int n) {
            if (t_inside_parallel) throw py::value_error("set_num_threads cannot be called inside a parallel region");
            if (n < 1 || n > kMaxThreads)
                throw py::value_error("number of threads must be in 1.." + std::to_string(kMaxThreads) +
                                      ", got " + std::to_string(n));
            py::gil_scoped_release release;  // a running region's bodies may need the GIL
            g_pool->set_num_threads(n);
        },
        py::arg("n"));
    m.def("parallel_for_address", [] { return reinterpret_cast<uintptr_t>(&polyfuse_parallel_for); });
    m.def("parallel_for_threads_address", [] { return reinterpret_cast<uintptr_t>(&polyfuse_parallel_for_threads); });
    m.def("empty_aligned", &empty_aligned, py::arg("shape"), py::arg("dtype"), py::arg("alignment") = 64,
          py::arg("zero") = false);
    m.def("is_aligned", &is_aligned, py::arg("array").noconvert(), py::arg("alignment") = 64);
    m.def("aligned_buffers_live", [] { return g_aligned_buffers_live.load(); });
    m.def("set_huge_pages", [](bool on) { return g_huge_pages.exchange(on); }, py::arg("on"));
    m.def("test_kernel_address", &test_kernel_address, py::arg("name"));
    m.def("first_fit", &first_fit, py::arg("bounds"), py::arg("values"), py::arg("last"), py::arg("size"));
    py::class_<Program>(m, "Program")
        .def(py::init<>())
        .def("add", &Program::add, py::arg("fn"), py::arg("args"), py::arg("zero"))
        .def("copy", &Program::copy, py::arg("dst"), py::arg("src"), py::arg("bytes"), py::arg("row") = py::none())
        .def("set", &Program::set, py::arg("dst"), py::arg("value"), py::arg("bytes"))
        .def("increment", &Program::increment, py::arg("counter"))
        .def("jump", &Program::jump, py::arg("target"))
        .def("jump_unless", &Program::jump_unless, py::arg("cond"), py::arg("target"))
        .def("jump_if_at_least", &Program::jump_if_at_least, py::arg("counter"), py::arg("limit"),
             py::arg("target"))
        .def("run", &Program::run, py::arg("arena"), py::arg("inputs"), py::arg("outputs"),
             py::arg("times") = py::none())
        .def("describe", &Program::describe)
        .def("patched", &Program::patched, py::arg("fns"), py::arg("args"), py::arg("zero"))
        .def("__len__", &Program::size);
}
