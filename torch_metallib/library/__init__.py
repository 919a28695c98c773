"""Stage 5: the user-facing objects, ``Library`` (``load``) and ``KernelFunction``: thin
views over the native container that reach reflection and dispatch when asked."""
