// Simulated Metal for building csrc/mps on Linux (tests/metal_sim): only the classes and
// methods the backend calls, with Apple's documented signatures and enum values.
#pragma once

#import <Foundation/Foundation.h>

typedef enum : NSUInteger {
  MTLDataTypeNone = 0,
  MTLDataTypeFloat = 3,
  MTLDataTypeHalf = 16,
  MTLDataTypeInt = 29,
  MTLDataTypeUInt = 33,
  MTLDataTypeShort = 37,
  MTLDataTypeUShort = 41,
  MTLDataTypeChar = 45,
  MTLDataTypeUChar = 49,
  MTLDataTypeBool = 53,
  MTLDataTypeLong = 81,
  MTLDataTypeULong = 85,
  MTLDataTypeBFloat = 121,
} MTLDataType;

// NS_OPTIONS as Apple's headers spell it in C++: an integer type, its flags an enum.
typedef NSUInteger MTLResourceOptions;
enum : NSUInteger {
  MTLResourceStorageModeShared = 0,
};

typedef NSUInteger MTLPipelineOption;
enum : NSUInteger {
  MTLPipelineOptionNone = 0,
  MTLPipelineOptionFailOnBinaryArchiveMiss = 1 << 2,  // API_AVAILABLE(macos(11.0))
};

typedef NSUInteger MTLResourceUsage;
enum : NSUInteger {
  MTLResourceUsageRead = 1 << 0,
  MTLResourceUsageWrite = 1 << 1,
};

typedef struct {
  NSUInteger width, height, depth;
} MTLSize;

static inline MTLSize MTLSizeMake(NSUInteger width, NSUInteger height, NSUInteger depth) {
  MTLSize size = {width, height, depth};
  return size;
}

@protocol MTLResource <NSObject>
@end

@protocol MTLBuffer <MTLResource>
- (void*)contents;
@property(readonly) NSUInteger length;
@property(readonly) uint64_t gpuAddress;  // API_AVAILABLE(macos(13.0))
@end

@protocol MTLFunction <NSObject>
@property(readonly) NSString* name;
@end

@interface MTLFunctionConstantValues : NSObject {
 @public
  void* _sim_values;  // the simulation's record of the values set
}
- (void)setConstantValue:(const void*)value type:(MTLDataType)type atIndex:(NSUInteger)index;
@end

@protocol MTLLibrary <NSObject>
- (id<MTLFunction>)newFunctionWithName:(NSString*)functionName;
- (id<MTLFunction>)newFunctionWithName:(NSString*)name
                        constantValues:(MTLFunctionConstantValues*)constantValues
                                 error:(NSError**)error;
@end

@class MTLComputePipelineDescriptor;

@protocol MTLComputePipelineState <NSObject>
@property(readonly) NSUInteger maxTotalThreadsPerThreadgroup;
@property(readonly) NSUInteger threadExecutionWidth;
@property(readonly) NSUInteger staticThreadgroupMemoryLength;
@end

// Pipelines' compiled code kept across processes (macOS 11+): made empty, or read from the
// file a descriptor's url names; functions added from pipeline descriptors; written to a file.
@interface MTLBinaryArchiveDescriptor : NSObject {
 @public
  NSURL* _sim_url;
}
- (void)setUrl:(NSURL*)url;  // property url (copy) in Apple's header; only its setter is used
@end

@protocol MTLBinaryArchive <NSObject>
- (BOOL)addComputePipelineFunctionsWithDescriptor:(MTLComputePipelineDescriptor*)descriptor error:(NSError**)error;
- (BOOL)serializeToURL:(NSURL*)url error:(NSError**)error;
@end

@interface MTLComputePipelineDescriptor : NSObject {
 @public
  id<MTLFunction> _sim_function;
  NSArray* _sim_archives;
}
// Properties in Apple's header (computeFunction; binaryArchives, NSArray<id<MTLBinaryArchive>>*,
// nullable, copy); only their setters are used.
- (void)setComputeFunction:(id<MTLFunction>)computeFunction;
- (void)setBinaryArchives:(NSArray*)binaryArchives;
@end

@interface MTLComputePipelineReflection : NSObject
@end

@protocol MTLCommandBuffer <NSObject>
@end

typedef void (^MTLCommandBufferHandler)(id<MTLCommandBuffer>);

@protocol MTLDevice;

@protocol MTLCommandQueue <NSObject>
@property(readonly) id<MTLDevice> device;  // torch 2.4 to 2.6's MPSStream.h calls it inline
@end

@protocol MTLSharedEvent <NSObject>
@end

@protocol MTLComputeCommandEncoder <NSObject>
- (void)setComputePipelineState:(id<MTLComputePipelineState>)state;
- (void)setBytes:(const void*)bytes length:(NSUInteger)length atIndex:(NSUInteger)index;
- (void)setBuffer:(id<MTLBuffer>)buffer offset:(NSUInteger)offset atIndex:(NSUInteger)index;
- (void)setThreadgroupMemoryLength:(NSUInteger)length atIndex:(NSUInteger)index;
- (void)useResource:(id<MTLResource>)resource usage:(MTLResourceUsage)usage;
- (void)dispatchThreads:(MTLSize)threadsPerGrid threadsPerThreadgroup:(MTLSize)threadsPerThreadgroup;
@end

@protocol MTLDevice <NSObject>
- (id<MTLLibrary>)newLibraryWithData:(dispatch_data_t)data error:(NSError**)error;
- (id<MTLComputePipelineState>)newComputePipelineStateWithFunction:(id<MTLFunction>)computeFunction
                                                             error:(NSError**)error;
- (id<MTLBuffer>)newBufferWithBytes:(const void*)pointer length:(NSUInteger)length options:(MTLResourceOptions)options;
- (id<MTLBinaryArchive>)newBinaryArchiveWithDescriptor:(MTLBinaryArchiveDescriptor*)descriptor error:(NSError**)error;
// reflection: MTLAutoreleasedComputePipelineReflection* in Apple's header.
- (id<MTLComputePipelineState>)newComputePipelineStateWithDescriptor:(MTLComputePipelineDescriptor*)descriptor
                                                             options:(MTLPipelineOption)options
                                                          reflection:(MTLComputePipelineReflection**)reflection
                                                               error:(NSError**)error;
@property(readonly) NSUInteger maxThreadgroupMemoryLength;
@property(readonly) NSString* name;
@end

#ifdef __cplusplus
extern "C"
#endif
    id<MTLDevice> MTLCreateSystemDefaultDevice(void);
