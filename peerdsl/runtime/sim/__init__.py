"""CPU simulator of peerdsl kernel IR (see device.py for the launch API, comm.py for the
communicator, weak.py for the memory model, `peerdsl.sim.run` for the multi-rank entry point)."""
from .comm import SimCommunicator, SimJob
from .device import TARGETS, DeviceBuffer, Launch, SimDevice, SimSystem, program_of

__all__ = ["SimCommunicator", "SimJob", "TARGETS", "DeviceBuffer", "Launch", "SimDevice",
           "SimSystem", "program_of"]
