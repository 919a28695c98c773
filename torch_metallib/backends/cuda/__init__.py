"""The CUDA backend: AIR lowered to PTX (lowering.py, ptx.py), launched on torch's
current CUDA stream through the driver API reached at run time (driver.py, backend.py)."""
