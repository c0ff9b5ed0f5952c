# Source this on a lent GPU machine after .gpu/bootstrap.sh: it puts the Python wheels the machine lacks
# (and that it cannot download: no network there) on PYTHONPATH. Fill .gpu/wheels once per checkout:
#   pip download apache-tvm-ffi --no-deps --only-binary=:all: --python-version 3.12 \
#       --platform manylinux_2_28_x86_64 -d .gpu/wheels
if compgen -G ".gpu/wheels/*.whl" > /dev/null; then
  for _wheel in .gpu/wheels/*.whl; do
    python3 -m zipfile -e "$_wheel" /tmp/gpu_deps
  done
  # Bytecode, as pip writes it at install time: without it a new process's first import compiles the
  # sources (about 80 ms of `import tvm_ffi`), which the first-call figures would wrongly count.
  python3 -m compileall -q /tmp/gpu_deps > /dev/null 2>&1
  export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}/tmp/gpu_deps"
fi
python3 -c "import tvm_ffi" 2>/dev/null || echo "gpu_deps: apache-tvm-ffi is missing (see scripts/gpu_deps.sh)" >&2
# The same for the CuTe DSL that .gpu/bootstrap.sh unpacks without bytecode: the modules a first compile
# imports lazily would otherwise be compiled from source inside the cold first-call figures.
if [ -d /tmp/cutedsl ]; then
  python3 -m compileall -q -j 0 /tmp/cutedsl > /dev/null 2>&1
fi
# And the project's own package, which a pip install compiles too: the kernel modules an op imports on its
# first compile would otherwise be compiled from source inside the cold figures (the lent machines may set
# PYTHONDONTWRITEBYTECODE, as this CPU machine does, so no run leaves bytecode behind for the next).
python3 -m compileall -q -j 0 cute_kernels > /dev/null 2>&1
