"""``torch_metallib.ops.define``: a metallib kernel (one per dtype) as a torch.library
operator.

Everything a call needs is checked here, against each kernel's reflection, before the
operator exists: a schema that does not fit the kernel fails at registration, not at the
first call, with one error that lists every problem found. Then the schema is defined with
torch.library, the native kernel (csrc/ops/metallib_op.cpp) is registered as its CPU, MPS
and CUDA implementation (CPU runs natively; MPS and CUDA bind natively and launch through
the backend seam), a fake implementation is derived from the output rules, and an optional
backward is registered with ``torch.library.register_autograd``. Preconditions
(``require``) are checked in Python before the native kernel (_preconditions.py).
"""

import contextlib
import difflib
import functools
import threading
from typing import Callable, Mapping, Optional, Sequence, Union

import torch

from .. import _C
from ..backends.cpu.jit import compile_kernel
from ..errors import DispatchError, KernelArgumentError, KernelExecutionError, OpDefinitionError
from ..backends.cpu.schedule import register_environment_schedule
from ..dispatch.calls import run_plan
from ._kernel_summary import kernel_summary
from ._outputs import Output
from ._preconditions import Precondition
from ._rules import Rule, as_rule
from ._structs import Struct, lay_out

__all__ = ["define", "MetallibOp"]

_SCALAR_TYPES = ("float", "int", "bool")
_namespaces = {}   # namespace -> torch.library.Library("ns", "FRAGMENT")
_operators = {}    # qualified name -> MetallibOp: registrations live as long as the process
_lock = threading.Lock()


class MetallibOp:
    """An operator registered by :func:`define`. Calling it calls the torch operator
    (``torch.ops.<namespace>.<name>``), so it works in eager mode, under ``torch.compile``
    and ``torch.export`` alike.

    Attributes:
        name: the qualified name, e.g. ``"mylib::softmax"``.
        schema: the torch schema string.
        op: the ``torch._ops.OpOverload``.
        kernels: ``{torch.dtype: KernelFunction}``, the kernel each dispatch dtype runs.
    """

    def __init__(self, name, schema, op, kernels, registration):
        self.name = name
        self.schema = schema
        self.op = op
        self.kernels = kernels
        self._registration = registration  # keeps the native kernel registered

    def __call__(self, *args, **kwargs):
        return self.op(*args, **kwargs)

    def __repr__(self):
        dtypes = ", ".join(str(d).replace("torch.", "") for d in self.kernels)
        return f"<MetallibOp {self.schema} [{dtypes}]>"


class _Problems:
    """The problems a definition has, collected so that one OpDefinitionError lists them
    all. A problem found for several kernels in the same words is listed once, naming them."""

    def __init__(self):
        self._found = {}  # the problem's words -> the kernels it was found for ([] for the operator)

    @contextlib.contextmanager
    def check(self, qualname: str = "", kernel: str = ""):
        """Records the OpDefinitionError the block raises instead of raising it; `kernel`
        ("torch.float32 kernel name") is how the block's messages name their kernel."""
        try:
            yield
        except OpDefinitionError as error:
            self.add(str(error), qualname, kernel)

    def add(self, message: str, qualname: str = "", kernel: str = "") -> None:
        prefix = f"{qualname} ({kernel}): "
        if kernel and message.startswith(prefix):
            kernels = self._found.setdefault(message[len(prefix):], [])
            if kernel not in kernels:
                kernels.append(kernel)
        else:
            self._found.setdefault(message, [])

    def raise_found(self, qualname: str) -> None:
        """Raises the problems found, if any: one as its message, several as a numbered list
        of the messages each would raise alone."""
        messages = [f"{qualname} ({'; '.join(kernels)}): {words}" if kernels else words
                    for words, kernels in self._found.items()]
        if len(messages) == 1:
            raise OpDefinitionError(messages[0])
        if messages:
            raise OpDefinitionError(f"{qualname}: {len(messages)} problems, nothing is registered:\n"
                                    + "\n".join(f"  {i}. {m}" for i, m in enumerate(messages, 1)))


