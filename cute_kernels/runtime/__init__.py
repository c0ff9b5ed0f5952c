"""The machinery every op shares, each fact in one place: device facts and the launch-on-device guard,
argument checks, the numerical oracle, the CuTe compile cache, the NVRTC compile/load/launch path, the
on-disk cache and the dry-run switch. It imports nothing of the ops or the tools."""
