"""Runtime support shared by the kernel families: the CuTe compile cache, tensors, streams."""
