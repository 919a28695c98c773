"""Metallib kernels as ``torch.library`` operators.

Not implemented yet: this package reserves the public name. Operator registration
arrives with the CPU backend (see the project's issues).
"""

__all__ = []
