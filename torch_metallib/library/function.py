"""KernelFunction: one function of a loaded library, a thin view over the native container."""

import hashlib
import threading
from typing import Optional, Tuple

from ..container.function_constant import FunctionConstant
from ..container.tables import DATA_TYPES, FUNCTION_TYPES, name_of
from ..dispatch.backend import backend_for
from .. import _C
from ..dispatch.calls import call, dispatch_state, run_plan
from ..dispatch.checked_mode import block_storage_bounds
from ..errors import MetallibFormatError
from ..reflection.air_arguments import Argument
from ..reflection.reflect import Reflection, ThreadgroupVariable, reflect

__all__ = ["FunctionConstant", "KernelFunction"]


class KernelFunction:
    """One function of a :class:`~torch_metallib.Library`.

    Obtained from ``lib["name"]`` or ``lib.name``; keeps its library (and so the file's
    bytes) alive. Container attributes are read without copying; the reflection
    attributes (`arguments`, `signature`, ...) parse the AIR bitcode with llvmlite on first
    access (about 0.5 ms), once per function, also when several threads ask at once.

    Example:
        >>> k = lib.vv_Addfloat32                                        # doctest: +SKIP
        >>> k.signature                                                  # doctest: +SKIP
        'kernel void vv_Addfloat32(device const float* a [[buffer(0)]], ...)'
        >>> [(a.name, a.binding, a.access) for a in k.buffers]           # doctest: +SKIP
        [('a', 0, 'read'), ('b', 1, 'read'), ('c', 2, 'read_write'), ('size', 3, 'read')]
    """

    __slots__ = ("_library", "_index", "_record", "_bitcode", "_reflection", "_lock", "_call_state")

    def __init__(self, library, index: int, record: dict):
        self._library = library
        self._index = index
        self._record = record
        self._bitcode = None
        self._reflection = None
        self._lock = threading.RLock()  # reentrant: building the spec reads .reflection
        self._call_state = None

    @property
    def library(self):
        """The :class:`~torch_metallib.Library` this function belongs to."""
        return self._library

    @property
    def name(self) -> str:
        return self._record["name"]

    @property
    def type(self) -> str:
        """``"kernel"``, ``"vertex"``, ``"fragment"``, ``"visible"``, ``"intersection"``, ..."""
        return name_of(FUNCTION_TYPES, self._record["type"])

    @property
    def hash(self) -> str:
        """SHA-256 of the function's module bytes (``HASH`` tag), 64 lowercase hex digits."""
        return self._record["hash"].hex()

    @property
    def air_version(self) -> Optional[Tuple[int, int]]:
        """AIR version of the bitcode, e.g. ``(2, 6)``; None without a ``VERS`` tag."""
        versions = self._record["versions"]
        return None if versions is None else tuple(versions[:2])

    @property
    def language_version(self) -> Optional[Tuple[int, int]]:
        """Metal Shading Language version, e.g. ``(3, 1)``; None without a ``VERS`` tag."""
        versions = self._record["versions"]
        return None if versions is None else tuple(versions[2:])

    @property
    def declared_constants(self) -> list:
        """The function constants the container's ``CNST`` tag lists (no bitcode parse;
        empty without the tag). `function_constants` reads them from the bitcode."""
        return [
            FunctionConstant(name, name_of(DATA_TYPES, type_code), index, required)
            for name, type_code, index, required in self._record["constants"]
        ]

    @property
    def module_size(self) -> int:
        """Bytes of the function's module: Darwin wrapper + bitcode + padding (``MDSZ``)."""
        return self._record["module_size"]

    @property
    def module(self) -> memoryview:
        """The module bytes the ``HASH`` covers (wrapper + bitcode + padding), zero-copy."""
        offset = self._record["module_offset"]
        return self._library._view[offset : offset + self._record["module_size"]]

    @property
    def bitcode(self) -> memoryview:
        """The raw LLVM bitcode (without the Darwin wrapper): a read-only, zero-copy view.

        On first use the module is checked against the function's ``HASH`` (SHA-256), so
        damaged bytes never reach LLVM (reflection, the JIT).

        Raises:
            MetallibFormatError: the module's wrapper or bitcode magic is malformed, or its
                SHA-256 is not the ``HASH`` the file records.
        """
        if self._bitcode is None:
            offset, size = self._library._container.bitcode_range(self._index)
            self._check_hash()
            self._bitcode = self._library._view[offset : offset + size]
        return self._bitcode

    def _check_hash(self) -> None:
        """Raises MetallibFormatError unless the module's SHA-256 is its HASH tag."""
        expected = self._record["hash"]
        module = self.module
        if len(expected) != 32 or hashlib.sha256(module).digest() == expected:
            return
        start = self._record["module_offset"]
        hash_at = next(offset for tag, offset, _payload in self._record["tags"] if tag == "HASH")
        field = f"function {self._index} '{self.name}' HASH"
        raise MetallibFormatError(
            f"metallib: {field} at byte offset {hash_at}: expected the SHA-256 of its {len(module)}-byte "
            f"module (bytes {start} to {start + len(module)}), got a different digest. The module or its "
            f"HASH is damaged: rebuild or re-download the .metallib", offset=hash_at, field=field)

    @property
    def tags(self) -> list:
        """Raw ``(tag, file offset, payload)`` tuples of the function-list group."""
        return list(self._record["tags"])

    # --- reflection (from the AIR bitcode) ---------------------------------------------
    @property
    def reflection(self) -> Reflection:
        """Everything below in one immutable record, parsed once and cached.

        Raises:
            ReflectionError: llvmlite cannot parse the bitcode, or its AIR metadata is not
                in the expected shape (the message names the metadata node). Other
                functions of the library are not affected.
            MetallibFormatError: the module's wrapper is malformed.
        """
        reflection = self._reflection
        if reflection is None:
            with self._lock:
                reflection = self._reflection
                if reflection is None:
                    reflection = self._reflection = reflect(self.name, self.bitcode, self.type)
        return reflection

    @property
    def arguments(self) -> Tuple[Argument, ...]:
        """Every parameter in IR order: buffers, threadgroup memory, textures, samplers
        and builtins, as :class:`~torch_metallib.Argument` records."""
        return self.reflection.arguments

    @property
    def buffers(self) -> Tuple[Argument, ...]:
        """The bindable arguments (everything but builtins), sorted by kind and binding."""
        return self.reflection.buffers

    @property
    def builtins(self) -> Tuple[Argument, ...]:
        """The builtin parameters (``thread_position_in_grid``, ...), in IR order."""
        return self.reflection.builtins

    @property
    def function_constants(self) -> Tuple[FunctionConstant, ...]:
        """The function constants from ``!air.function_constants`` (name, type, index,
        required). They equal `declared_constants` wherever the file has a ``CNST`` tag."""
        return self.reflection.function_constants

    @property
    def max_total_threads_per_threadgroup(self) -> Optional[int]:
        """The kernel's ``max_total_threads_per_threadgroup`` attribute, None if unset."""
        return self.reflection.max_total_threads_per_threadgroup

    def pipeline_limits(self, constants=None) -> dict:
        """The limits Metal gives this kernel's compute pipeline on this Mac's GPU, for
        these function-constant values (the pipeline is built and cached, as a call would):
        ``max_total_threads_per_threadgroup``, ``thread_execution_width`` and
        ``static_threadgroup_memory_length``. Calls on ``mps`` tensors are checked against
        them before anything is encoded.

        Raises:
            UnsupportedDeviceError: this build has no Metal backend (every platform but macOS).
            DispatchError: a required function constant is missing or has the wrong type.
            UnsupportedKernelError: Metal could not build the pipeline.
        """
        backend = backend_for("mps", self.name)
        return backend.limits(self, self._dispatch_state().spec.pipeline_plan(constants))

    @property
    def threadgroup_variables(self) -> Tuple[ThreadgroupVariable, ...]:
        """``threadgroup`` arrays declared inside the kernel, with size and alignment."""
        return self.reflection.threadgroup_variables

    @property
    def threadgroup_memory_static(self) -> int:
        """Bytes of threadgroup memory the kernel declares itself (its threadgroup
        variables laid out in order with their alignment), not counting arguments."""
        return self.reflection.threadgroup_memory_static

    @property
    def intrinsics(self) -> Tuple[str, ...]:
        """The ``air.*`` functions the kernel calls, sorted, e.g. ``"air.wg.barrier"``."""
        return self.reflection.intrinsics

    @property
    def uses_barriers(self) -> bool:
        """Whether it calls ``air.wg.barrier`` or ``air.simdgroup.barrier``."""
        return self.reflection.uses_barriers

    @property
    def uses_simdgroup_ops(self) -> bool:
        """Whether it calls SIMD-group or quad-group intrinsics (shuffles, reductions,
        ballots, simdgroup matrices, SIMD-group barriers)."""
        return self.reflection.uses_simdgroup_ops

    @property
    def cpu_scheme(self) -> Optional[str]:
        """How its last call on the CPU ran its threads: ``"threads"`` (one after another,
        for kernels whose threads never meet), ``"lanes"`` (cut at its barriers and
        SIMD-group functions into loops over threads), ``"vector"`` (lanes, some of its
        regions run a vector of threads at a time: TORCH_METALLIB_CPU_VECTORIZE), or
        ``"coroutines"`` (each thread a coroutine: kernels with tensor operations, permuted
        schedules and checked calls). None before its first CPU call."""
        state = self._dispatch_state()
        native = state.launchers.last_cpu_scheme if state.launchers is not None else None
        return native or state.prepared.get("scheme")

    @property
    def signature(self) -> str:
        """A Metal-like declaration, e.g. ``kernel void f(device const float* a [[buffer(0)]],
        uint i [[thread_position_in_grid]])``."""
        return self.reflection.signature

    # --- calling ------------------------------------------------------------------------
    def __call__(self, *args, threads=None, group_size=None, constants=None, threadgroup_memory=None,
                 checked=None, storage_bounds=None, **kwargs) -> None:
        """Runs the kernel on the tensors given; it writes into them and returns None.

        Args:
            *args: values for the kernel's bindable arguments in binding-index order
                (``[[buffer(0)]]``, ``[[buffer(1)]]``, ...): tensors, Python numbers or
                sequences (packed as the argument's Metal type), 0-d tensors (by value),
                or bytes (structs).
            threads: grid size: an int or 1-3 ints; default: the numel of the first tensor.
            group_size: threadgroup size: an int or 1-3 ints; default (min(threads, max
                threads per threadgroup), 1, 1).
            constants: function-constant values by name or index, e.g. ``{"has_batch": False}``.
            threadgroup_memory: bytes of each ``[[threadgroup(i)]]`` argument, ``{i: nbytes}``
                (a multiple of 16); each threadgroup gets its own, uninitialized.
            checked: bounds-check every memory access (True), or not (False); None
                follows ``torch_metallib.checked()`` and ``TORCH_METALLIB_CHECKED``.
                Checked, a tensor is bounded by its view: the bytes its sizes and strides reach.
            storage_bounds: names of tensor arguments that checked execution bounds by their
                whole storage instead, for a kernel that indexes past the view on purpose,
                e.g. ``{"out"}``; adds to ``torch_metallib.checked(storage_bounds=...)``.
            **kwargs: arguments by their Metal name, e.g. ``out=y``.

        Raises:
            KernelArgumentError: an argument is missing, unknown, of the wrong dtype or device;
                a written tensor whose elements overlap (an expanded view).
            KernelExecutionError: a threadgroup barrier not every thread reaches (deadlock).
            KernelMemoryError: checked, an access outside the memory the call bound.
            DispatchError: bad threads/group_size, too few bytes, missing function constants.
            UnsupportedKernelError: the kernel needs what this backend cannot do yet.
        """
        state = self._call_state
        if state is not None and state.launchers is not None and checked is None and not block_storage_bounds():
            # Bound natively and, where a launcher the backend made accepts the plan, run there
            # (the Python around this costs about a third of a small call).
            plan = _C.call(state.spec, state.launchers, args, kwargs, threads, group_size, constants,
                           threadgroup_memory, storage_bounds)
            if plan is not None:
                run_plan(self, plan, plan.device)
            return
        call(self, args, kwargs, threads, group_size, constants, threadgroup_memory, checked, storage_bounds)

    def _dispatch_state(self):
        """What calling needs (see dispatch.calls.DispatchState), built once."""
        if self._call_state is None:
            with self._lock:
                if self._call_state is None:
                    self._call_state = dispatch_state(self)
        return self._call_state

    def __repr__(self) -> str:
        air = ".".join(map(str, self.air_version)) if self.air_version else "?"
        return (
            f"<KernelFunction {self.name!r} type={self.type} air={air} "
            f"hash={self.hash[:12]} module={self.module_size} bytes>"
        )
