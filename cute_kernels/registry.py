"""The registry: one :class:`KernelSpec` per (op, variant).

Everything that enumerates kernels goes through here: the public ops pick a variant and a config, the CLI
compile-checks and benchmarks every entry, sweeps walk ``candidates()`` filtered by ``supports()``, and the
tests cover every entry. An entry exists only for a kernel that runs and is tested.

A spec is written against a *problem*: a small frozen dataclass that holds everything a kernel's config and
compile key may depend on (sizes, dtypes, alignment), which the op builds from its arguments.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

from . import tuned

__all__ = ["KernelSpec", "register", "get", "for_call", "list", "configs", "variants", "log2_floor", "register_zoo",
           "zoo"]

_builtin_list = list


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """How to configure, compile, launch, check and time one kernel variant of one op.

    Fields (callables take the spec's own problem and config types):

    - ``op``, ``variant``: the key; ``backend``: "cute" (CuTe DSL) or "nvrtc" (CUDA C++ in ``legacy_cuda``).
    - ``dtypes``: the torch input dtypes the variant accepts.
    - ``config_cls``: a frozen dataclass; ``default_config(problem)`` is the heuristic,
      ``candidates()`` the whole sweep space (before ``supports()`` prunes it for a problem).
    - ``why_unsupported(config, problem) -> str | None``: the one validity predicate (None means supported),
      shared by the op, the sweeps and the tests; it must hold before anything is compiled.
    - ``compile(config, problem, arch)``: build the binary for ``arch`` (e.g. "sm_90a") without a GPU;
      used by ``python -m cute_kernels check`` and the CPU test tier.
    - ``launch(config, problem, inputs, out)``: run on ``out``'s device and torch's current stream.
    - ``prepare(config, problem, inputs, out)``: the launch made once for every call whose tensors have
      the structure of these (strides, alignments, device), which an op's plans keep
      (``runtime.plans``); its call signature is the op's (see each op's package). None: the op's plans
      call ``launch``.
    - ``make_inputs(problem, device, generator)``: fresh random inputs (a dict) for tests and benchmarks.
    - ``reference(problem, inputs)``: high-precision (float64 or exact) result.
    - ``baseline(problem, inputs)``: the vendor implementation the benchmark compares against.
    - ``flops(problem)``, ``bytes(problem)``: minimum work and traffic, for roofline figures.
    - ``standard_problems()``: the sizes the benchmark report times.
    """

    op: str
    variant: str
    backend: str
    dtypes: tuple
    config_cls: type
    default_config: Callable[[Any], Any]
    candidates: Callable[[], Sequence[Any]]
    why_unsupported: Callable[[Any, Any], "str | None"]
    compile: Callable[[Any, Any, str], Any]
    launch: Callable[..., Any]
    make_inputs: Callable[..., dict]
    reference: Callable[[Any, dict], Any]
    baseline: Callable[[Any, dict], Any]
    flops: Callable[[Any], float]
    bytes: Callable[[Any], float]
    standard_problems: Callable[[], Sequence[Any]]
    prepare: Callable[..., Any] | None = None
    description: str = ""
    baseline_name: str = ""
    # What limits the kernel, for roofline figures: "bandwidth", "fp32" (FFMA), "fp16" (tensor-core) or "tf32x3"
    # (FP32 work as three TF32 tensor-core products: a third of the TF32 peak) arithmetic.
    bound: str = "bandwidth"
    # error_scale(problem, inputs): per-element scale for the numerical oracle (runtime.oracle.compare), or None.
    error_scale: Callable[[Any, dict], Any] | None = None
    # error_floor_eps: the oracle's floor in eps of the output dtype (None: oracle.compare's default, 8).
    error_floor_eps: float | None = None
    # The CUDA C++ files in legacy_cuda/ an "nvrtc" entry compiles (so the CPU tier can prove each is covered).
    sources: tuple = ()
    # The config fields a sweep's heatmap puts on its rows and columns (e.g. tile shape x num_stages);
    # empty: the config's first two fields.
    sweep_axes: tuple = ()
    # shape_bucket(problem) -> str: the key under which sweeps record tuned configs (see tuned.py); None: the
    # entry has no tuned table and always uses default_config.
    shape_bucket: Callable[[Any], str] | None = None
    # Whether two calls on the same input give bitwise-identical output (no atomics or timing-dependent
    # order of floating-point sums); tests/test_determinism.py holds every entry to what it says here.
    deterministic: bool = True
    # Other libraries the report times beside the baseline, on the same inputs in the same loop:
    # {name: fn(problem, inputs)} (e.g. cuDNN's attention next to FlashAttention-2); fn returns None where it
    # does not apply to the problem (the report leaves it out there). Not the oracle's yardstick.
    other_baselines: dict = dataclasses.field(default_factory=dict)
    # A problem whose baseline does more than the problem needs by design (a windowed attention against SDPA
    # with a dense boolean mask: torch has no windowed kernel short of a compiled FlexAttention): what the
    # baseline does, which the report names beside it and keeps out of its geomeans; None: like for like.
    baseline_caveat: Callable[[Any], str | None] | None = None
    # The baseline as model code calls it back to back, for the report's wall figure: (problem, inputs) ->
    # (call, settings), ``call()`` the bare library call and ``settings()`` a context manager putting torch's
    # flags as the baseline needs them (a backend, TF32 off), entered once around the timed calls, as a model
    # sets them once rather than per call. None: ``baseline`` itself, which may set them on every call.
    eager_baseline: Callable[[Any, dict], tuple] | None = None
    # The kernels use instructions of sm_90a alone (wgmma, setmaxnreg): built for sm_90a (a compile for sm_90
    # builds that), and another arch's build would be a trap-only body that checks nothing.
    arch_specific: bool = False

    def __repr__(self) -> str:
        return f"KernelSpec({self.op}/{self.variant}, backend={self.backend}, config={self.config_cls.__name__})"

    @property
    def key(self) -> tuple[str, str]:
        return (self.op, self.variant)

    def builds_for(self, arch: str) -> bool:
        """Whether the entry has kernels for ``arch``: an arch-specific one only for sm_90 (built as sm_90a),
        where another arch's build would be a trap-only body that checks nothing."""
        return not self.arch_specific or arch in ("sm_90", "sm_90a")

    def config_fields(self) -> set[str]:
        """The names of its config class's fields (what a sweep's ``vary`` may name)."""
        return {f.name for f in dataclasses.fields(self.config_cls)}

    def supports(self, config, problem) -> bool:
        return self.why_unsupported(config, problem) is None

    def supported_candidates(self, problem) -> _builtin_list:
        return [c for c in self.candidates() if self.supports(c, problem)]

    def choose_config(self, problem, device_index: int):
        """The config an op runs when the caller names none: a swept winner for this GPU and shape bucket
        if ``supports()`` accepts it here, else the ``default_config`` heuristic."""
        return tuned.choose(self, problem, device_index)

    def verify(self, problem, inputs: dict, out, baseline_out=None):
        """The shared oracle: ``out`` against the reference, allowed twice the baseline's error."""
        import torch

        from .runtime import oracle

        ref = self.reference(problem, inputs)
        scale = self.error_scale(problem, inputs) if self.error_scale else None
        floor = None if self.error_floor_eps is None else self.error_floor_eps * torch.finfo(out.dtype).eps
        return oracle.compare(out, ref, baseline_out, scale=scale, floor=floor)


