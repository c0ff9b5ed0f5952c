"""The scan's oracle pieces: the exact (or extended-precision) reference, the per-element error scale of a
prefix sum, and torch's answer (the baseline), for every operator, direction and dim. A problem's tensors
are viewed as (rows, length, inner) and scanned along the middle dim (``scan_dim``)."""

from __future__ import annotations

import torch

from .problem import ScanProblem


def scan_dim(problem: ScanProblem, x: torch.Tensor) -> int:
    """The dim of ``x`` (as the registry makes it: (length,), (rows, length) or (rows, length, inner)) that
    ``problem`` scans."""
    return 1 if problem.inner > 1 else x.dim() - 1


def _identity(op: str, dtype: torch.dtype) -> float | int:
    if op == "sum":
        return 0
    if op == "prod":
        return 1
    if dtype.is_floating_point:
        return float("inf") if op == "min" else float("-inf")
    info = torch.iinfo(dtype)
    return info.max if op == "min" else info.min


def torch_scan(x: torch.Tensor, dim: int, op: str, *, exclusive: bool = False, reverse: bool = False) -> torch.Tensor:
    """``op``'s torch function along ``dim`` in x's dtype (with flips for ``reverse`` and a shift by one,
    the identity first, for ``exclusive``): torch's answer, and in float64 the reference."""
    t = x.flip(dim) if reverse else x
    if op == "sum":
        y = torch.cumsum(t, dim)
    elif op == "prod":
        y = torch.cumprod(t, dim)
    elif op == "max":
        y = torch.cummax(t, dim).values
    elif op == "min":
        y = torch.cummin(t, dim).values
    else:
        y = torch.logcumsumexp(t, dim)
    if exclusive:
        first = torch.full_like(y.narrow(dim, 0, 1), _identity(op, y.dtype))
        y = torch.cat([first, y.narrow(dim, 0, y.shape[dim] - 1)], dim)
    return y.flip(dim) if reverse else y


def logical_heads(starts: torch.Tensor, dim: int, reverse: bool) -> torch.Tensor:
    """Where segments start in the scan's own order along ``dim`` (the first element always does), from
    ``segment_starts`` (True at each segment's first element in memory): a reversed scan meets a segment at
    its last element, the one before a flagged one. Returned in memory order."""
    heads = starts.to(torch.bool)
    if reverse:
        after = heads.narrow(dim, 1, heads.shape[dim] - 1)
        heads = torch.cat([after, torch.ones_like(heads.narrow(dim, 0, 1))], dim)
    else:
        heads = torch.cat([torch.ones_like(heads.narrow(dim, 0, 1)), heads.narrow(dim, 1, heads.shape[dim] - 1)], dim)
    return heads


# The torch scans below run log2(CHUNK) doubling steps inside chunks of CHUNK elements, then scan the chunks'
# totals the same way (recursively) and fold each chunk's carry in: O(N log CHUNK) work, where one doubling
# over the whole row moves N log N. The chunks are what a user writing the scan in torch ops would do.
CHUNK = 64


def pad_last(t: torch.Tensor, pad: int, fill) -> torch.Tensor:
    return t if pad == 0 else torch.cat([t, torch.full_like(t[..., :1], fill).expand(*t.shape[:-1], pad)], -1)


def _doubling(pair: tuple, combine, identity: tuple, cat=torch.cat, full_like=torch.full_like) -> tuple:
    """Hillis-Steele doubling along the last dim of an associative operator on pairs of tensors
    (``combine(earlier, later)``): each position combined with everything before it. ``cat`` and
    ``full_like``: the array library's (NumPy's for the extended-precision reference)."""
    length, d = pair[0].shape[-1], 1
    while d < length:
        earlier = tuple(cat([full_like(t[..., :d], i), t[..., :-d]], -1) for t, i in zip(pair, identity))
        pair = combine(earlier, pair)
        d *= 2
    return pair


