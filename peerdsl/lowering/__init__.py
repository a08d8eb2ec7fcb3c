"""Lowering: kernel IR -> MLIR -> code objects for gfx1250, gfx950, gfx942 and sm_90.

    targets.py    per-arch facts, pure data (the runtime imports it; no MLIR here)
    mlir_gen.py   ir.Kernel -> MLIR text (+ _gen_ops.py: casts, memory; _gen_control.py:
                  control flow)
    pipeline.py   the stages per vendor; MLIR runs in a worker process (worker.py)
    codeobject.py metadata read back from HSACO notes / ptxas reports
    cache.py      content-addressed cache; build.py the AOT build and its manifest
    toolchain.py  ld.lld (ziglang) and ptxas (nvidia-cuda-nvcc-cu12) locations, versions

Importing this package imports nothing heavy: the MLIR bindings load only in the worker.
"""
