"""CUPTI's activity API from Python (ctypes), for the GPU benchmarks that use CUPTI
without the shim (bench/cupti_costs.py, bench/launch_gap.py): the libraries this
process mapped, and activity buffers handed to CUPTI and collected back."""

import ctypes
import os


def mapped(name):
    """Path of the library whose file name contains `name`, as this process mapped it."""
    with open("/proc/self/maps") as f:
        for line in f:
            p = line.split()[-1]
            if name in os.path.basename(p):
                return p
    raise SystemExit(f"{name} is not loaded")


class Activity:
    """Registers buffer callbacks with the libcupti this process mapped. Completed
    buffers land in `done` as (address, valid bytes); `bufs` keeps each buffer alive
    until the caller drops it."""

    BUF = 8 << 20

    def __init__(self):
        vp = ctypes.c_void_p
        self.cupti = ctypes.CDLL(mapped("libcupti.so"))
        self.bufs = {}
        self.done = []
        req_t = ctypes.CFUNCTYPE(None, ctypes.POINTER(vp), ctypes.POINTER(ctypes.c_size_t),
                                 ctypes.POINTER(ctypes.c_size_t))
        cmp_t = ctypes.CFUNCTYPE(None, vp, ctypes.c_uint32, vp, ctypes.c_size_t, ctypes.c_size_t)

        def req(buf, size, maxr):
            b = ctypes.create_string_buffer(self.BUF + 8)
            a = (ctypes.addressof(b) + 7) & ~7
            self.bufs[a] = b
            buf[0], size[0], maxr[0] = a, self.BUF, 0

        def cmp(ctx, stream, buf, size, valid):
            self.done.append((buf, valid))

        # Kept on the object: CUPTI calls them for as long as the process runs.
        self._req, self._cmp = req_t(req), cmp_t(cmp)
        self.check("register", self.cupti.cuptiActivityRegisterCallbacks(self._req, self._cmp))

    @staticmethod
    def check(what, rc):
        if rc != 0:
            raise SystemExit(f"{what} failed: CUPTI error {rc}")