def chunked_scan(pair: tuple, combine, identity: tuple) -> tuple:
    """The inclusive scan of ``combine`` (on pairs of tensors, ``identity`` its identity pair) along the
    last dim in chunks of CHUNK: doubling inside each chunk, the chunks' totals scanned the same way
    (recursively), then each chunk's carry, its predecessors' total, combined into its elements. Both the
    segmented scan's (starts a segment, value) operator and the linear recurrence's map composition run on it."""
    length = pair[0].shape[-1]
    if length <= CHUNK:
        return _doubling(pair, combine, identity)
    pad = -length % CHUNK
    lead = pair[0].shape[:-1]
    chunks = (length + pad) // CHUNK
    local = _doubling(tuple(pad_last(t, pad, i).reshape(*lead, chunks, CHUNK) for t, i in zip(pair, identity)),
                      combine, identity)
    ends = chunked_scan(tuple(t[..., -1] for t in local), combine, identity)
    carry = tuple(torch.cat([torch.full_like(t[..., :1], i), t[..., :-1]], -1)[..., None] for t, i in zip(ends, identity))
    return tuple(t.reshape(*lead, length + pad)[..., :length] for t in combine(carry, local))


def _segments(combine, where=torch.where):
    """The (starts a segment, value) operator of ``combine``: a later element after a head keeps its own
    value; else it combines with the earlier one's."""
    return lambda earlier, later: (earlier[0] | later[0], where(later[0], later[1], combine(earlier[1], later[1])))


def _segmented_extreme(x: torch.Tensor, heads: torch.Tensor, op: str) -> torch.Tensor:
    """A segmented max or min along the last dim that picks the element torch.cummax / torch.cummin picks
    (a NaN over any number, a later element over an equal one) and returns it by a gather from ``x``, so a
    gradient reaches that one element as it does through torch's functions (a doubling of values would
    split it between equal ones, differently for each chunking). The doubling runs on positions, -1 for
    none: the lexicographic max of (is NaN, value or -value, position), associative."""
    lead = x.shape[:-1]
    values = x.detach()

    def at(position):
        return values.gather(-1, position.clamp_min(0).reshape(*lead, -1)).reshape(position.shape)

    def combine(earlier, later):
        e, l = at(earlier), at(later)
        beats = (l >= e) if op == "max" else (l <= e)
        take_later = (earlier < 0) | (later >= 0) & (l.isnan() | ~e.isnan() & beats)
        return torch.where(take_later, later, earlier)

    position = torch.arange(x.shape[-1], device=x.device).expand(x.shape)
    return x.gather(-1, chunked_scan((heads, position), _segments(combine), (False, -1))[1])


def segmented_scan(x, starts, dim: int, op: str, *, exclusive: bool = False, reverse: bool = False):
    """``op``'s scan along ``dim`` restarting at each segment (``starts``: True at a segment's first element)
    in x's dtype: torch tensors by doubling in chunks (``chunked_scan``), or numpy arrays (the float64
    reference in extended precision) by the same doubling over the whole row. Torch has no segmented scan; this is
    the baseline in the input precision and the reference in a wider one."""
    numpy = not isinstance(x, torch.Tensor)
    if not numpy and x.dim() == 0:  # one element: a row of one
        return segmented_scan(x.reshape(1), starts.reshape(1), 0, op, exclusive=exclusive, reverse=reverse).reshape(())
    if numpy:
        import numpy as np

        cat, where, full_like = (lambda parts, d: np.concatenate(parts, axis=d)), np.where, np.full_like
        take = lambda t, d, lo, hi: np.take(t, np.arange(lo, hi), axis=d)  # noqa: E731
        heads = logical_heads(torch.from_numpy(np.asarray(starts)), dim, reverse).numpy()
        combine = {"sum": np.add, "prod": np.multiply}[op]
    else:
        cat, where, full_like = torch.cat, torch.where, torch.full_like
        take = lambda t, d, lo, hi: t.narrow(d, lo, hi - lo)  # noqa: E731
        heads = logical_heads(starts, dim, reverse)
        combine = {"sum": torch.add, "prod": torch.mul, "max": torch.maximum, "min": torch.minimum,
                   "logsumexp": torch.logaddexp}[op]
    flip = (lambda t: np.flip(t, axis=dim)) if numpy else (lambda t: t.flip(dim))
    if reverse:
        x, heads = flip(x), flip(heads)
    length = x.shape[dim]
    identity = _identity(op, torch.float64 if numpy else x.dtype)
    if numpy:
        last = (np.moveaxis(heads, dim, -1), np.moveaxis(x, dim, -1))
        value = np.moveaxis(_doubling(last, _segments(combine, where), (False, identity), cat, full_like)[1], -1, dim)
    elif op in ("max", "min") and x.requires_grad:
        value = _segmented_extreme(x.movedim(dim, -1), heads.movedim(dim, -1), op).movedim(-1, dim)
    else:
        value = chunked_scan((heads.movedim(dim, -1), x.movedim(dim, -1)), _segments(combine),
                             (False, identity))[1].movedim(-1, dim)
    if exclusive:
        before = cat([full_like(take(value, dim, 0, 1), identity), take(value, dim, 0, length - 1)], dim)
        value = where(heads, full_like(value, identity), before)
    return flip(value) if reverse else value


