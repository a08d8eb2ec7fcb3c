"""CUDA backend: load manifest cubins, launch them on torch streams, share memory.

Importing this package needs no cuda-bindings; the first driver call imports it (with a
clear ImportError naming the package when it is missing).
"""
from ._driver import check, driver, use_driver
from .fdpass import recv_fd, recv_fds, send_fd, send_fds
from .ipc import IpcHandle, ipc_close, ipc_export, ipc_open
from .loader import (CudaKernel, CudaLoader, clear_caches, default_device, ensure_context,
                     stream_handle)
from .vmm import (VmmAllocation, granularity, round_up, vmm_alloc, vmm_export_fd, vmm_free,
                  vmm_import_fd)

__all__ = ["check", "driver", "use_driver", "send_fd", "recv_fd", "send_fds", "recv_fds",
           "IpcHandle", "ipc_export", "ipc_open", "ipc_close", "CudaKernel", "CudaLoader",
           "clear_caches", "default_device", "ensure_context", "stream_handle",
           "VmmAllocation", "granularity", "round_up", "vmm_alloc", "vmm_export_fd",
           "vmm_import_fd", "vmm_free"]
