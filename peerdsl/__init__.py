"""peerdsl: fused multi-GPU collectives written in a Python kernel DSL.

    peerdsl.kernel                 the @kernel decorator (peerdsl.dsl holds the language)
    peerdsl.compile(k, target, **constexprs) -> CompiledKernel   one kernel, through the cache
    peerdsl.register_op(name, kernel, variants)                  an op for `peerdsl build`
    peerdsl.Communicator           the GPU communicator
    peerdsl.sim.run(world, fn, ...) the simulator: fn(comm) on `world` simulated ranks

`import peerdsl` stays light: the compiler side (and torch.distributed) load on first use.
"""
__version__ = "0.1.0"

from .dsl import kernel  # noqa: E402,F401

_LAZY = {  # public name -> (module, attribute)
    "Communicator": (".runtime.communicator", "Communicator"),
    "compile": (".lowering.api", "compile"),
    "CompiledKernel": (".lowering.api", "CompiledKernel"),
    "BuildError": (".lowering.build", "BuildError"),
    "register_op": (".ops.registry", "register"),
}

__all__ = ["kernel", *_LAZY]


_SUBMODULES = ("sim",)  # `peerdsl.sim.run(...)` after a plain `import peerdsl`


def __getattr__(name: str):
    import importlib
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module, __name__), attr)
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'peerdsl' has no attribute {name!r}")
