// Under GCC's Objective-C runtime clang gives every Objective-C++ function libobjc's
// personality, which aborts on C++ exceptions; this one forwards to C++'s, so typed
// catches, destructors and exceptions crossing blocks work.
// Safe while nothing uses @throw.
#include <unwind.h>

extern "C" _Unwind_Reason_Code __gxx_personality_v0(int, _Unwind_Action, _Unwind_Exception_Class, _Unwind_Exception*,
                                                    _Unwind_Context*);

extern "C" __attribute__((visibility("hidden"))) _Unwind_Reason_Code
__gnu_objc_personality_v0(int version, _Unwind_Action actions, _Unwind_Exception_Class exception_class,
                          _Unwind_Exception* exception, _Unwind_Context* context) {
  return __gxx_personality_v0(version, actions, exception_class, exception, context);
}
