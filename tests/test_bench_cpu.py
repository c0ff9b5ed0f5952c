"""bench's input rotation (CPU): the input set advances with every call, whichever function makes it."""

from cute_kernels.tools import bench


def test_input_rotation_advances_with_every_call():
    seen = []
    rotate = bench.input_rotation(3)
    ours = rotate(lambda i: seen.append(("ours", i)))
    baseline = rotate(lambda i: seen.append(("baseline", i)))
    for rep in range(3):  # as interleaved_times calls them: both functions with the same rep
        ours(rep)
        baseline(rep)
    assert [i for _, i in seen] == [0, 1, 2, 0, 1, 2]
    # no call reads the set the call just before it read
    assert all(a[1] != b[1] for a, b in zip(seen, seen[1:]))


def test_one_input_set_is_reused():
    seen = []
    rotate = bench.input_rotation(1)
    call = rotate(seen.append)
    for rep in range(4):
        call(rep)
    assert seen == [0, 0, 0, 0]