def segmented_sum_by_offsets(x: torch.Tensor, starts: torch.Tensor, dim: int, *, exclusive: bool = False,
                             reverse: bool = False) -> torch.Tensor:
    """A segmented sum in a few O(N) torch ops with no host sync: the row's cumsum less its value before
    each segment's head, that value stored at the segment's number (a cumsum of the heads) and gathered back
    by it. (A cummax of head positions would say the same, but torch's cummax along a long row is slow.)
    Floats lose to cancellation what the row's running sum outgrows a segment's, so it is timed beside the
    baseline in the report, never the oracle's yardstick."""
    heads = logical_heads(starts, dim, reverse)
    if reverse:
        x, heads = x.flip(dim), heads.flip(dim)
    total = torch.cumsum(x, dim)
    segment = torch.cumsum(heads, dim) - 1  # the first element is a head: 0 ..
    length = x.shape[dim]
    shape = [1] * x.dim()
    shape[dim] = length
    position = torch.arange(length, device=x.device).reshape(shape)
    # Each head writes its offset at its segment's number; the other elements write past the row's length,
    # each to its own slot (one slot for all of them would serialise their stores).
    slot = torch.where(heads, segment, length + position)
    wide = list(x.shape)
    wide[dim] = 2 * length
    before = total - x  # the exclusive running sum: a head's own is its segment's offset
    offsets = torch.empty(wide, dtype=total.dtype, device=x.device).scatter_(dim, slot, before)
    y = before - offsets.gather(dim, segment)  # exclusive, 0 at every head exactly
    if not exclusive:
        y = y + x
    return y.flip(dim) if reverse else y


def scan_scale(x: torch.Tensor, dim: int = -1, reverse: bool = False) -> torch.Tensor:
    """Per-element error scale of a prefix sum along ``dim`` (from the end for ``reverse``): rounding errors
    of a sum of i random terms grow like sqrt(i) times their typical size, plus the size of the partial sum
    itself."""
    dim = dim % x.dim()
    if reverse:
        return scan_scale(x.flip(dim), dim).flip(dim)
    length = x.shape[dim]
    x64 = x.to(torch.float64)
    rms = x64.pow(2).mean(dim=dim, keepdim=True).sqrt().clamp_min(1e-30)
    shape = [1] * x.dim()
    shape[dim] = length
    position = torch.arange(1, length + 1, device=x.device, dtype=torch.float64).reshape(shape)
    return position.sqrt() * rms + torch.cumsum(x64, dim=dim).abs()


