"""peerdsl: fused multi-GPU collectives written in a Python kernel DSL."""
__version__ = "0.1.0"

from .dsl import kernel  # noqa: E402,F401


def __getattr__(name: str):
    # imported on first use: the GPU communicator pulls in torch.distributed
    if name == "Communicator":
        from .runtime.communicator import Communicator
        return Communicator
    raise AttributeError(name)
