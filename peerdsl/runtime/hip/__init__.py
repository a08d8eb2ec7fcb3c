"""HIP backend: load manifest HSACO code objects and launch them with hip-python.

Importing needs neither hip-python nor ROCm; the first HIP call imports `hip`.
"""
from ..cuda.fdpass import recv_fd, recv_fds, send_fd, send_fds
from ._api import check, hip, use_hip
from .loader import HipKernel, HipLoader, clear_caches, set_device, stream_handle
from .memory import (hip_granularity, hip_ipc_export, hip_ipc_open, hip_vmm_alloc,
                     hip_vmm_export_fd, hip_vmm_free, hip_vmm_import_fd)

__all__ = ["check", "hip", "use_hip", "HipKernel", "HipLoader", "clear_caches", "set_device",
           "stream_handle", "hip_granularity", "hip_vmm_alloc", "hip_vmm_export_fd",
           "hip_vmm_import_fd", "hip_vmm_free", "hip_ipc_export", "hip_ipc_open",
           "send_fd", "recv_fd", "send_fds", "recv_fds"]
