"""Helpers the fused-path tests share: byte equality of NormResults, and a record of the
kernels a communicator launches."""
from __future__ import annotations

import torch


def _bytes(t):
    return None if t is None else t.contiguous().view(torch.uint8)


def same_bytes(a, b) -> bool:
    """Tensor tuples a and b are byte for byte equal (None where both are None)."""
    return all((x is None and y is None) or (x is not None and y is not None and x.shape == y.shape
                                             and torch.equal(_bytes(x), _bytes(y)))
               for x, y in zip(a, b))


def result_tensors(r) -> tuple:
    return (r.out, r.residual_out, r.q, r.scale)


def record_launches(comm) -> list:
    """The names of the kernels comm launches from now on (a list filled as it goes)."""
    names, launch = [], comm._launch

    def recording(name, *args, **kwargs):
        names.append(name)
        return launch(name, *args, **kwargs)
    comm._launch = recording
    return names
