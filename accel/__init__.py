"""accel: fast kernels, each registered against its refimpl twin (see accel.registry)."""
