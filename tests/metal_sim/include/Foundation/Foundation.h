// Simulated Foundation for building csrc/mps on Linux (tests/metal_sim): only what the
// Metal backend and the simulation use, declared as Apple documents it, on GCC's
// Objective-C runtime (tests/metal_sim/build.py). Manual reference counting.
#pragma once

#include <objc/objc.h>
#include <objc/runtime.h>
#include <stddef.h>
#include <stdint.h>

#include <dispatch/dispatch.h>

// GCC's objc.h defines nil as (id)0, which breaks `T* p = nil` in C++ (torch's headers).
#undef nil
#ifdef __cplusplus
#define nil nullptr
#else
#define nil ((id)0)
#endif

typedef unsigned long NSUInteger;
typedef long NSInteger;

@protocol NSObject
- (id)retain;
- (oneway void)release;
- (id)autorelease;
- (NSUInteger)retainCount;
- (BOOL)respondsToSelector:(SEL)aSelector;
@end

@interface NSObject <NSObject> {
  Class isa;
  NSUInteger _sim_references;  // the simulation's reference count (above 1)
}
+ (id)alloc;
+ (id)new;
- (id)init;
- (void)dealloc;
@end

// @autoreleasepool lowers to this class on GCC's runtime.
@interface NSAutoreleasePool : NSObject {
  void* _sim_objects;
}
+ (void)addObject:(id)object;
- (void)drain;
@end

@interface NSString : NSObject {
  char* _sim_text;
}
+ (NSString*)stringWithUTF8String:(const char*)text;
- (const char*)UTF8String;
@end

@interface NSDictionary : NSObject
@end

@interface NSError : NSObject {
 @public
  NSString* _sim_description;
}
- (NSString*)localizedDescription;
@end

// A file URL (binary archives are read from and written to one).
@interface NSURL : NSObject {
 @public
  char* _sim_path;
}
+ (NSURL*)fileURLWithPath:(NSString*)path;
@end

// What a pipeline descriptor's binaryArchives holds; the simulation keeps the objects retained.
@interface NSArray : NSObject {
 @public
  void* _sim_objects;  // std::vector<id>
}
+ (id)arrayWithObject:(id)anObject;
@end
