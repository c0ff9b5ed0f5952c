"""Compile the CUDA C++ of legacy_cuda/ to cubin with NVRTC, cache it, and launch it on torch's current stream.

- Knobs (tile sizes, dtypes) are C++ template arguments, instantiated through NVRTC name expressions.
- Cubin, not PTX: PTX from an NVRTC newer than the driver fails to load, a cubin for the device's arch runs.
- Two caches: a dict in memory (per process) and files on disk (shared between processes). The key hashes
  the source, every header it includes from legacy_cuda/ (recursively), the compile options, the arch, the
  name expressions, the NVRTC version and a format version, so a change to any of them recompiles.
- Sources may include CUDA's own headers (``#include <cuda_fp16.h>``): NVRTC has none built in, so their
  directory is found (the runtime wheel's, where ``cuda.pathfinder`` looks first; else ``cuda.pathfinder``
  itself: conda, ``CUDA_HOME``/``CUDA_PATH``, system installs) and passed with ``-I``. The key holds that
  directory (an option), the sha256 of every header the compile reads from it (found as NVRTC finds them:
  ``<...>`` and ``"..."`` includes, transitively) and the version of the wheel that ships them, so a
  runtime-headers upgrade in place recompiles too. Headers
  no ``-I`` directory has (``<utility>``, ``<nv/target>``) are NVRTC's built-in ones, covered by its version.
- Processes that compile one key at once take turns (``DiskCache.lock``): the second waits, then loads the
  first one's cubin. A cubin from disk that passes its checksum but fails to load is evicted and compiled
  again, once (``kernel_for``); a second failure raises.
- The disk cache is the project's one (``cute_kernels.runtime.disk_cache``), under ``nvrtc/``; launches
  honour the one dry-run switch (``cute_kernels.runtime.dry_run``), and the arch comes from the one device
  facts module (``cute_kernels.runtime.device``).
- ``checked_compile`` is the ``compile`` of every NVRTC registry entry: refuse what ``supports()`` rejects
  before NVRTC sees it, then compile the named instantiation.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import legacy_cuda

from . import device as _device
from .bounded import remember
from .disk_cache import DiskCache
from .dry_run import is_dry_run

SOURCE_DIR = Path(legacy_cuda.__file__).resolve().parent  # the CUDA sources: a data-only package
_CACHE_FORMAT = 1
_INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)
_SYSTEM_INCLUDE_RE = re.compile(r'^\s*#\s*include\s*<([^>]+)>', re.MULTILINE)
# Either form, as (quoted name, angled name): how a CUDA header includes the next one. Unanchored (a
# line-start anchor made the scan of CUDA's 1.7 MB of fp16/bf16 headers 17x slower, ~9 ms of a first call);
# ``_includes`` checks that only blanks precede the ``#`` on its line.
_ANY_INCLUDE_RE = re.compile(r'#[ \t]*include[ \t]*(?:"([^"]+)"|<([^>]+)>)')


def _includes(text: str) -> tuple[tuple[str, bool], ...]:
    """(name, quoted) of every ``#include`` directive of ``text``, in order."""
    found = []
    for match in _ANY_INCLUDE_RE.finditer(text):
        start = match.start()
        if text[text.rfind("\n", 0, start) + 1:start].strip(" \t\r\f\v") == "":
            quoted, angled = match.groups()
            found.append((quoted, True) if quoted else (angled, False))
    return tuple(found)


class KernelError(RuntimeError):
    """A CUDA C++ kernel failed to compile, load or launch; the message names the kernel."""


# ----------------------------------------------------------------------------------------------------------
# Source and cache key
# ----------------------------------------------------------------------------------------------------------


def read_source_tree(filename: str) -> dict[str, str]:
    """The text of ``filename`` and of every package header it includes, transitively: {name: text}."""
    texts: dict[str, str] = {}
    pending = [filename]
    while pending:
        name = pending.pop()
        if name in texts:
            continue
        path = SOURCE_DIR / name
        if not path.is_file():
            raise KernelError(f"CUDA source {name!r} not found in {SOURCE_DIR}")
        texts[name] = path.read_text()
        pending.extend(_INCLUDE_RE.findall(texts[name]))
    return texts