class _Schema:
    """The parts of a torch schema the operator needs."""

    def __init__(self, text: str, problems: _Problems):
        try:
            parsed = torch._C.parse_schema(text)
        except RuntimeError as error:
            raise OpDefinitionError(f"schema {text!r} does not parse: {str(error).splitlines()[0]}") from None
        if "::" not in parsed.name:
            raise OpDefinitionError(f"schema {text!r}: name the operator with its namespace, e.g. 'mylib::{parsed.name}'")
        self.text = text
        self.namespace, self.op_name = parsed.name.split("::", 1)
        self.overload = parsed.overload_name
        self.qualname = parsed.name + (f".{parsed.overload_name}" if parsed.overload_name else "")
        self.names, self.kinds, self.mutable, self.defaults, self.kwarg_only = [], [], [], [], []
        for a in parsed.arguments:
            kind = str(a.type)
            if kind not in ("Tensor", "Optional[Tensor]") and kind not in _SCALAR_TYPES:
                problems.add(f"{self.qualname}: argument '{a.name}' has type {a.type}; metallib operators take "
                             f"Tensor, Tensor?, float, int and bool arguments")
            self.names.append(a.name)
            self.kinds.append("Tensor" if kind == "Tensor" else "Tensor?" if kind.startswith("Optional") else kind)
            self.mutable.append(bool(a.alias_info and a.alias_info.is_write))
            self.defaults.append(a.default_value if a.has_default_value() else None)
            self.kwarg_only.append(a.kwarg_only)
        self.returns = [r for r in parsed.returns]
        for r in self.returns:
            if str(r.type) != "Tensor" or r.alias_info is not None:
                problems.add(f"{self.qualname}: returns {r.type}{' (an alias)' if r.alias_info else ''}; metallib "
                             f"operators return new tensors (write into inputs with Tensor(a!) arguments and return "
                             f"nothing)")

    def index(self, name: str, what: str) -> int:
        if name not in self.names:
            raise OpDefinitionError(f"{self.qualname}: {what} names '{name}', which is not an argument of the "
                                    f"schema; expected one of: {', '.join(self.names) or 'none'}")
        return self.names.index(name)

    def values(self, args, kwargs) -> dict:
        """name -> value of a call, defaults filled in."""
        positional = [n for n, k in zip(self.names, self.kwarg_only) if not k]
        values = dict(zip(positional, args))
        values.update(kwargs)
        for name, default in zip(self.names, self.defaults):
            values.setdefault(name, default)
        return values


def _kernel_names(kernel, dtypes) -> dict:
    if isinstance(kernel, Mapping):
        if dtypes is not None:
            raise OpDefinitionError("pass dtypes only with a kernel name template; a kernel mapping lists them")
        names = dict(kernel)
    elif isinstance(kernel, str):
        if "{dtype}" not in kernel:
            if dtypes is None or len(dtypes) != 1:
                raise OpDefinitionError(f"kernel {kernel!r} has no '{{dtype}}' placeholder; give one dtype "
                                        f"(dtypes=[torch.float32]) or a mapping {{dtype: kernel name}}")
        if not dtypes:
            raise OpDefinitionError(f"kernel template {kernel!r} needs dtypes=[...] to fill '{{dtype}}'")
        names = {d: kernel.format(dtype=str(d).replace("torch.", "")) for d in dtypes}
    else:
        raise OpDefinitionError(f"kernel must be a name template with '{{dtype}}' or a mapping {{torch.dtype: name}}, "
                                f"got {kernel!r}")
    for dtype, name in names.items():
        if not isinstance(dtype, torch.dtype) or not isinstance(name, str):
            raise OpDefinitionError(f"kernel mapping: expected torch.dtype -> kernel name, got {dtype!r} -> {name!r}")
    if not names:
        raise OpDefinitionError("kernel: no dtypes given")
    return names


def _function(library, name: str, qualname: str):
    try:
        function = library[name]  # a look-up by name: `in function_names` would scan every name
    except KeyError:
        near = difflib.get_close_matches(name, library.function_names, n=3)
        raise OpDefinitionError(f"{qualname}: the library has no function '{name}'"
                                + (f"; did you mean {', '.join(near)}?" if near else "")) from None
    state = function._dispatch_state()
    if state.problem:
        raise OpDefinitionError(f"{qualname}: kernel {name} cannot run on the CPU: {state.problem}")
    return function


def _type_kind(type_name: str):
    described = _C.metal_type(type_name)
    return (None, 0, []) if described is None else described


