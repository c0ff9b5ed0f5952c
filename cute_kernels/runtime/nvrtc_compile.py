"""The compile step of every NVRTC registry entry, in one place: refuse a (config, problem) that
``supports()`` rejects before NVRTC sees it, then compile the named instantiation to a cubin."""

from __future__ import annotations

from typing import Any, Callable

from legacy_cuda import nvrtc


def checked_compile(source: str, why_unsupported: Callable[[Any, Any], "str | None"],
                    name_expression: Callable[[Any, Any], str]) -> Callable[[Any, Any, str], "nvrtc.Cubin"]:
    """A ``KernelSpec.compile`` for the kernel template in ``source`` (a file of legacy_cuda/)."""

    def compile(config, problem, arch: str) -> nvrtc.Cubin:  # noqa: A001 - the KernelSpec field's name
        reason = why_unsupported(config, problem)
        if reason is not None:
            raise ValueError(f"config {config} does not support {problem}: {reason}")
        return nvrtc.compile_cubin(source, [name_expression(config, problem)], arch)

    return compile
