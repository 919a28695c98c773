"""The caches the doctor reports: the disk cache of compiled kernels and call records
(cache/disk_cache.py: ``jit`` for the CPU, ``cuda`` for PTX, ``calls``), and the corpus
caches (the reference libraries ``python -m torch_metallib corpus`` fetches; the public
corpus tests/corpora/fetch_public.sh fetches). Sizes are of what is there now."""

import os
from typing import Optional

from .. import config
from ..cache.disk_cache import cache_directory
from ..cache.corpus import corpus_dir

__all__ = ["caches", "folder_size"]

_ENVIRONMENT = (config.CACHE, config.CACHE_DIR, config.CORPUS_DIR, config.PUBLIC_CORPUS)


def folder_size(path: Optional[str]) -> dict:
    """{"path", "exists", "files", "bytes"} of a folder (symbolic links not followed)."""
    files = size = 0
    exists = bool(path) and os.path.isdir(path)
    if exists:
        for root, _, names in os.walk(path):
            for name in names:
                try:
                    size += os.lstat(os.path.join(root, name)).st_size
                    files += 1
                except OSError:  # removed while we walk (another process's cache)
                    pass
    return {"path": path, "exists": exists, "files": files, "bytes": size}


def caches() -> dict:
    enabled = cache_directory("jit") is not None  # TORCH_METALLIB_CACHE=0 turns it off
    kinds = {kind: folder_size(cache_directory(kind)) for kind in ("jit", "cuda", "calls")} if enabled else {}
    corpus = corpus_dir()
    entries = sorted(os.listdir(corpus)) if os.path.isdir(corpus) else []
    public = config.PUBLIC_CORPUS.get() or os.path.join(os.path.expanduser("~"), ".cache", "torch_metallib",
                                                                "public-corpus")
    return {
        "disk_cache": {"enabled": enabled, "root": os.path.dirname(cache_directory("jit")) if enabled else None,
                       "kinds": kinds},
        "corpus": dict(folder_size(corpus), entries={name: folder_size(os.path.join(corpus, name)) for name in entries
                                                     if os.path.isdir(os.path.join(corpus, name))}),
        "public_corpus": folder_size(public),
        "environment": {knob.name: knob.raw() for knob in _ENVIRONMENT if knob.raw() is not None},
    }