@functools.cache
def nvrtc_version() -> tuple:
    """NVRTC's (major, minor) and, where the library came from a wheel, the wheel's full version: a patch
    release can change the code generated, and nvrtcVersion() does not report patches. With the wheel
    installed (the library the bindings load then: cuda.pathfinder looks in site-packages first) its
    version says both, so a process whose kernels are all in the disk cache never imports the NVRTC
    bindings (tens of ms of a first call). A libnvrtc already mapped in the process (torch's CUDA wheels
    load the wheel's at import; an LD_PRELOAD may load another) is the one the bindings would use: the
    wheel's version stands only where every mapped libnvrtc is a file of that wheel."""
    import importlib.metadata

    try:
        dist = importlib.metadata.distribution("nvidia-cuda-nvrtc")
        wheel = dist.version
    except importlib.metadata.PackageNotFoundError:
        dist, wheel = None, ""
    parts = wheel.split(".")
    if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
        mapped = _mapped_nvrtc_paths()
        if mapped is not None and (not mapped or _all_from_wheel(mapped, dist)):
            return int(parts[0]), int(parts[1]), wheel
    return _nvrtc_library_version(wheel)


def _all_from_wheel(mapped: "set[Path]", dist) -> bool:
    """Whether every mapped libnvrtc is a file the wheel ``dist`` installed: its RECORD read once, the answer
    kept on disk for these files (``_remembered_fact``)."""
    try:
        ident = [dist.version] + sorted(_file_ident(p) for p in mapped)
    except OSError:  # a mapped file deleted or replaced since it was loaded: not the wheel's as installed
        return False
    return _remembered_fact("nvrtc libraries of the wheel", ident, lambda: mapped <= _wheel_libraries(dist))


_FACTS = DiskCache("nvrtc-facts", ".fact")