class _KernelPlan:
    """One dtype's kernel bound to the schema: what register_op needs, all checked."""

    def __init__(self, schema, function, dtype, index, dispatch, bind, outputs, constants, threadgroup_memory,
                 problems: _Problems):
        self.function = function
        self.summary = kernel_summary(function)  # reflection's arguments and constants, cached by HASH
        self.kernel = f"{dtype} kernel {function.name}"
        self.where = f"{schema.qualname} ({self.kernel})"
        self.schema, self.dtype = schema, dtype
        state = function._dispatch_state()
        self.record = {"dtype": dtype, "spec": state.spec, "index": index, "cooperative": state.cooperative,
                       "serial": state.serial, "sources": [], "constants": [], "threadgroup": []}
        self.tensor_dtypes = {}  # tensor argument -> (dtypes its kernel argument accepts, description)
        self.rules = []  # (where, rule) of bound values: the fake kernel evaluates them as the native one does
        self._problems = problems
        check = functools.partial(problems.check, schema.qualname, self.kernel)
        fixed = self._constants(constants, check)
        arguments = [a for a in self.summary.buffers if a.kind != "threadgroup"]
        by_name = {a.name: a for a in arguments}
        for key in bind:
            if key not in by_name:
                near = difflib.get_close_matches(key, list(by_name), n=1, cutoff=0.5)
                with check():
                    raise OpDefinitionError(f"{self.where}: bind names kernel argument '{key}', which the kernel does "
                                            f"not have; its arguments are: {', '.join(by_name)}"
                                            + (f". Did you mean '{near[0]}'?" if near else ""))
        output_names = list(outputs)
        written_outputs, written_inputs = set(), set()
        for a in arguments:
            source = bind.get(a.name, a.name if a.name in schema.names or a.name in output_names else None)
            guard_off = a.function_constant is not None and fixed.get(a.function_constant) is False
            if source is None:
                if a.unused or guard_off:
                    continue
                with check():
                    raise OpDefinitionError(f"{self.where}: kernel argument {self._describe(a)} has no value: name a "
                                            f"schema argument or output '{a.name}', or map it with bind={{'{a.name}': "
                                            f"...}} (an argument or output name, an ops rule or a number)")
                continue
            with check():
                self._bind(a, source, output_names, outputs, dispatch, written_outputs, written_inputs)
        for name in output_names:
            if name not in written_outputs:
                with check():
                    raise OpDefinitionError(f"{self.where}: output '{name}' is bound to no argument the kernel "
                                            f"writes, so it would be returned uninitialized; bind it with "
                                            f"bind={{<kernel argument>: '{name}'}}")
        for i, name in enumerate(schema.names):
            if schema.mutable[i] and name not in written_inputs:
                with check():
                    raise OpDefinitionError(f"{self.where}: the schema marks '{name}' as mutated (Tensor(a!)), but no "
                                            f"argument the kernel writes is bound to it; bind one, bind={{<kernel "
                                            f"argument>: '{name}'}}, or declare it Tensor {name}")
        wanted = {a.binding: a for a in self.summary.buffers if a.kind == "threadgroup"}
        for binding, size in (threadgroup_memory or {}).items():
            with check():
                if binding not in wanted:
                    raise OpDefinitionError(f"{self.where}: threadgroup_memory names threadgroup({binding}); the "
                                            f"kernel takes {', '.join(f'{b} ({a.name})' for b, a in wanted.items()) or 'none'}")
                self.record["threadgroup"].append((binding, self._rule(size, f"threadgroup_memory[{binding}]")))
        for binding, a in wanted.items():
            if binding not in (threadgroup_memory or {}):
                with check():
                    raise OpDefinitionError(f"{self.where}: kernel argument {self._describe(a)} needs its size: pass "
                                            f"threadgroup_memory={{{binding}: <bytes or ops rule>}}")

    @staticmethod
    def _describe(a) -> str:
        return f"'{a.name}' ({'threadgroup' if a.kind == 'threadgroup' else 'buffer'}({a.binding}), {a.type_name})"

    def _rule(self, value, what):
        return _rule_tokens(self.schema, self.where, value, what)

    def _constants(self, constants, check) -> dict:
        """Registers the function constants; returns the fixed ones by name."""
        declared = {c.name: slot for slot, c in enumerate(self.summary.function_constants)}
        fixed = {}
        for name, value in (constants or {}).items():
            with check():
                self._constant(declared, name, value, fixed)
        missing = [c.name for c in self.summary.function_constants if c.required and c.name not in (constants or {})]
        if missing:
            given = [name for name in (constants or {}) if name in declared]
            with check():
                raise OpDefinitionError(f"{self.where}: the kernel needs function constants {', '.join(missing)}, "
                                        f"got {', '.join(given) if given else 'none'}; pass "
                                        f"constants={{name: value or ops rule}}")
        return fixed

    def _constant(self, declared, name, value, fixed) -> None:
        if name not in declared:
            raise OpDefinitionError(f"{self.where}: constants names '{name}'; the kernel declares "
                                    f"{', '.join(declared) or 'no function constants'}")
        if isinstance(value, Rule):
            self.record["constants"].append((declared[name], "rule", self._rule(value, f"constant {name}")))
        elif isinstance(value, str):
            index = self.schema.index(value, f"constants['{name}']")
            if self.schema.kinds[index] not in _SCALAR_TYPES:
                raise OpDefinitionError(f"{self.where}: constant '{name}' takes '{value}', a "
                                        f"{self.schema.kinds[index]}; constants take float, int or bool arguments")
            self.record["constants"].append((declared[name], "input", index))
        elif isinstance(value, (bool, int, float)):
            fixed[name] = value
            self.record["constants"].append((declared[name], "number", value))
        else:
            raise OpDefinitionError(f"{self.where}: constant '{name}': expected a number, bool, argument name "
                                    f"or ops rule, got {value!r}")

    def _bind(self, a, source, output_names, outputs, dispatch, written_outputs, written_inputs):
        writes = a.access != "read"
        kind, components, dtypes = _type_kind(a.type_name)
        what = f"kernel argument {self._describe(a)}"
        if isinstance(source, str) and source in output_names:
            written_outputs.add(source)  # bound, though maybe refused below: one problem, not two
            if not writes or a.address_space != "device":
                raise OpDefinitionError(f"{self.where}: output '{source}' is bound to {what}, which the kernel only "
                                        f"reads; bind outputs to device buffers the kernel writes")
            output = outputs[source]
            if not isinstance(output, Output):  # refused as an output already
                return
            dtype = self.dtype if output.dtype_like == dispatch else output.dtype
            if dtype is not None and kind is not None and dtype not in dtypes:
                raise OpDefinitionError(f"{self.where}: output '{source}' is {dtype}, but {what} holds "
                                        f"{' or '.join(map(str, dtypes))}")
            self.record["sources"].append(("output", a.position, output_names.index(source)))
        elif isinstance(source, str):
            index = self.schema.index(source, f"bind['{a.name}']")
            schema_kind = self.schema.kinds[index]
            if schema_kind.startswith("Tensor"):
                if writes:
                    if not self.schema.mutable[index]:
                        raise OpDefinitionError(f"{self.where}: the kernel writes {what}, which is bound to "
                                                f"'{source}', but the schema does not mark '{source}' as mutated; "
                                                f"declare it Tensor(a!) {source} or bind an output")
                    written_inputs.add(source)
                if source == dispatch and kind is not None and self.dtype not in dtypes:
                    raise OpDefinitionError(f"{self.where}: '{source}' is {self.dtype} for this kernel, but {what} "
                                            f"holds {' or '.join(map(str, dtypes))}")
            else:
                self._check_scalar(a, what, writes, kind, components, f"'{source}' ({schema_kind})", schema_kind)
            if schema_kind.startswith("Tensor") and kind is not None:
                self.tensor_dtypes[source] = (dtypes, what)
            self.record["sources"].append(("input", a.position, index))
        elif isinstance(source, Rule):
            self._check_scalar(a, what, writes, kind, components, f"rule {source.text}", "int")
            self.record["sources"].append(("rule", a.position, self._rule(source, f"bind['{a.name}']")))
            self.rules.append(source)
        elif isinstance(source, (Struct, tuple, list)):
            self._bind_packed(a, what, writes, source)
        elif isinstance(source, (bool, int, float)):
            number_kind = "bool" if isinstance(source, bool) else "int" if isinstance(source, int) else "float"
            self._check_scalar(a, what, writes, kind, components, repr(source), number_kind)
            self.record["sources"].append(("number", a.position, source))
        else:
            raise OpDefinitionError(f"{self.where}: bind['{a.name}']: expected an argument or output name, an ops "
                                    f"rule, a number, ops.struct(...) or a tuple of them, got {source!r}")

    def _bind_packed(self, a, what, writes, source):
        """A struct (ops.struct) or an array (a tuple or list) the native kernel packs at each
        call; every problem of its fields is recorded, each on its own."""
        shown = "ops.struct(...)" if isinstance(source, Struct) else f"a {type(source).__name__}"
        if writes:
            raise OpDefinitionError(f"{self.where}: the kernel writes {what}; bind a tensor (an output or a "
                                    f"Tensor(a!) argument), not {shown}")
        if a.kind != "buffer":
            raise OpDefinitionError(f"{self.where}: {what} is an argument buffer, which operators cannot bind yet; "
                                    f"expected a buffer argument for {shown}")
        total, leaves, problems = lay_out(self.schema, self.where, a, source)
        fields = []
        for leaf in leaves:
            kind, value = leaf.source
            try:
                if kind == "rule":
                    fields.append((leaf.offset, leaf.type_name, leaf.path, "rule",
                                   self._rule(value, f"bind['{leaf.path}']")))
                    self.rules.append(value)
                elif kind == "input":
                    fields.append((leaf.offset, leaf.type_name, leaf.path, "input", self.schema.names.index(value)))
                else:
                    fields.append((leaf.offset, leaf.type_name, leaf.path, "number", value))
            except OpDefinitionError as error:
                problems.append(str(error))
        if problems:
            for message in problems[:-1]:
                self._problems.add(message, self.schema.qualname, self.kernel)
            raise OpDefinitionError(problems[-1])
        self.record["sources"].append(("packed", a.position, (total, fields)))

    def _check_scalar(self, a, what, writes, kind, components, given, given_kind):
        if writes:
            raise OpDefinitionError(f"{self.where}: the kernel writes {what}; bind a tensor (an output or a "
                                    f"Tensor(a!) argument), not {given}")
        if kind is None or components != 1:
            raise OpDefinitionError(f"{self.where}: {what} is not a scalar; bind a tensor, not {given}")
        if given_kind == "float" and kind != "float":
            raise OpDefinitionError(f"{self.where}: {what} holds {a.type_name} values; {given} is a float")


