"""Launching a generated kernel without Triton's per-call argument specialisation.

`kernel[grid](...)` re-derives, on every call, the specialisation of every
argument (dtype, 16-byte alignment of each pointer, divisibility by 16 and
== 1 of each int, every constexpr), builds a cache key string and looks the
compiled kernel up.  For a pack that is most of the ~20 µs host cost per call.
Here the dispatcher's plan key already fixes everything Triton specialises on
except the pointers' alignment, so a `DirectLaunch` made for one plan:

* records, once, what the generated `_launch_*` function passes to the kernel
  (grid, arguments, options) by handing it a `Recorder` instead of the kernel;
* keys compiled kernels by (current CUDA device, which tensor arguments are not
  16-byte aligned); a new key goes through `kernel[grid](...)` (which compiles
  or finds the right specialisation and launches it) and keeps the
  `CompiledKernel` it returns;
* afterwards calls the compiled kernel's launcher directly with the same
  arguments Triton would pass (constexprs included), on the current stream.

Anything else falls back to `kernel[grid]` for every call: the interpreter,
launch hooks (profilers such as proton), pre-run hooks, kernels that read
globals, or a Triton whose internals do not look like 3.x's.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any

import torch

_ALIGNMENT = 16


class Recorder:
    """Stands in for a JITFunction: `recorder[grid](*args, **kwargs)` only records the call."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[int, ...], tuple[Any, ...], dict[str, Any]]] = []

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        def record(*args: Any, **kwargs: Any) -> None:
            self.calls.append((tuple(grid), args, kwargs))

        return record


def is_jit_function(kernel: Any) -> bool:
    """True for a compiled-mode JITFunction (False under TRITON_INTERPRET=1)."""
    from triton.runtime.jit import JITFunction

    return isinstance(kernel, JITFunction)


@functools.cache
def _cuda_current() -> tuple[Callable[[], int], Callable[[int], int]]:
    get_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device
    get_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
        lambda index: torch.cuda.current_stream(index).cuda_stream
    )
    return get_device, get_stream


@functools.cache
def _triton_runtime_knobs() -> Any:
    from triton import knobs

    return knobs.runtime


def _hooks_active() -> bool:
    """Whether a launch hook (e.g. a profiler) is installed: then launches go through Triton to reach it."""
    runtime = _triton_runtime_knobs()
    enter, leave = runtime.launch_enter_hook, runtime.launch_exit_hook
    # Triton 3.6 keeps hooks in HookChain objects (empty `.calls` when unused); older versions use None.
    return bool(getattr(enter, "calls", enter) or getattr(leave, "calls", leave))


def _direct_call(compiled: Any, grid: tuple[int, int, int]) -> Callable[[int, tuple[Any, ...]], None] | None:
    """`call(stream, args)` that launches `compiled` exactly as JITFunction.run does, minus hooks; None if
    this Triton's CompiledKernel does not look as expected."""
    try:
        launcher = compiled.run  # loads the binary on first access
        function = compiled.function
        metadata = compiled.packed_metadata
    except AttributeError:
        return None
    grid_0, grid_1, grid_2 = grid
    launch = getattr(launcher, "launch", None)
    scratch = getattr(launcher, "global_scratch_size", None), getattr(launcher, "profile_scratch_size", None)
    if launch is not None and scratch == (0, 0) and hasattr(launcher, "launch_pdl"):
        # The C launcher itself: CudaLauncher.__call__ only adds scratch allocation, which this kernel has none of.
        cooperative, pdl = launcher.launch_cooperative_grid, launcher.launch_pdl

        def call(stream: int, args: tuple[Any, ...]) -> None:
            launch(
                grid_0,
                grid_1,
                grid_2,
                stream,
                function,
                cooperative,
                pdl,
                None,
                None,
                metadata,
                None,
                None,
                None,
                *args,
            )

        return call

    def call_launcher(stream: int, args: tuple[Any, ...]) -> None:
        launcher(grid_0, grid_1, grid_2, stream, function, metadata, None, None, None, *args)

    return call_launcher


class DirectLaunch:
    """One recorded kernel call of a plan; `launch(tensors)` runs it with this call's tensors.

    `tensors` is the dispatcher's tuple of the call's tensors (pack: out, lse, *buffers; combine:
    *buffers, out, out_lse); every tensor argument of the kernel must be one of them, every other
    argument must be fixed by the plan key.
    """

    def __init__(
        self,
        kernel: Any,
        grid: tuple[int, ...],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        tensors: tuple[Any, ...],
    ):
        names = list(kernel.arg_names)
        missing = [name for name in names[len(args) :] if name not in kwargs]
        if len(args) > len(names) or missing:
            raise ValueError(f"cannot order the arguments of {kernel.fn.__name__}: missing {missing}")
        values = list(args) + [kwargs[name] for name in names[len(args) :]]
        self.options = {key: value for key, value in kwargs.items() if key not in names}
        picks: list[int] = []
        fixed: list[Any] = []
        used: list[int] = []
        for value in values:
            if isinstance(value, torch.Tensor):
                index = next((i for i, t in enumerate(tensors) if t is value), None)
                if index is None:
                    raise ValueError("a tensor argument is not one of the call's tensors")
                picks.append(index)
                if index not in used:
                    used.append(index)
            else:
                picks.append(len(tensors) + len(fixed))
                fixed.append(value)
        self.kernel = kernel
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.fixed = tuple(fixed)
        self._pick = operator.itemgetter(*picks) if len(picks) > 1 else (lambda full: (full[picks[0]],))
        self._used = tuple(used)
        self._calls: dict[tuple[int, int], Callable[[int, tuple[Any, ...]], None]] = {}
        self.enabled = not getattr(kernel, "pre_run_hooks", None)

    def _misaligned(self, tensors: tuple[Any, ...]) -> int:
        """Bit i set when the i-th used tensor is not 16-byte aligned (Triton specialises on it)."""
        pointers = [tensors[i].data_ptr() for i in self._used]
        if not functools.reduce(operator.or_, pointers) % _ALIGNMENT:
            return 0
        return sum(1 << bit for bit, pointer in enumerate(pointers) if pointer % _ALIGNMENT)

    def __call__(self, tensors: tuple[Any, ...]) -> None:
        args = self._pick(tensors + self.fixed)
        get_device, get_stream = _cuda_current()
        device = get_device()
        key = (device, self._misaligned(tensors))
        call = self._calls.get(key)
        if call is not None and not _hooks_active():
            call(get_stream(device), args)
            return
        compiled = self.kernel[self.grid](*args, **self.options)
        if self.enabled and compiled is not None and not self.kernel.used_global_vals:
            direct = _direct_call(compiled, self.grid)
            if direct is not None:
                self._calls[key] = direct


def record_launches(
    kernel: Any, launch: Callable[..., None], launch_args: tuple[Any, ...], tensors: tuple[Any, ...]
) -> Callable[[tuple[Any, ...]], None] | None:
    """What `launch(*launch_args, kernel=...)` runs, as one callable of the call's tensors; None when
    some recorded call cannot be replayed directly (the caller then keeps calling `launch`)."""
    recorder = Recorder()
    launch(*launch_args, kernel=recorder)
    try:
        launches = [DirectLaunch(kernel, grid, args, kwargs, tensors) for grid, args, kwargs in recorder.calls]
    except ValueError:
        return None
    if len(launches) == 1:
        return launches[0]

    def launch_all(call_tensors: tuple[Any, ...]) -> None:
        for direct in launches:
            direct(call_tensors)

    return launch_all
