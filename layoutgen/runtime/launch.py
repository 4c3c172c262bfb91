"""Launching a generated kernel without Triton's per-call argument specialisation.

`kernel[grid](...)` re-derives, on every call, the specialisation of every
argument (dtype, 16-byte alignment of each pointer, divisibility by 16 and
== 1 of each int, every constexpr), builds a cache key string and looks the
compiled kernel up.  For a pack that is most of the ~20 µs host cost per call.
Here the dispatcher's plan key already fixes everything Triton specialises on
except the pointers' alignment, so a `DirectLaunch` made for one plan:

* records, once, what the generated `_launch_*` function passes to the kernel
  (grid, arguments, options) by handing it a `Recorder` instead of the kernel;
* keys compiled kernels by (current CUDA device, the caller's tensors' pointer
  residues mod 16; the buffers are fixed per plan); a new key goes through
  `kernel[grid](...)` (which compiles or finds the right specialisation and
  launches it) and keeps the `CompiledKernel` it returns;
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


#: (launch, function, cooperative, pdl, packed metadata); `launch` takes the C launcher's arguments.
LaunchEntry = tuple[Callable[..., None], Any, Any, Any, Any]


def _direct_entry(compiled: Any) -> LaunchEntry | None:
    """How to launch `compiled` exactly as JITFunction.run does, minus hooks and launch metadata; None if
    this Triton's CompiledKernel does not look as expected."""
    try:
        launcher = compiled.run  # loads the binary on first access
        function = compiled.function
        metadata = compiled.packed_metadata
    except AttributeError:
        return None
    launch = getattr(launcher, "launch", None)
    scratch = getattr(launcher, "global_scratch_size", None), getattr(launcher, "profile_scratch_size", None)
    if type(launcher).__name__ == "CudaLauncher" and launch is not None and scratch == (0, 0):
        # The C launcher itself: CudaLauncher.__call__ only adds scratch allocation, which this kernel has none of.
        # (Other backends' C launchers take other arguments: they go through their launcher object below.)
        return launch, function, launcher.launch_cooperative_grid, launcher.launch_pdl, metadata

    def through_launcher(
        grid_0: int,
        grid_1: int,
        grid_2: int,
        stream: int,
        function: Any,
        _c: Any,
        _p: Any,
        _g: Any,
        _s: Any,
        *rest: Any,
    ) -> None:
        launcher(grid_0, grid_1, grid_2, stream, function, *rest)

    return through_launcher, function, None, None, metadata


def _alignment_key(indices: tuple[int, ...]) -> Callable[[tuple[Any, ...]], int]:
    """The pointers' residues mod 16 of the tensors at `indices`, packed into one int (0: all aligned)."""
    if not indices:
        return lambda tensors: 0
    if len(indices) == 1:
        (first,) = indices
        return lambda tensors: tensors[first].data_ptr() % _ALIGNMENT
    if len(indices) == 2:
        first, second = indices
        return lambda tensors: tensors[first].data_ptr() % _ALIGNMENT | tensors[second].data_ptr() % _ALIGNMENT << 4

    def key(tensors: tuple[Any, ...]) -> int:
        packed = 0
        for shift, index in enumerate(indices):
            packed |= tensors[index].data_ptr() % _ALIGNMENT << 4 * shift
        return packed

    return key


class DirectLaunch:
    """One recorded kernel call of a plan; `launch(tensors)` runs it with this call's tensors.

    `tensors` is the dispatcher's tuple of the call's tensors; every tensor argument of the kernel must be
    one of them, every other argument must be fixed by the plan key.  Only the tensors at `varying` (the
    caller's own, e.g. pack's out and lse) change from call to call; the others are the plan's buffers,
    whose alignment the first launch already specialised on.
    """

    def __init__(
        self,
        kernel: Any,
        grid: tuple[int, ...],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        tensors: tuple[Any, ...],
        varying: tuple[int, ...],
    ):
        names = list(kernel.arg_names)
        missing = [name for name in names[len(args) :] if name not in kwargs]
        if len(args) > len(names) or missing:
            raise ValueError(f"cannot order the arguments of {getattr(kernel, '__name__', kernel)}: missing {missing}")
        values = list(args) + [kwargs[name] for name in names[len(args) :]]
        self.options = {key: value for key, value in kwargs.items() if key not in names}
        picks: list[int] = []
        fixed: list[Any] = []
        for value in values:
            if isinstance(value, torch.Tensor):
                index = next((i for i, t in enumerate(tensors) if t is value), None)
                if index is None:
                    raise ValueError("a tensor argument is not one of the call's tensors")
                picks.append(index)
            else:
                picks.append(len(tensors) + len(fixed))
                fixed.append(value)
        self.kernel = kernel
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.fixed = tuple(fixed)
        self._pick = operator.itemgetter(*picks) if len(picks) > 1 else (lambda full: (full[picks[0]],))
        self._alignment = _alignment_key(tuple(index for index in varying if index in picks))
        self._get_device, self._get_stream = _cuda_current()
        self._entries: dict[tuple[int, int], LaunchEntry] = {}
        self._knobs = _triton_runtime_knobs()
        # Direct launches need Triton 3.6's HookChain hooks (checked per call) and no pre-run hooks.
        self.enabled = hasattr(self._knobs.launch_enter_hook, "calls") and not getattr(kernel, "pre_run_hooks", None)

    def __call__(self, tensors: tuple[Any, ...]) -> None:
        args = self._pick(tensors + self.fixed)
        device = self._get_device()
        entry = self._entries.get((device, self._alignment(tensors)))
        knobs = self._knobs
        if entry is not None and not (knobs.launch_enter_hook.calls or knobs.launch_exit_hook.calls):
            launch, function, cooperative, pdl, metadata = entry
            grid_0, grid_1, grid_2 = self.grid
            stream = self._get_stream(device)
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
            return
        compiled = self.kernel[self.grid](*args, **self.options)
        if self.enabled and compiled is not None and not self.kernel.used_global_vals:
            direct = _direct_entry(compiled)
            if direct is not None:
                self._entries[(device, self._alignment(tensors))] = direct


def record_launches(
    kernel: Any,
    launch: Callable[..., None],
    launch_args: tuple[Any, ...],
    tensors: tuple[Any, ...],
    varying: tuple[int, ...],
) -> Callable[[tuple[Any, ...]], None] | None:
    """What `launch(*launch_args, kernel=...)` runs, as one callable of the call's tensors; None when
    some recorded call cannot be replayed directly (the caller then keeps calling `launch`).
    `varying`: indices of `tensors` that change from call to call (see DirectLaunch)."""
    recorder = Recorder()
    launch(*launch_args, kernel=recorder)
    try:
        launches = [DirectLaunch(kernel, grid, args, kwargs, tensors, varying) for grid, args, kwargs in recorder.calls]
    except ValueError:
        return None
    if len(launches) == 1:
        return launches[0]

    def launch_all(call_tensors: tuple[Any, ...]) -> None:
        for direct in launches:
            direct(call_tensors)

    return launch_all