def define(schema: str, library, kernel: Union[str, Mapping], *, dtypes=None, dispatch: Optional[str] = None,
           bind: Optional[Mapping] = None, outputs: Optional[Mapping[str, Output]] = None, threads=None,
           group_size=None, constants: Optional[Mapping] = None, threadgroup_memory: Optional[Mapping] = None,
           require: Optional[Sequence[Rule]] = None, backward: Optional[Callable] = None,
           setup_context: Optional[Callable] = None, checked: bool = False) -> MetallibOp:
    """Registers kernels of `library` as the torch operator `schema`; the documentation's
    "Kernels as operators" page (docs/guide/operators.md) has a complete example.

    Args:
        schema: a torch schema with namespace, e.g. ``"mylib::softmax(Tensor x) -> Tensor"``.
            Arguments are Tensor, Tensor?, float, int or bool; mutated tensors are marked
            ``Tensor(a!)``; returns are new tensors.
        library: the :class:`~torch_metallib.Library` holding the kernels.
        kernel: ``{torch.dtype: kernel name}``, or a template such as
            ``"v_Sigmoid{dtype}{dtype}"`` filled from `dtypes` (``float32``, ``float16``...).
        dtypes: the dtypes a template is filled with.
        dispatch: the tensor argument whose dtype picks the kernel; default the first.
        bind: kernel argument name -> an argument or output name, an ops rule
            (``ops.numel("x")``) or a number. Kernel arguments not listed bind to the
            argument or output of the same name. A struct argument (``constant
            GEMMParams& params`` or a pointer to one) takes ``ops.struct(M=ops.size("a",
            0), ...)``: every field by the name reflection gives it
            (``KernelFunction.arguments[i].struct_fields``), each a rule, a number, the name
            of a float, int or bool argument, a tuple for an array field or another
            ``ops.struct`` for a nested struct; ``defaults=0`` fills the fields not given. An
            array reference (``constant int64_t (&strides)[3]``) takes a tuple or list of as
            many rules or numbers; a pointer to values, as many as given. The operator packs
            them at each call; a value that does not fit its field raises
            KernelArgumentError.
        outputs: returned tensors in schema order, name -> ``ops.like(...)`` or
            ``ops.empty(...)``; the names are what `bind` refers to.
        threads: the grid: an ops rule or int, or 1-3 of them.
        group_size: the threadgroup size, the same way; default as for kernel calls.
        constants: function constant name -> a number, a float/int/bool argument's name
            (each new value compiles the kernel once more), or an ops rule.
        threadgroup_memory: ``[[threadgroup(i)]]`` index -> bytes (int or ops rule).
        require: preconditions every call must meet, comparisons of ops rules such as
            ``ops.size("q", -1) == 64`` or ``ops.size("x", 0) % 4 == 0`` (``==``, ``!=``,
            ``<``, ``<=``, ``>``, ``>=`` between rules or ints). They are checked before
            anything runs, in eager calls and in the fake kernel; one that does not hold
            raises KernelArgumentError naming the operator, the precondition and the values
            found. Under ``torch.compile`` they become guards or runtime assertions.
        backward: ``backward(ctx, *grads)`` returning one gradient per input (None where
            there is none), as for ``torch.library.register_autograd``.
        setup_context: ``setup_context(ctx, inputs, output)``, saving what backward needs.
        checked: True runs every call checked (docs/reliability.md, "Checked execution"),
            as ``checked=True`` does for one kernel call; False (the default) leaves it to a
            ``torch_metallib.checked()`` block or ``TORCH_METALLIB_CHECKED=1``. An access
            outside the memory a call bound then raises KernelMemoryError naming the
            operator and the kernel instead of corrupting memory.

    Raises:
        OpDefinitionError: the schema, kernels and rules do not fit together; one error
            lists every problem found, each naming the kernel and argument, what was
            expected and found, and how to fix it. Nothing is registered then.
    """
    problems = _Problems()
    parsed = _Schema(schema, problems)  # a schema that does not parse is the one problem there is
    qualname = parsed.qualname
    names = {}
    with problems.check():
        names = _kernel_names(kernel, dtypes)
    bind = dict(bind or {})
    outputs = dict(outputs or {})
    for name, rule in outputs.items():
        with problems.check():
            _check_output(parsed, name, rule)
    returned = {n: o for n, o in outputs.items() if n not in parsed.names}
    if len(returned) != len(parsed.returns):
        problems.add(f"{qualname}: the schema returns {len(parsed.returns)} tensors; give one allocation rule for "
                     f"each, outputs={{name: ops.like(...) or ops.empty(...)}} (got {len(returned)}: "
                     f"{', '.join(returned) or 'none'})")
    tensors = [n for n, k in zip(parsed.names, parsed.kinds) if k == "Tensor"]
    if dispatch is None:
        if not tensors:
            problems.add(f"{qualname}: the schema has no Tensor argument to pick kernels by dtype")
        dispatch = tensors[0] if tensors else None
    else:
        with problems.check():
            if parsed.kinds[parsed.index(dispatch, "dispatch")] != "Tensor":
                raise OpDefinitionError(f"{qualname}: dispatch names '{dispatch}', which is not a Tensor argument; "
                                        f"expected one of: {', '.join(tensors) or 'none'}")
    if backward is not None and any(parsed.mutable):
        problems.add(f"{qualname}: a backward needs a functional schema, but this one mutates "
                     f"{', '.join(n for n, m in zip(parsed.names, parsed.mutable) if m)}; register the backward on "
                     f"the functional variant")
    if threads is None:
        problems.add(f"{qualname}: threads is required, got none; give the grid as an ops rule, e.g. "
                     f"threads=ops.numel('x')")
    preconditions = []
    for i, rule in enumerate([require] if isinstance(require, Rule) else list(require or [])):
        with problems.check():
            preconditions.append(Precondition(rule, f"{qualname}: require[{i}]"))
            _rule_tokens(parsed, qualname, rule, f"require[{i}]")
    plans = []
    for index, (dtype, name) in enumerate(names.items()):
        function = None
        with problems.check():
            function = _function(library, name, qualname)
        if function is not None:
            plans.append(_KernelPlan(parsed, function, dtype, index, dispatch, bind, returned, constants,
                                     threadgroup_memory, problems))
    grid = {}
    for what, extents in (("threads", threads), ("group_size", group_size)):
        with problems.check():
            if extents is not None:
                grid[what] = [_rule_tokens(parsed, qualname, r, what) for r in _extents(extents, qualname, what)]
    shapes = {}
    for n, o in outputs.items():
        with problems.check():
            if isinstance(o, Output):
                shapes[n] = [_rule_tokens(parsed, qualname, r, f"outputs['{n}'] shape") for r in o.shape]
    problems.raise_found(qualname)
    threads_rules, group_rules = grid["threads"], grid.get("group_size", [])
    output_records = [
        {"mutated": parsed.names.index(n) if n in parsed.names else -1,
         "shape_like": -1 if o.shape_like is None else parsed.names.index(o.shape_like), "shape": shapes[n],
         "dtype_like": -1 if o.dtype_like is None else parsed.names.index(o.dtype_like), "dtype": o.dtype}
        for n, o in outputs.items()
    ]
    functions = [p.function for p in plans]

    def run_on_backend(index, plan, device, checked_call):
        """Runs a bound plan through the backend seam: GPU calls, and CPU calls that run
        checked (`checked_call`: checked by definition or asked for by a block or the
        environment; None lets run_plan look those up itself)."""
        try:
            run_plan(functions[index], plan, device, True if checked_call else None)
        except KernelExecutionError as error:  # named after the operator, as native failures are
            if str(error).startswith(qualname):
                raise
            raise type(error)(f"{qualname}: {error}") from None

    def compile_for(index, constant_values, cooperative, lanes, copies):
        compiled = compile_kernel(functions[index], constant_values, plans[index].record["serial"], cooperative, copies,
                                  lanes=lanes)
        return list(compiled.launchers), compiled.serial, compiled.lanes

    with _lock:
        if parsed.qualname in _operators:
            raise OpDefinitionError(f"{parsed.qualname} is already defined by torch_metallib.ops in this process")
        # Whatever can fail goes before namespace.define: torch cannot take a definition back.
        register_environment_schedule()
        namespace = _namespaces.get(parsed.namespace)
        if namespace is None:
            namespace = _namespaces[parsed.namespace] = torch.library.Library(parsed.namespace, "FRAGMENT")
        try:
            namespace.define(schema.split("::", 1)[1])
        except RuntimeError as error:
            raise OpDefinitionError(f"{parsed.qualname}: torch.library refused the schema: "
                                    f"{str(error).splitlines()[0]}") from None
        registration = _C.register_op(parsed.qualname, parsed.names, parsed.mutable, parsed.names.index(dispatch),
                                      [p.record for p in plans], output_records, threads_rules, group_rules,
                                      compile_for, run_on_backend, bool(checked))
        torch.library.register_fake(parsed.qualname, _fake(parsed, outputs, dispatch, plans, threads, group_size,
                                                           preconditions), lib=namespace)
        if backward is not None:
            torch.library.register_autograd(parsed.qualname, backward, setup_context=setup_context, lib=namespace)
        packet = getattr(getattr(torch.ops, parsed.namespace), parsed.op_name)
        op = getattr(packet, parsed.overload or "default")
        if preconditions:
            _check_before_the_kernels(namespace, parsed, op, preconditions)
        defined = _operators[parsed.qualname] = MetallibOp(parsed.qualname, schema, op,
                                                           {p.dtype: p.function for p in plans}, registration)
    return defined


