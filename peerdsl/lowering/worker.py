"""The MLIR compile worker: the only module that imports the MLIR bindings.

The bundled LLVM is assert-enabled, so bad input can abort the process instead of raising.
The parent (`pipeline.WorkerClient`) therefore runs this in a child process and keeps it
alive across kernels (importing the bindings costs far more than compiling a kernel).

Protocol on stdin/stdout: frames of a 4-byte big-endian length and a msgpack map.
  request  {"mlir": text, "convert": pipeline, "binaries": {name: pipeline}}
           or {"op": "versions"}; test hooks {"op": "abort"} (dies like an LLVM assert) and
           {"op": "hang"}
  response {"ok": True, "objects": {name: bytes}} | {"ok": False, "error": text}
"""
from __future__ import annotations

import os
import struct
import sys
import traceback
from typing import Any, BinaryIO

import msgpack


def read_frame(f: BinaryIO) -> Any:
    head = f.read(4)
    if len(head) < 4:
        return None
    (n,) = struct.unpack(">I", head)
    data = f.read(n)
    if len(data) < n:
        return None
    return msgpack.unpackb(data, raw=False)


def write_frame(f: BinaryIO, obj: Any) -> None:
    data = msgpack.packb(obj, use_bin_type=True)
    f.write(struct.pack(">I", len(data)) + data)
    f.flush()


def versions() -> dict[str, str]:
    import flydsl
    libs = os.path.join(os.path.dirname(flydsl.__file__), "_mlir", "_mlir_libs")
    llvm = "unknown"
    for name in sorted(os.listdir(libs)):
        if ".so." in name:  # e.g. libFlyPythonCAPI.so.24.0git: the bundled LLVM's version
            llvm = name.split(".so.", 1)[1]
    return {"flydsl": getattr(flydsl, "__version__", "unknown"), "llvm": llvm}


def compile_request(req: dict[str, Any]) -> dict[str, Any]:
    from flydsl._mlir import ir, passmanager
    from flydsl._mlir.dialects import gpu

    with ir.Context() as ctx, ir.Location.unknown():
        ctx.allow_unregistered_dialects = False
        try:
            module = ir.Module.parse(req["mlir"])
            # verify before any pass: some passes assert on invalid IR and abort the process
            if not module.operation.verify():
                return {"ok": False, "error": "module failed to verify"}
            passmanager.PassManager.parse(req["convert"]).run(module.operation)
            lowered = str(module.operation.get_asm(enable_debug_info=True))
            objects: dict[str, bytes] = {}
            for name, pipeline in req["binaries"].items():
                m = ir.Module.parse(lowered)
                passmanager.PassManager.parse(pipeline).run(m.operation)
                for op in m.body.operations:
                    if op.operation.name == "gpu.binary":
                        obj = gpu.ObjectAttr(op.attributes["objects"][0])
                        objects[name] = bytes(obj.object)
            return {"ok": True, "objects": objects}
        except Exception as e:  # MLIRError carries the diagnostics with their locations
            return {"ok": False, "error": f"{type(e).__name__}: {e}"}


def main() -> None:
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    # keep stray prints (from LLVM or Python) off the protocol channel
    sys.stdout = sys.stderr
    while True:
        req = read_frame(inp)
        if req is None:
            return
        op = req.get("op", "compile")
        try:
            if op == "versions":
                resp = {"ok": True, "versions": versions()}
            elif op == "abort":
                os.abort()
            elif op == "hang":
                import time
                time.sleep(3600)
            else:
                resp = compile_request(req)
        except Exception:
            resp = {"ok": False, "error": traceback.format_exc()}
        write_frame(out, resp)


if __name__ == "__main__":
    main()
