"""Whether aarch64 code can run here (natively, or under qemu-user with the cross
compiler), and the marks for tests that need it."""

import os
import shutil

import pytest

HAVE_ARM_TOOLS = os.uname().machine == "aarch64" or bool(
    shutil.which("qemu-aarch64") and shutil.which("aarch64-linux-gnu-gcc"))

# CI installs qemu-user and gcc-aarch64-linux-gnu: there these tests must run, not skip
needs_arm_tools = pytest.mark.skipif(
    not HAVE_ARM_TOOLS and not os.environ.get("CI"),
    reason="needs qemu-aarch64 and aarch64-linux-gnu-gcc (apt-get install -y qemu-user "
           "gcc-aarch64-linux-gnu)")

AARCH64 = pytest.param("aarch64", marks=needs_arm_tools)