def _check_output(schema, name, rule) -> None:
    if not isinstance(rule, Output):
        raise OpDefinitionError(f"{schema.qualname}: outputs['{name}']: expected ops.like(...) or ops.empty(...), "
                                f"got {rule!r}")
    for argument in (rule.shape_like, rule.dtype_like):
        if argument is not None and schema.kinds[schema.index(argument, f"outputs['{name}']")] != "Tensor":
            raise OpDefinitionError(f"{schema.qualname}: outputs['{name}'] takes shape or dtype from "
                                    f"'{argument}', which is not a Tensor argument")
    if name in schema.names and not schema.mutable[schema.names.index(name)]:
        raise OpDefinitionError(f"{schema.qualname}: outputs['{name}'] names an argument the schema does not mark "
                                f"as mutated; rules for arguments check out= tensors (Tensor(a!) {name})")


def _rule_tokens(schema, where, value, what):
    """(text, tokens) of rule `value` for the native kernel, its argument names checked
    against the schema and replaced by their positions."""
    try:
        rule = as_rule(value)
    except Exception as error:
        raise OpDefinitionError(f"{where}: {what}: {error}") from None

    def index_of(name, reads, text):
        index = schema.index(name, f"rule {text}")
        kind = schema.kinds[index]
        accepted = {"Tensor": ("Tensor",), "int": ("int", "bool"), "Tensor?": ("Tensor?",)}[reads]
        if kind not in accepted:
            raise OpDefinitionError(f"{schema.qualname}: rule {text} reads '{name}' as {' or '.join(accepted)}, "
                                    f"but it is a {kind}")
        return index

    return rule.tokens(index_of)


