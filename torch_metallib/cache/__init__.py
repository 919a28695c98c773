"""The on-disk cache shared by the stages that remember work across processes (call records,
compiled kernels): ``disk_cache``."""