def _file_ident(path: Path) -> list:
    st = path.stat()
    return [str(path), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _remembered_fact(what: str, ident, compute: Callable[[], Any]):
    """``compute()`` (a JSON value), kept in the disk cache under a digest of ``what`` and ``ident``: facts about
    installed files that change only when the files do (``ident`` holds their inodes, sizes and mtimes), so
    a process whose kernels are all cached reads no wheel's RECORD again (on the lent H200 machines two such
    reads were ~18 ms of an NVRTC op's first call). Computed every time where the disk cache is off."""
    key = hashlib.sha256(json.dumps([_CACHE_FORMAT, what, ident]).encode()).hexdigest()[:32]
    hit = _FACTS.load(key)
    if hit is not None:
        try:
            return json.loads(hit[0])["value"]
        except (ValueError, KeyError, TypeError):
            pass  # not ours: computed and written again below
    value = compute()
    _FACTS.store(key, json.dumps({"value": value}).encode(), {"what": what})
    return value


def _mapped_nvrtc_paths() -> "set[Path] | None":
    """The libnvrtc files mapped in this process (resolved), or None where that cannot be known (not Linux)."""
    try:
        with open("/proc/self/maps") as f:
            maps = f.read()
    except OSError:
        return None
    paths = set()
    for line in maps.splitlines():
        if "libnvrtc" not in line:  # most lines: a torch process maps thousands, a first call reads them all
            continue
        fields = line.split(None, 5)
        if len(fields) == 6 and "libnvrtc" in Path(fields[5]).name:
            # A file deleted since it was mapped reads "<path> (deleted)": kept as it is, so that it matches
            # no installed file and the library itself is asked.
            paths.add(Path(fields[5]).resolve())
    return paths


def _wheel_libraries(dist) -> "set[Path]":
    """The libnvrtc files (resolved) the NVRTC wheel ``dist`` installed."""
    return {Path(dist.locate_file(f)).resolve() for f in dist.files or () if "libnvrtc" in f.name}


def _nvrtc_library_version(wheel: str) -> tuple:
    from cuda.bindings import nvrtc

    err, major, minor = nvrtc.nvrtcVersion()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise KernelError(f"nvrtcVersion failed: {err}")
    return int(major), int(minor), wheel


def include_dirs(options) -> list[Path]:
    """The ``-I`` directories of an NVRTC option list, in search order."""
    dirs = []
    for o in options:
        for prefix in ("-I", "--include-path="):
            if o.startswith(prefix) and len(o) > len(prefix):
                dirs.append(Path(o[len(prefix):]))
    return dirs


# (path, inode, size, mtime, ctime) -> (sha256, what it includes as (name, quoted)): a header is read once
# per version of the file. Keyed by header versions, which only a process that keeps rewriting headers
# multiplies.
_header_memo: dict[tuple, tuple[str, tuple[tuple[str, bool], ...]]] = {}


def _header_facts(path: Path) -> tuple[str, tuple[tuple[str, bool], ...]]:
    st = path.stat()
    ident = (str(path), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    hit = _header_memo.get(ident)
    if hit is None:
        data = path.read_bytes()
        names = _includes(data.decode("latin-1"))
        hit = remember(_header_memo, ident, (hashlib.sha256(data).hexdigest(), names))
    return hit


def system_header_digests(headers, options) -> dict[str, str]:
    """{path: sha256} of every file the compile reads from the ``-I`` directories of ``options``: the
    ``<...>`` headers the sources include (``headers``, as ``system_headers`` lists them), looked up in
    those directories in order as NVRTC looks them up, and what those include, transitively (a quoted
    name beside the including header first). A name found in none is one of NVRTC's built-in headers (or
    a missing one, which fails the compile) and hashes nothing."""
    dirs = include_dirs(options)
    digests: dict[str, str] = {}
    pending = [(name, None) for name in headers]
    seen = set()
    while pending:
        name, beside = pending.pop()
        if (name, beside) in seen:
            continue
        seen.add((name, beside))
        for d in ([beside] if beside is not None else []) + dirs:
            path = d / name
            if path.is_file():
                break
        else:
            continue
        key = str(path)
        if key in digests:
            continue
        digest, includes = _header_facts(path)
        digests[key] = digest
        pending.extend((n, path.parent if quoted else None) for n, quoted in includes)
    return digests


_header_packages: dict[str, str] = {}  # include dir -> "name version": one per directory a compile used


def header_package(include_dir: Path, header: str) -> str:
    """"name version" of the installed wheel that ships ``include_dir / header`` (the CUDA runtime headers'
    ``nvidia-cuda-runtime``), or "" when no wheel does (a toolkit install, a copy)."""
    import importlib.metadata

    hit = _header_packages.get(str(include_dir))
    if hit is not None:
        return hit
    target = (include_dir / header).resolve()

    def search() -> str:
        for name in ("nvidia-cuda-runtime", "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime-cu12"):
            try:
                dist = importlib.metadata.distribution(name)
            except importlib.metadata.PackageNotFoundError:
                continue
            files = [f for f in dist.files or () if f.name == header]
            if any(Path(dist.locate_file(f)).resolve() == target for f in files):
                return f"{dist.metadata['Name']} {dist.version}"
        return ""

    # The wheels' RECORD files are read once per installed header file, the answer kept on disk.
    found = _remembered_fact("package of a header", _file_ident(target), search) if target.is_file() else ""
    _header_packages[str(include_dir)] = found
    return found


def cache_key(sources: dict[str, str], options: tuple[str, ...], arch: str, name_expressions: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    headers = system_headers(sources)
    payload = {
        "format": _CACHE_FORMAT,
        "sources": sorted(sources.items()),
        "options": list(options),
        "arch": arch,
        "names": list(name_expressions),
        "nvrtc": nvrtc_version(),
        "system_headers": sorted(system_header_digests(headers, options).items()),
        "header_packages": [header_package(d, headers[0]) for d in include_dirs(options)] if headers else [],
    }
    h.update(json.dumps(payload, sort_keys=True).encode())
    return h.hexdigest()[:32]


_DISK = DiskCache("nvrtc", ".cubin")


def cache_dir() -> Path | None:
    """Where compiled cubins are kept between processes, or None when the disk cache is switched off."""
    return _DISK.directory()


# ----------------------------------------------------------------------------------------------------------
# Compile
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cubin:
    """A compiled module: the cubin bytes and the mangled name of each requested name expression."""

    key: str
    arch: str
    data: bytes
    symbols: dict  # name expression -> lowered (mangled) name
    from_disk: bool = False


# Keyed by compile key: one entry per instantiation a process compiles, a finite set (every name expression
# comes from a config the entry's predicate accepts and the problem's dtype, head dim, kernel sides or vector
# width, each from a short list), so this cache and the loaded-kernel ones below stay unbounded.
_memory_cache: dict[str, Cubin] = {}
_lock = threading.Lock()
# Counts what happened, so tests can prove that a second request did not recompile.
stats = {"compiled": 0, "disk_hits": 0, "memory_hits": 0}


def _default_options() -> tuple[str, ...]:
    # No fast math: the kernels promise IEEE results. -lineinfo maps SASS back to source in profilers.
    # -default-device: unannotated functions, lambdas inside kernels included, are device code (NVRTC 13.0
    # takes a lambda in a __global__ function for host code and refuses it; 13.5 does not).
    return ("-std=c++17", "-lineinfo", "-default-device")


def system_headers(sources: dict[str, str]) -> list[str]:
    """The ``<...>`` headers the sources include (CUDA's own, e.g. cuda_fp16.h), sorted."""
    return sorted({h for text in sources.values() for h in _SYSTEM_INCLUDE_RE.findall(text)})


_include_dir_cache: dict[str, str] = {}  # one entry: the runtime headers' directory


def cuda_include_dir(needed_by: str, headers) -> str:
    """The directory holding the CUDA runtime headers (cuda_fp16.h, cuda_bf16.h, ...): the runtime wheel's,
    else what ``cuda.pathfinder`` finds; a KernelError that says how to get them when there is none."""
    hit = _include_dir_cache.get("cudart")
    if hit is not None:
        return hit
    found = _runtime_wheel_include_dir(headers)
    if found is None:
        try:
            from cuda.pathfinder import find_nvidia_header_directory

            found = find_nvidia_header_directory("cudart")
        except Exception:  # noqa: BLE001 - an old or missing cuda.pathfinder is the same as not found
            found = None
    if not found or not all((Path(found) / h).is_file() for h in headers):
        raise KernelError(
            f"{needed_by} includes {', '.join(f'<{h}>' for h in headers)}, which NVRTC needs from the CUDA runtime "
            f"headers, but cuda.pathfinder found {'none' if not found else 'them incomplete in ' + found}. "
            "Install them with `pip install nvidia-cuda-runtime` (or `cuda-python[all]`), or point CUDA_HOME "
            "at a CUDA toolkit."
        )
    _include_dir_cache["cudart"] = found
    return found


# Where cuda.pathfinder looks first for the runtime headers, in its order: the CUDA 13 and the CUDA 12
# runtime wheels' include directories under a site-packages' ``nvidia`` namespace package.
_RUNTIME_WHEEL_INCLUDE_DIRS = ("cu13/include", "cuda_runtime/include")


def _runtime_wheel_include_dir(headers) -> "str | None":
    """The runtime wheel's header directory where one holds ``headers``, found as cuda.pathfinder finds it
    first but without importing it: its import is tens of milliseconds of a new process's first call when
    torch has not imported it already. None where no wheel has them (pathfinder then looks further)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return None
    bases = list(spec.submodule_search_locations or ()) if spec is not None else []
    for sub in _RUNTIME_WHEEL_INCLUDE_DIRS:
        for base in bases:
            d = Path(base) / sub
            if (d / "cuda_runtime.h").is_file() and all((d / h).is_file() for h in headers):
                return str(d)
    return None


def compile_options(filename: str, sources: dict[str, str], defines: dict | None = None,
                    extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Every NVRTC option for ``filename`` but the arch: defaults, ``-D`` defines, ``-I`` for CUDA's headers."""
    options = _default_options() + tuple(f"-D{k}={v}" for k, v in sorted((defines or {}).items()))
    headers = system_headers(sources)
    if headers:
        options += (f"-I{cuda_include_dir(filename, headers)}",)
    return options + tuple(extra)


def compile_cubin(filename: str, name_expressions, arch: str, defines: dict | None = None) -> Cubin:
    """Compile the package's ``filename`` for ``arch`` (e.g. "sm_90a"), instantiating ``name_expressions``."""
    name_expressions = tuple(name_expressions)
    sources = read_source_tree(filename)
    options = compile_options(filename, sources, defines)
    key = cache_key(sources, options, arch, name_expressions)
    with _lock:
        hit = _memory_cache.get(key)
        if hit is not None:
            stats["memory_hits"] += 1
            return hit
        cubin = _load_from_disk(key, arch, name_expressions)
        if cubin is None:
            # Another process may be compiling this key: wait for it, then look again before compiling.
            with _DISK.lock(key):
                cubin = _load_from_disk(key, arch, name_expressions)
                if cubin is None:
                    cubin = _nvrtc_compile(filename, sources, options, arch, name_expressions, key)
                    stats["compiled"] += 1
                    _store_on_disk(cubin)
        if cubin.from_disk:
            stats["disk_hits"] += 1
        _memory_cache[key] = cubin
        return cubin


def evict(cubin: Cubin) -> None:
    """Forget ``cubin`` in memory and delete its disk entry if that still holds these bytes: the next
    compile_cubin of its key compiles again."""
    with _lock:
        if _memory_cache.get(cubin.key) is cubin:
            del _memory_cache[cubin.key]
        if cubin.from_disk:
            _DISK.evict(cubin.key, cubin.data)


def load_or_rebuild(cubin: Cubin, load: Callable[[Cubin], Any], rebuild: Callable[[], Cubin]) -> Any:
    """``load(cubin)``; when that fails for a cubin read from disk (it passed its checksum, so it is what
    some NVRTC wrote for this key, but the driver refuses it), evict the entry and ``load(rebuild())``
    once. A cubin compiled in this process that fails, or a second failure, raises."""
    try:
        return load(cubin)
    except KernelError as first:
        if not cubin.from_disk:
            raise
        evict(cubin)
        fresh = rebuild()
        try:
            return load(fresh)
        except KernelError as second:
            raise KernelError(f"{second} (the cached cubin {cubin.key} failed to load too, and was evicted: "
                              f"{first})") from second


def checked_compile(source: str, why_unsupported: Callable[[Any, Any], "str | None"],
                    name_expression: Callable[[Any, Any], str],
                    arch_specific: "bool | Callable[[Any, Any], bool]" = False) -> Callable[[Any, Any, str], Cubin]:
    """A registry entry's ``compile(config, problem, arch)`` for the kernel template in ``source``.
    ``arch_specific`` (or, per kernel, ``arch_specific(config, problem)``): the kernel uses one chip's own
    instructions, so it builds for ``device.specific(arch)`` (sm_90 -> sm_90a), the target its launch
    compiles and looks up (``kernel_for(..., arch_specific=True)``), whichever suffix the caller gives."""

    def compile(config, problem, arch: str) -> Cubin:  # noqa: A001 - the KernelSpec field's name
        reason = why_unsupported(config, problem)
        if reason is not None:
            raise ValueError(f"config {config} does not support {problem}: {reason}")
        if arch_specific(config, problem) if callable(arch_specific) else arch_specific:
            arch = _device.specific(arch)
        return compile_cubin(source, [name_expression(config, problem)], arch)

    return compile


def compile_text(name: str, text: str, name_expressions, arch: str) -> Cubin:
    """Compile CUDA source given as text (a probe's kernel, not one of the package's files) for ``arch``,
    with the package's default options; not cached. Load it with ``get_kernel`` and run it with ``launch``."""
    name_expressions = tuple(name_expressions)
    sources = {name: text}
    options = compile_options(name, sources)  # with -I for CUDA's headers when the text includes any
    return _nvrtc_compile(name, sources, options, arch, name_expressions, cache_key(sources, options, arch, name_expressions))


def _nvrtc_compile(filename, sources, options, arch, name_expressions, key, log_out: list | None = None) -> Cubin:
    from cuda.bindings import nvrtc

    def check(result, what):
        err = result[0]
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise KernelError(f"{filename}: {what} failed: {err}")
        return result[1:] if len(result) > 2 else (result[1] if len(result) == 2 else None)

    headers = [n for n in sources if n != filename]
    prog = check(
        nvrtc.nvrtcCreateProgram(
            sources[filename].encode(),
            filename.encode(),
            len(headers),
            [sources[h].encode() for h in headers],
            [h.encode() for h in headers],
        ),
        "nvrtcCreateProgram",
    )
    try:
        for expr in name_expressions:
            check(nvrtc.nvrtcAddNameExpression(prog, expr.encode()), f"nvrtcAddNameExpression({expr})")
        opts = [f"-arch={arch}".encode()] + [o.encode() for o in options]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            size = check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
            log = b" " * size
            check(nvrtc.nvrtcGetProgramLog(prog, log), "nvrtcGetProgramLog")
            raise KernelError(
                f"NVRTC could not compile {filename} for {arch} ({', '.join(name_expressions)}):\n"
                + log.rstrip(b"\x00").decode(errors="replace")  # the log ends in its C string's NUL
            )
        if log_out is not None:
            size = check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
            log = b" " * size
            check(nvrtc.nvrtcGetProgramLog(prog, log), "nvrtcGetProgramLog")
            log_out.append(log.rstrip(b"\x00").decode(errors="replace"))
        size = check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
        data = b" " * size
        check(nvrtc.nvrtcGetCUBIN(prog, data), "nvrtcGetCUBIN")
        symbols = {}
        for expr in name_expressions:
            lowered = check(nvrtc.nvrtcGetLoweredName(prog, expr.encode()), f"nvrtcGetLoweredName({expr})")
            symbols[expr] = lowered.decode() if isinstance(lowered, bytes) else lowered
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return Cubin(key=key, arch=arch, data=bytes(data), symbols=symbols)


@dataclass(frozen=True)
class Resources:
    """What ptxas reported for one kernel: registers per thread, spill traffic, static shared memory."""

    registers: int
    spill_stores: int  # bytes per thread
    spill_loads: int
    static_smem: int
    stack: int
    # ptxas's C7514: it serialised the kernel's wgmma instructions (each waits for the previous one), which
    # the kernel's own waits never ask for; the tensor cores then stop overlapping anything.
    wgmma_serialized: bool = False


_PTXAS_FUNCTION_RE = re.compile(r"Compiling entry function '([^']+)'")
_PTXAS_WGMMA_SERIALIZED_RE = re.compile(r"wgmma\.mma_async instructions are serialized.*? in the function '([^']+)'")
_PTXAS_NUMBERS = {
    "registers": re.compile(r"Used (\d+) registers"),
    "spill_stores": re.compile(r"(\d+) bytes spill stores"),
    "spill_loads": re.compile(r"(\d+) bytes spill loads"),
    "static_smem": re.compile(r"(\d+) bytes smem"),
    "stack": re.compile(r"(\d+) bytes stack frame"),
}


def resource_usage(filename: str, name_expressions, arch: str) -> dict[str, Resources]:
    """Compile (uncached) with ``--ptxas-options=-v`` and read ptxas's report from the program log:
    {name expression: Resources}. For tests and tuning: spills show here long before they show in timings."""
    name_expressions = tuple(name_expressions)
    sources = read_source_tree(filename)
    options = compile_options(filename, sources, extra=("--ptxas-options=-v",))
    log: list[str] = []
    cubin = _nvrtc_compile(filename, sources, options, arch, name_expressions, "uncached", log_out=log)
    by_symbol: dict[str, Resources] = {}
    # ptxas prints, per entry function, a "Compiling entry function 'sym'" line followed by its figures.
    serialized = set(_PTXAS_WGMMA_SERIALIZED_RE.findall(log[0]))
    parts = _PTXAS_FUNCTION_RE.split(log[0])
    for symbol, body in zip(parts[1::2], parts[2::2]):
        values = {}
        for field, regex in _PTXAS_NUMBERS.items():
            m = regex.search(body)
            values[field] = int(m.group(1)) if m else 0
        by_symbol[symbol] = Resources(**values, wgmma_serialized=symbol in serialized)
    missing = [e for e in name_expressions if cubin.symbols[e] not in by_symbol]
    if missing:
        raise KernelError(f"ptxas printed no resource report for {missing} in {filename}:\n{log[0]}")
    return {e: by_symbol[cubin.symbols[e]] for e in name_expressions}


def _load_from_disk(key: str, arch: str, name_expressions) -> Cubin | None:
    entry = _DISK.load(key)
    if entry is None:
        return None
    data, meta = entry
    if not isinstance(meta.get("symbols"), dict) or set(meta["symbols"]) != set(name_expressions):
        return None
    return Cubin(key=key, arch=arch, data=data, symbols=meta["symbols"], from_disk=True)


def _store_on_disk(cubin: Cubin) -> None:
    _DISK.store(cubin.key, cubin.data, {"arch": cubin.arch, "symbols": cubin.symbols})


def clear_memory_cache() -> None:
    from .plans import clear_all

    with _lock:
        _memory_cache.clear()
        _loaded.clear()
        _by_name.clear()
    clear_all()  # the ops' plans hold loaded kernels


# ----------------------------------------------------------------------------------------------------------
# Load and launch
# ----------------------------------------------------------------------------------------------------------


@dataclass
class LoadedKernel:
    """A kernel loaded in a device's primary context (torch's), with what its launches need."""

    name: str
    library: object  # the CUlibrary holding the cubin (loaded once, never unloaded: kernels are finite)
    function: object  # the CUfunction of that kernel in this device's context, launched directly
    device_index: int
    # Dynamic shared memory a launch may ask for without an opt-in: 48 KB less the kernel's static shared
    # memory (the two together must fit in the default 48 KB); raised by cuFuncSetAttribute when needed.
    max_dynamic_smem: int = 48 * 1024


def _check_driver(err, what: str) -> None:
    from cuda.bindings import driver

    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        raise KernelError(f"{what} failed: {name.decode() if isinstance(name, bytes) else name}")


_loaded: dict[tuple[str, str, int], LoadedKernel] = {}  # per compile key and device: finite, as _memory_cache


def get_kernel(cubin: Cubin, name_expression: str, device_index: int) -> LoadedKernel:
    """The kernel ``name_expression`` of ``cubin``, loaded for the device ``device_index`` (cached)."""
    k = (cubin.key, name_expression, device_index)
    hit = _loaded.get(k)
    if hit is not None:
        return hit
    import torch
    from cuda.bindings import driver

    # The driver API alone (cuda.core would cost ~0.1 s of import on a process's first launch).
    try:
        with torch.cuda.device(device_index):
            # torch uses each device's primary context; make it current here (the device guard restores the
            # caller's device afterwards), so that the CUfunction below belongs to the context torch's
            # streams do.
            err, dev = driver.cuDeviceGet(device_index)
            _check_driver(err, "cuDeviceGet")
            err, context = driver.cuDevicePrimaryCtxRetain(dev)
            _check_driver(err, "cuDevicePrimaryCtxRetain")
            (err,) = driver.cuCtxSetCurrent(context)
            _check_driver(err, "cuCtxSetCurrent")
            err, library = driver.cuLibraryLoadData(cubin.data, [], [], 0, [], [], 0)
            _check_driver(err, "cuLibraryLoadData")
            err, kernel = driver.cuLibraryGetKernel(library, cubin.symbols[name_expression].encode())
            _check_driver(err, "cuLibraryGetKernel")
            err, function = driver.cuKernelGetFunction(kernel)
            _check_driver(err, "cuKernelGetFunction")
            err, static_smem = driver.cuFuncGetAttribute(
                driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, function
            )
            _check_driver(err, "cuFuncGetAttribute(SHARED_SIZE_BYTES)")
    except Exception as e:  # noqa: BLE001 - re-raised with the kernel's name
        raise KernelError(f"could not load kernel {name_expression} ({cubin.arch}) on cuda:{device_index}: {e}") from e
    loaded = LoadedKernel(name_expression, library, function, device_index, 48 * 1024 - int(static_smem))
    _loaded[k] = loaded
    return loaded


_by_name: dict[tuple[str, str, int, bool], LoadedKernel] = {}  # per instantiation and device: finite, as above


def kernel_for(filename: str, name_expression: str, device_index: int, arch_specific: bool = False) -> LoadedKernel:
    """The hot-path lookup: the kernel compiled for ``device_index``'s arch, compiling it on first use; a
    cached cubin that does not load is evicted and compiled again (``load_or_rebuild``). ``arch_specific``:
    for ``sm_90a`` rather than ``sm_90`` (wgmma, setmaxnreg: instructions of that one chip)."""
    k = (filename, name_expression, device_index, arch_specific)
    hit = _by_name.get(k)
    if hit is None:
        arch = _device.arch(device_index, arch_specific=arch_specific)

        def build() -> Cubin:
            return compile_cubin(filename, [name_expression], arch)

        hit = _by_name[k] = load_or_rebuild(build(), lambda c: get_kernel(c, name_expression, device_index), build)
    return hit


_primary_contexts: dict[int, object] = {}  # device index -> its primary context, retained once (finite)


def _in_context(device_index: int, call):
    """``call()`` (a driver call returning (CUresult, ...)), run again with ``device_index``'s primary
    context made current if the calling thread had none. A thread torch started (autograd's backward
    threads) may never have made a runtime call that binds the context, and a kernel loaded by another
    thread is then an invalid context to the driver. Costs nothing on the common path."""
    from cuda.bindings import driver

    result = call()
    if result[0] != driver.CUresult.CUDA_ERROR_INVALID_CONTEXT:
        return result
    _bind_primary_context(device_index)
    return call()


def _bind_primary_context(device_index: int) -> None:
    """Make ``device_index``'s primary context (torch's) current on the calling thread."""
    from cuda.bindings import driver

    context = _primary_contexts.get(device_index)
    if context is None:
        err, dev = driver.cuDeviceGet(device_index)
        _check_driver(err, "cuDeviceGet")
        err, context = driver.cuDevicePrimaryCtxRetain(dev)
        _check_driver(err, "cuDevicePrimaryCtxRetain")
        _primary_contexts[device_index] = context
    (err,) = driver.cuCtxSetCurrent(context)
    _check_driver(err, "cuCtxSetCurrent")


def _set_dynamic_smem(loaded: LoadedKernel, nbytes: int) -> None:
    from cuda.bindings import driver

    (err,) = _in_context(loaded.device_index, lambda: driver.cuFuncSetAttribute(
        loaded.function, driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes
    ))  # the attribute counts dynamic bytes only; the driver adds the static ones and checks the sum
    _check_driver(err, f"{loaded.name}: raising dynamic shared memory to {nbytes} bytes")
    loaded.max_dynamic_smem = nbytes


def occupancy(loaded: LoadedKernel, threads: int, shared_bytes: int) -> int:
    """CTAs of ``loaded`` one SM holds at once with ``threads`` threads and ``shared_bytes`` of dynamic shared
    memory (raising the kernel's dynamic shared-memory attribute first, as a launch would). A kernel that
    does not fit at all raises ``KernelError``."""
    from cuda.bindings import driver

    if shared_bytes > loaded.max_dynamic_smem:
        _set_dynamic_smem(loaded, shared_bytes)
    err, blocks = _in_context(loaded.device_index, lambda: driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(
        loaded.function, threads, shared_bytes))
    _check_driver(err, f"occupancy of {loaded.name}")
    if blocks < 1:
        raise KernelError(f"{loaded.name} cannot run: {threads} threads with {shared_bytes} bytes of shared "
                          "memory do not fit on one SM of this device")
    return int(blocks)


def launch(loaded: LoadedKernel, grid, block, args, signature, *, shared_mem: int = 0, stream_handle: int) -> None:
    """Enqueue ``loaded`` on the CUDA stream ``stream_handle`` (torch's ``cuda_stream``).

    ``signature`` gives each argument's exact C type as a ctypes type (``ctypes.c_void_p`` for pointers,
    ``ctypes.c_int64``, ``ctypes.c_float``, ...): arguments are packed with those widths, never guessed
    from the Python value (a Python float would otherwise travel as a double).
    """
    from cuda.bindings import driver

    if shared_mem > loaded.max_dynamic_smem:
        _set_dynamic_smem(loaded, shared_mem)
    if is_dry_run():
        return
    (err,) = _in_context(loaded.device_index, lambda: driver.cuLaunchKernel(
        loaded.function, *grid, *block, shared_mem, driver.CUstream(stream_handle), (args, signature), 0
    ))
    if err != driver.CUresult.CUDA_SUCCESS:
        _check_driver(err, f"launch of {loaded.name} (grid={grid}, block={block}, smem={shared_mem})")


class PackedLaunch:
    """One kernel launch whose arguments are packed once, for a plan (``runtime.plans``) to repeat.

    ``args`` are ctypes instances, one per kernel parameter (a by-value ``ctypes.Structure`` or a scalar of
    the parameter's exact type), and the launch passes the address of a ``void*[]`` pointing at them, so
    ``cuda.bindings`` packs nothing per call (a (values, types) tuple costs it ~4 us of host time). A caller
    writes the slots that change (pointers, an epoch) and calls :meth:`launch` while holding ``lock``: the
    driver copies the arguments when the launch is enqueued, so the next call may rewrite them right after.
    """

    def __init__(self, loaded: LoadedKernel, grid, block, args: tuple, *, shared_mem: int = 0, lock=None):
        if shared_mem > loaded.max_dynamic_smem:
            _set_dynamic_smem(loaded, shared_mem)
        self.loaded, self.grid, self.block, self.shared_mem, self.args = loaded, tuple(grid), tuple(block), shared_mem, args
        self._pointers = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
        self._address = ctypes.addressof(self._pointers)
        from cuda.bindings import driver

        self._function = loaded.function
        self._launch_kernel, self._success = driver.cuLaunchKernel, driver.CUresult.CUDA_SUCCESS
        self._no_context = driver.CUresult.CUDA_ERROR_INVALID_CONTEXT
        self.lock = lock or threading.Lock()  # a lock of the caller's when its own state is updated with the slots

    def launch(self, stream_handle: int, grid=None) -> None:
        """Enqueue on the CUDA stream ``stream_handle`` (``grid``: this call's, when it differs from the
        packed one). Call with ``lock`` held, after writing the slots."""
        if is_dry_run():
            return
        gx, gy, gz = grid or self.grid
        bx, by, bz = self.block
        (err,) = self._launch_kernel(self._function, gx, gy, gz, bx, by, bz, self.shared_mem, stream_handle,
                                     self._address, 0)
        if err == self._no_context:  # a thread with no current context: once per thread, see _in_context
            _bind_primary_context(self.loaded.device_index)
            (err,) = self._launch_kernel(self._function, gx, gy, gz, bx, by, bz, self.shared_mem, stream_handle,
                                         self._address, 0)
        if err != self._success:
            _check_driver(err, f"launch of {self.loaded.name} (grid={grid or self.grid}, block={self.block}, "
                               f"smem={self.shared_mem})")
