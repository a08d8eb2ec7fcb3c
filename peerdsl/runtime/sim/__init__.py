"""CPU simulator of peerdsl kernel IR (see device.py for the launch API, comm.py for the
communicator, `peerdsl.sim.run` for the multi-rank entry point)."""
from .device import DeviceBuffer, Launch, SimDevice, SimSystem, TARGETS, program_of  # noqa: F401
from .comm import SimCommunicator, SimJob  # noqa: F401,E402
