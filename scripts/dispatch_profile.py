"""cProfile of each op's host path on the dispatch table's tiny problems (bench._tiny_calls): wall time per
call (three tries, torch's equivalent beside it), then the functions that take the time, by own time and
cumulative. Host figures on the lent machines vary by 2x between runs; compare within one run.

    python3 scripts/dispatch_profile.py > dispatch.txt
"""
import cProfile
import io
import pstats

import torch

from cute_kernels import bench

calls = bench._tiny_calls()
for op, problem, eager, custom, torch_fn in calls:
    for _ in range(20):
        eager()
    torch.cuda.synchronize()
    walls = [bench.wall_us_per_call(eager) for _ in range(3)]
    tw = [bench.wall_us_per_call(torch_fn) for _ in range(3)]
    print(f"## {op} {problem}: eager wall/call {['%.1f' % w for w in walls]} torch {['%.1f' % w for w in tw]}")
    n = 2000
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        eager()
    pr.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    st = pstats.Stats(pr, stream=s)
    st.sort_stats("tottime").print_stats(22)
    print(s.getvalue()[-6000:])
    s = io.StringIO()
    st = pstats.Stats(pr, stream=s)
    st.sort_stats("cumulative").print_stats(30)
    print(s.getvalue()[-7000:])