def scan_reference(problem: ScanProblem, inputs: dict) -> torch.Tensor:
    """Exact for integers and for max/min; float64 for float inputs (computed in float64 from the input's
    values); for a float64 sum or product, in the CPU's extended precision (numpy longdouble: 64-bit
    significand on x86), since a float64 reference would carry the same rounding as the float64 result it
    judges."""
    x = inputs["x"]
    dim = scan_dim(problem, x)
    starts = inputs.get("segment_starts")
    if starts is not None:
        if x.dtype == torch.float64 and problem.op in ("sum", "prod"):
            import numpy as np

            wide = segmented_scan(x.cpu().numpy().astype(np.longdouble), starts.cpu().numpy(), dim, problem.op,
                                  exclusive=problem.exclusive, reverse=problem.reverse)
            return torch.from_numpy(np.ascontiguousarray(wide).astype(np.float64)).to(x.device)
        wide = x if problem.op in ("max", "min") else x.to(torch.float64 if x.dtype.is_floating_point else torch.int64)
        return segmented_scan(wide, starts, dim, problem.op, exclusive=problem.exclusive, reverse=problem.reverse)
    if x.dtype == torch.float64 and problem.op in ("sum", "prod"):
        import numpy as np

        wide = x.cpu().numpy().astype(np.longdouble)
        if problem.reverse:
            wide = np.flip(wide, axis=dim)
        ref = (np.cumsum if problem.op == "sum" else np.cumprod)(wide, axis=dim)
        if problem.exclusive:
            first = np.full_like(np.take(ref, [0], axis=dim), 0 if problem.op == "sum" else 1)
            ref = np.concatenate([first, np.take(ref, np.arange(ref.shape[dim] - 1), axis=dim)], axis=dim)
        if problem.reverse:
            ref = np.flip(ref, axis=dim)
        return torch.from_numpy(np.ascontiguousarray(ref).astype(np.float64)).to(x.device)
    if problem.op in ("max", "min"):
        return torch_scan(x, dim, problem.op, exclusive=problem.exclusive, reverse=problem.reverse)
    wide = torch.float64 if x.dtype.is_floating_point else torch.int64
    return torch_scan(x.to(wide), dim, problem.op, exclusive=problem.exclusive, reverse=problem.reverse)


def error_scale(problem: ScanProblem, inputs: dict):
    """The oracle's per-element scale: the prefix-sum scale for float sums; None (the reference's largest
    magnitude) for the other float operators; integers are compared exactly."""
    x = inputs["x"]
    if not x.dtype.is_floating_point or problem.op != "sum":
        return None
    # (With segments, the whole row's scale: an upper bound of each segment's.)
    return scan_scale(x, scan_dim(problem, x), problem.reverse)


def torch_baseline(problem: ScanProblem, inputs: dict) -> torch.Tensor:
    """torch in the input precision: the error our kernel may have twice of (segments: the doubling scan in
    the input's precision, accumulating 16-bit floats in float32 as we do)."""
    x = inputs["x"]
    starts = inputs.get("segment_starts")
    if starts is not None:
        run = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        if not x.dtype.is_floating_point and problem.op in ("sum", "prod"):
            run = x.to(torch.int64)
        y = segmented_scan(run, starts, scan_dim(problem, x), problem.op, exclusive=problem.exclusive,
                           reverse=problem.reverse)
        return y.to(problem.out_dtype)
    return torch_scan(x, scan_dim(problem, x), problem.op, exclusive=problem.exclusive, reverse=problem.reverse)


def offsets_baseline(problem: ScanProblem, inputs: dict) -> torch.Tensor | None:
    """The report's second yardstick for a segmented sum (``segmented_sum_by_offsets``, 16-bit floats
    summed in float32 as we do); None for the other problems, to which it does not apply."""
    starts = inputs.get("segment_starts")
    if starts is None or problem.op != "sum":
        return None
    x = inputs["x"]
    run = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    y = segmented_sum_by_offsets(run, starts, scan_dim(problem, x), exclusive=problem.exclusive,
                                 reverse=problem.reverse)
    return y.to(problem.out_dtype)
