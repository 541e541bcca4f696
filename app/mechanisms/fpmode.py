"""Flush-to-zero for the duration of a JointExp forward pass (x86-64 only).

JointExp's linear rows are exact only down to the smallest normal double below their
maximum (``jointexp.LINEAR_RANGE``): the range rule never counts on subnormals. Computing
them anyway is not free: on Intel cores every multiply or add that produces or reads a
subnormal takes a microcode assist of ~100+ cycles, and tilted rows (clamped data) decay
through the subnormal range over tens of thousands of entries. Measured on a 2-core Xeon
with AVX-512 (2026-12-01), JointExp m = 99 on 10^6 values of which 5 % are clamped: the
tilted pass took 600-680 ms with subnormals and 320 ms with them flushed; AMD cores lose
little (~7 %).

:func:`flush_subnormals` sets MXCSR's flush-to-zero (FTZ: a subnormal result is 0.0) and
denormals-are-zero (DAZ: a subnormal operand is read as 0.0) bits for the calling thread and
restores the previous value on exit. Under it an operation loses less than the smallest
normal double (2^-1022) instead of 2^-1075, which is the error model the range rule already
uses; see docs/mechanisms.md, "Subnormals are flushed". The bits are per thread: the rows
are formed in the calling thread (no numba ``parallel``), so nothing else sees them. On
other architectures it does nothing (the rows are the same as before, only slower where the
hardware is slow on subnormals).
"""

from __future__ import annotations

import contextlib
import platform
from collections.abc import Callable, Iterator
from typing import Any

#: MXCSR bits: FTZ (bit 15) and DAZ (bit 6)
FTZ_DAZ = 0x8040

_X86_64 = platform.machine().lower() in ("x86_64", "amd64")


if _X86_64:
    import numba
    from llvmlite import ir
    from numba.core import cgutils as _cgutils
    from numba.core import types
    from numba.extending import intrinsic as _intrinsic

    # numba's helpers carry no annotations: typed here as what they are used as
    cgutils: Any = _cgutils
    intrinsic: Callable[[Callable[..., Any]], Any] = _intrinsic

    def _mxcsr_call(builder: Any, name: str, slot: Any) -> None:
        i8p = ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(ir.VoidType(), [i8p])
        fn = cgutils.get_or_insert_function(builder.module, fnty, name)
        builder.call(fn, [builder.bitcast(slot, i8p)])

    @intrinsic
    def _get_mxcsr(typingctx: Any) -> Any:
        """This thread's MXCSR (``llvm.x86.sse.stmxcsr``)."""

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            slot = cgutils.alloca_once(builder, ir.IntType(32))
            _mxcsr_call(builder, "llvm.x86.sse.stmxcsr", slot)
            return builder.load(slot)

        return types.uint32(), codegen

    @intrinsic
    def _set_mxcsr(typingctx: Any, value: Any) -> Any:
        """Load ``value`` into this thread's MXCSR (``llvm.x86.sse.ldmxcsr``)."""

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            slot = cgutils.alloca_once(builder, ir.IntType(32))
            builder.store(args[0], slot)
            _mxcsr_call(builder, "llvm.x86.sse.ldmxcsr", slot)
            return context.get_dummy_value()

        return types.none(types.uint32), codegen

    @numba.njit(cache=True, nogil=True)
    def _read_x86() -> int:
        return int(_get_mxcsr())

    @numba.njit(cache=True, nogil=True)
    def _write_x86(value: int) -> None:
        _set_mxcsr(numba.uint32(value))

    _read: Callable[[], int] = _read_x86
    _write: Callable[[int], None] = _write_x86

else:

    def _read() -> int:
        raise RuntimeError("MXCSR exists on x86-64 only")

    def _write(value: int) -> None:
        raise RuntimeError("MXCSR exists on x86-64 only")


def read_mxcsr() -> int:
    """This thread's MXCSR (x86-64 only)."""
    return int(_read())


@contextlib.contextmanager
def flush_subnormals() -> Iterator[None]:
    """FTZ and DAZ on in this thread inside the block (x86-64; elsewhere a no-op)."""
    if not _X86_64:
        yield
        return
    old = read_mxcsr()
    _write(old | FTZ_DAZ)
    try:
        yield
    finally:
        _write(old)


def available() -> bool:
    """Whether :func:`flush_subnormals` changes anything on this machine."""
    return _X86_64