def settled_baseline(eager_baseline: Callable[[Any, dict], tuple]) -> Callable[[Any, dict], Any]:
    """A ``baseline`` from an ``eager_baseline``: its call once, under its settings (what the GPU-time
    figure and the oracle run), so the two cannot drift apart."""
    def baseline(problem, inputs: dict):
        call, settings = eager_baseline(problem, inputs)
        with settings():
            return call()

    return baseline


_REGISTRY: dict[tuple[str, str], KernelSpec] = {}
_DEFAULT: dict[str, KernelSpec] = {}  # op -> the variant an op uses when none is named (its first registered)


def register(spec: KernelSpec) -> KernelSpec:
    if spec.backend not in ("cute", "nvrtc"):
        raise ValueError(f"KernelSpec {spec.key}: backend must be 'cute' or 'nvrtc', got {spec.backend!r}")
    if spec.key in _REGISTRY and _REGISTRY[spec.key] is not spec:
        raise ValueError(f"KernelSpec {spec.key} is already registered")
    _REGISTRY[spec.key] = spec
    _DEFAULT.setdefault(spec.op, spec)
    return spec


# op -> (problems(), route(problem) -> the entry the op runs it on by default): each op's shape zoo, the
# everyday shapes beside its standard problems, registered by the op's package (which knows its routing).
_ZOOS: dict[str, tuple[Callable[[], Sequence[Any]], Callable[[Any], KernelSpec]]] = {}