def _extents(value, qualname, what) -> list:
    extents = list(value) if isinstance(value, (tuple, list)) else [value]
    if not 1 <= len(extents) <= 3:
        raise OpDefinitionError(f"{qualname}: {what}: expected 1-3 extents, got {len(extents)}")
    return extents


# The dispatch keys below BackendSelect: the backends' kernels (native on CPU, MPS and CUDA;
# the fake kernel on Meta).
_BELOW_BACKEND_SELECT = torch._C._dispatch_keyset_full_after(torch._C.DispatchKey.BackendSelect)


def _check_before_the_kernels(namespace, schema, op, preconditions) -> None:
    """Registers the preconditions' check as the operator's BackendSelect kernel, which every
    eager call reaches after autograd and before the device's kernel (the native kernels
    evaluate no preconditions); it costs a Python call, a few microseconds. Fake tensors
    do not reach it: the fake kernel checks the same preconditions."""

    def check_then_run(keyset, *args, **kwargs):
        values = schema.values(args, kwargs)
        for precondition in preconditions:
            precondition.check(schema.qualname, values)
        return op.redispatch(keyset & _BELOW_BACKEND_SELECT, *args, **kwargs)

    name = schema.op_name + (f".{schema.overload}" if schema.overload else "")
    namespace.impl(name, check_then_run, "BackendSelect", with_keyset=True)


