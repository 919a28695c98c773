"""A kernel that takes CPU tensors and runs on another device: how every harness checks the
CUDA backend without building its tensors there.

Each call copies every distinct storage its arguments reach to the device once, rebuilds
each tensor there as the same view (offset, sizes, strides; aliasing kept; lists and dicts,
i.e. argument buffers, member by member), runs the kernel on those, and copies every
storage back whole, so the harness reads the kernel's outputs, and sees any byte it wrote
beside them, in its own CPU tensors. Kernels the harness looks up through ``.library``
(the other passes of a sort or scan) run on the device too.
"""

import torch

__all__ = ["OnDevice"]


class _Library:
    def __init__(self, library, device):
        self._library, self._device = library, device

    def __getitem__(self, name):
        return OnDevice(self._library[name], self._device)

    def __getattr__(self, name):
        return getattr(self._library, name)


class OnDevice:
    """`function`, called with CPU tensors, running on `device`."""

    def __init__(self, function, device: str):
        self._function, self._device = function, torch.device(device)

    def __getattr__(self, name):
        if name == "library":
            return _Library(self._function.library, self._device)
        return getattr(self._function, name)

    def __call__(self, *args, **kwargs):
        storages = {}  # CPU storage address -> (CPU storage, its copy on the device)

        def moved(value):
            if isinstance(value, torch.Tensor):
                if value.device.type != "cpu":
                    return value
                storage = value.untyped_storage()
                pair = storages.get(storage.data_ptr())
                if pair is None:
                    raw = torch.empty(storage.nbytes(), dtype=torch.uint8)
                    raw.untyped_storage().copy_(storage)
                    pair = storages[storage.data_ptr()] = (storage, raw.to(self._device).untyped_storage())
                view = torch.empty(0, dtype=value.dtype, device=self._device)
                return view.set_(pair[1], value.storage_offset(), value.shape, value.stride())
            if isinstance(value, dict):
                return {key: moved(item) for key, item in value.items()}
            if isinstance(value, (list, tuple)):
                return type(value)(moved(item) for item in value)
            return value

        result = self._function(*moved(args), **moved(kwargs))
        for storage, copy in storages.values():
            storage.copy_(copy)  # device to host: synchronizes with the kernel
        return result