def register_zoo(op: str, problems: Callable[[], Sequence[Any]], route: Callable[[Any], KernelSpec],
                 held_out: Callable[[], Sequence[Any]] | None = None,
                 runs_as: Callable[[Any], Any] | None = None,
                 call: Callable[[dict, Any], Any] | None = None) -> None:
    """Register ``op``'s shape zoo: ``problems()`` lists its everyday shapes, ``route(problem)`` names the
    entry a call of that problem runs on when it names no variant and no config. ``held_out()``: more
    everyday shapes that no heuristic was fitted on and no tuned table holds, timed and reported apart, so
    the report shows how the op does on shapes nobody tuned it for. ``runs_as(problem)``: the problem the
    op's kernel runs for it when that is another one (the HGEMM's misaligned calls run an aligned, padded
    twin), which is what a sweep tunes. ``call(inputs, out)``: the public op on an entry's inputs dict,
    writing ``out``; given, ``bench --zoo`` verifies and times it rather than the entry's launch, so a row
    is what a user's call costs (the padded copies of a staged call included)."""
    _ZOOS[op] = (problems, route, held_out or (lambda: []), runs_as or (lambda p: p), call)


def zoo(op: str | None = None, *, held_out: bool = False, as_run: bool = False) -> _builtin_list:
    """[(entry, problem)] of the shape zoo of ``op`` (None: every op's, by op), each problem on the entry
    the op runs it on; ``held_out``: its held-out shapes instead. ``bench --zoo`` times both. ``as_run``:
    each problem replaced by the one its kernel runs (``register_zoo``'s ``runs_as``), once each: what
    ``sweep --zoo`` tunes."""
    pairs, seen = [], set()
    for name in sorted(_ZOOS):
        if op is not None and name != op:
            continue
        problems, route, held, runs_as, _ = _ZOOS[name]
        for p in held() if held_out else problems():
            p = runs_as(p) if as_run else p
            if as_run and repr(p) in seen:
                continue
            seen.add(repr(p))
            pairs.append((route(p), p))
    return pairs


def route(op: str, problem) -> KernelSpec | None:
    """The entry ``op`` runs ``problem`` on when a call names no variant or config (its zoo's route), or None
    for an op without a zoo."""
    return _ZOOS[op][1](problem) if op in _ZOOS else None


def zoo_call(op: str, problem) -> tuple[Callable[[dict, Any], Any], KernelSpec, Any] | None:
    """How ``bench --zoo`` times ``problem`` of ``op``'s zoo when the op registered its public call: (the
    call, the entry its kernel runs on, the problem that kernel runs); None when it did not."""
    _, route, _, runs_as, call = _ZOOS[op]
    if call is None:
        return None
    ran = runs_as(problem)
    return call, route(ran), ran


def list(op: str | None = None) -> _builtin_list:  # noqa: A001 - the public name the API promises
    """Every registered spec (or those of one op), sorted by (op, variant)."""
    specs = sorted(_REGISTRY.values(), key=lambda s: s.key)
    return [s for s in specs if op is None or s.op == op]


def variants(op: str) -> _builtin_list:
    return [s.variant for s in list(op)]


def get(op: str, variant: str | None = None) -> KernelSpec:
    """The spec for ``op``; with no variant, the op's default (its first registered) variant.
    On every op call's path, so it is two dict lookups."""
    spec = _DEFAULT.get(op) if variant is None else _REGISTRY.get((op, variant))
    if spec is not None:
        return spec
    if op not in _DEFAULT:
        known = sorted(_DEFAULT)
        raise KeyError(f"no kernel registered for op {op!r}; registered ops: {known}")
    raise KeyError(f"op {op!r} has no variant {variant!r}; variants: {variants(op)}")


def for_call(op: str, variant: str | None) -> KernelSpec:
    """``get`` for a public op's ``variant=`` argument: an unknown name is the caller's mistake, so it is a
    ValueError naming the argument (and the variants there are), like every other bad argument."""
    if variant is not None and not isinstance(variant, str):
        raise TypeError(f"variant: expected a str or None, got {type(variant).__name__}")
    try:
        return get(op, variant)
    except KeyError as e:
        raise ValueError(f"variant: {e.args[0]}") from None


def configs(op: str, variant: str | None = None, problem=None) -> _builtin_list:
    """The sweep space of one entry; with ``problem``, only the configs ``supports()`` accepts for it."""
    spec = get(op, variant)
    if problem is None:
        return _builtin_list(spec.candidates())
    return spec.supported_candidates(problem)


def log2_floor(x: int) -> int:
    """floor(log2(max(x, 1))): the size classes that ``shape_bucket`` keys tuned configs by."""
    return max(x, 1).bit_length() - 1
