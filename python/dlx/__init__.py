# SPDX-License-Identifier: MIT
"""dlx: share tensors between processes on one machine without copying them.

A producer publishes any DLPack tensor (numpy, PyTorch, tvm-ffi, ...) under a
name; consumers in other processes acquire it and map the very same pages. The
daemon, dlxd, keeps the names; the bytes never pass through it.

    import dlx, numpy as np
    with dlx.Client() as c:
        t = c.alloc((4, 8), "float32")        # shared memory, filled in place
        np.from_dlpack(t)[:] = 1.5
        c.publish("demo/a", t)               # zero-copy
        ...
        a = np.from_dlpack(c.acquire("demo/a", timeout=5))

Everything that matters runs in C (dlx._dlx over libdlx); this module only adds
conveniences on top: dtype and device objects of numpy and PyTorch for alloc().
"""
from . import _dlx
from ._dlx import (
    DLPACK_MAJOR,
    DLPACK_MINOR,
    Disconnected,
    Error,
    Event,
    Info,
    InvalidArgument,
    IsGroup,
    LimitExceeded,
    NotFound,
    NotGroup,
    NotSupported,
    PermissionDenied,
    ProtocolError,
    Tensor,
    Timeout,
    Watch,
    Track,
    WouldCopy,
    __version__,
    exchange_api,
    strerror,
)

__all__ = [
    "Client", "Tensor", "Watch", "Track", "Event", "Info", "Error", "NotFound", "Timeout",
    "PermissionDenied", "Disconnected", "InvalidArgument", "LimitExceeded", "NotSupported",
    "WouldCopy", "ProtocolError", "IsGroup", "NotGroup", "exchange_api", "strerror",
    "__version__",
]


def _dtype_name(dtype):
    """'float32' from 'float32', numpy.float32, numpy.dtype('float32') or torch.float32."""
    if isinstance(dtype, str):
        return dtype[6:] if dtype.startswith("torch.") else dtype
    name = getattr(dtype, "name", None)  # numpy.dtype
    if isinstance(name, str):
        return name
    text = str(dtype)
    if text.startswith("torch."):
        return text[6:]
    try:
        import numpy
    except ImportError:
        return text
    return numpy.dtype(dtype).name


def _device(device):
    """'cpu', 'cuda:N', 'cuda_host' or (device_type, device_id); torch.device too."""
    if device is None:
        return "cpu"
    if isinstance(device, (str, tuple)):
        return device
    return str(device)  # torch.device('cuda', 0) -> 'cuda:0'


class Client(_dlx.Client):
    __doc__ = _dlx.Client.__doc__

    def alloc(self, shape, dtype, device="cpu"):
        """A compact, writable tensor in shared memory, to fill in place (through
        numpy.from_dlpack or torch.from_dlpack) and publish without a copy.

        dtype: a name ('float32', 'bfloat16', 'float8_e4m3fn', ...), a numpy dtype
        or a torch dtype. device: 'cpu', 'cuda:N', 'cuda_host', a torch.device or
        (device_type, device_id).
        """
        return super().alloc(shape, _dtype_name(dtype), _device(device))

    def __repr__(self):
        state = "closed" if self.closed else self.server_version
        return f"<dlx.Client {state}>"
