"""Builds polyfuse's native runtime extension; project metadata lives in pyproject.toml."""

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup

setup(
    ext_modules=[
        Pybind11Extension(
            "polyfuse._native",
            ["polyfuse/runtime/native/runtime.cpp"],
            depends=["polyfuse/runtime/native/thread_pool.h", "polyfuse/runtime/native/num_threads.h"],
            cxx_std=17,
            extra_compile_args=["-O3", "-pthread"],
            extra_link_args=["-pthread"],
        ),
    ],
    cmdclass={"build_ext": build_ext},
)