def _fake(schema, outputs, dispatch, plans, threads, group_size, preconditions=()):
    """The fake (meta) implementation: refuses what the native kernel refuses before it
    runs (preconditions, dtypes, devices, out= shapes, grid rules that cannot be evaluated)
    and allocates the outputs from their rules."""
    by_dtype = {plan.dtype: plan for plan in plans}
    supported = ", ".join(map(str, by_dtype))
    grid = [as_rule(r) for r in _extents(threads, schema.qualname, "threads")]
    if group_size is not None:
        grid += [as_rule(r) for r in _extents(group_size, schema.qualname, "group_size")]

    def fake(*args, **kwargs):
        values = schema.values(args, kwargs)
        for precondition in preconditions:  # first, as in eager calls
            precondition.check(schema.qualname, values)
        plan = by_dtype.get(values[dispatch].dtype)
        if plan is None:
            raise KernelArgumentError(f"{schema.qualname}: argument '{dispatch}' has dtype {values[dispatch].dtype}; "
                                      f"this operator has kernels for {supported}. Convert it with .to(...)")
        devices = {name: v.device for name, v in values.items() if isinstance(v, torch.Tensor)}
        if len(set(devices.values())) > 1:
            raise KernelArgumentError(f"{schema.qualname}: tensors on different devices "
                                      f"({', '.join(f'{n}: {d}' for n, d in devices.items())}); move them to one device")
        made = []
        for name, rule in outputs.items():
            try:
                tensor = rule.allocate(values)
            except (ZeroDivisionError, IndexError, DispatchError) as error:
                raise DispatchError(f"{schema.qualname}: {error}") from None
            if name not in values:
                made.append(tensor)
            elif values[name].shape != tensor.shape or values[name].dtype != tensor.dtype:
                raise DispatchError(f"{schema.qualname}: argument '{name}' is {values[name].dtype} of shape "
                                    f"{list(values[name].shape)}; the kernel writes {tensor.dtype} of shape "
                                    f"{list(tensor.shape)}. Pass a tensor of that shape and dtype")
        for rule in grid:
            try:
                rule.evaluate(values)
            except (ZeroDivisionError, IndexError) as error:  # as the native evaluator refuses them
                raise DispatchError(f"{schema.qualname}: {error}") from None
        for rule in plan.rules:  # struct fields, array elements and scalars bound to rules
            try:
                rule.evaluate(values)
            except (ZeroDivisionError, IndexError) as error:
                raise DispatchError(f"{schema.qualname}: {error}") from None
        for name, (dtypes, what) in plan.tensor_dtypes.items():
            value = values[name]
            if value is not None and value.dtype not in dtypes and value.dim() > 0:
                raise KernelArgumentError(f"{schema.qualname}: {plan.function.name}: {what}: expected a tensor of "
                                          f"{' or '.join(map(str, dtypes))}, got {value.dtype}")
        return None if not made else made[0] if len(made) == 1 else tuple(made)

    return fake
