"""Stage 3: from a call's arguments to a validated binding plan, and the backend that runs it.

``calls`` (DispatchState, call), ``call_record`` (the reflection a call needs, cached on disk)
and ``backend`` (the seam every backend implements). The binding plan itself is C++
(``csrc/dispatch/``).
"""
