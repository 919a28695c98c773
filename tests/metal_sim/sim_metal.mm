// The simulated Metal device: a library holds the bytes it was given, functions and
// pipelines carry their name and constant values, buffers are host memory, and the
// compute encoder records each call (recorder.h) for the test to replay on the CPU backend.
#import <Metal/Metal.h>

#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "recorder.h"

const void* sim_data_bytes(dispatch_data_t data);
size_t sim_data_size(dispatch_data_t data);

namespace metal_sim {
Recorder& recorder() {
  static Recorder shared;
  return shared;
}
}  // namespace metal_sim

using Constants = std::vector<std::tuple<int64_t, int64_t, std::string>>;

static int64_t type_bytes(MTLDataType type) {
  switch (type) {
    case MTLDataTypeBool:
    case MTLDataTypeChar:
    case MTLDataTypeUChar: return 1;
    case MTLDataTypeHalf:
    case MTLDataTypeBFloat:
    case MTLDataTypeShort:
    case MTLDataTypeUShort: return 2;
    case MTLDataTypeFloat:
    case MTLDataTypeInt:
    case MTLDataTypeUInt: return 4;
    case MTLDataTypeLong:
    case MTLDataTypeULong: return 8;
    default: return 0;
  }
}

@implementation MTLFunctionConstantValues
- (id)init {
  _sim_values = new Constants();
  return self;
}
- (void)setConstantValue:(const void*)value type:(MTLDataType)type atIndex:(NSUInteger)index {
  static_cast<Constants*>(_sim_values)
      ->emplace_back(int64_t(index), int64_t(type), std::string(static_cast<const char*>(value), type_bytes(type)));
}
- (void)dealloc {
  delete static_cast<Constants*>(_sim_values);
  [super dealloc];
}
@end

@interface SimBuffer : NSObject <MTLBuffer> {
 @public
  void* _contents;
  NSUInteger _length;
  bool _owned;
  int64_t _id;
}
@end

@implementation SimBuffer
- (void*)contents {
  return _contents;
}
- (NSUInteger)length {
  return _length;
}
- (uint64_t)gpuAddress {
  // Not the host address, so a pointer left unconverted cannot pass for one; the test maps
  // it back (metal_sim.GPU_ADDRESS_TAG).
  return uint64_t(reinterpret_cast<uintptr_t>(_contents)) ^ metal_sim::kGpuAddressTag;
}
- (void)dealloc {
  if (_owned) {
    std::free(_contents);
    std::lock_guard<std::mutex> lock(metal_sim::recorder().mutex);
    ++metal_sim::recorder().released_copies;
  }
  [super dealloc];
}
@end

id<MTLBuffer> sim_buffer(void* contents, NSUInteger length, bool owned) {
  SimBuffer* buffer = [[SimBuffer alloc] init];
  buffer->_contents = contents;
  buffer->_length = length;
  buffer->_owned = owned;
  std::lock_guard<std::mutex> lock(metal_sim::recorder().mutex);
  buffer->_id = ++metal_sim::recorder().buffers;
  return buffer;
}

@interface SimFunction : NSObject <MTLFunction> {
 @public
  NSString* _name;
  Constants* _constants;
}
@end

@implementation SimFunction
- (NSString*)name {
  return _name;
}
- (void)dealloc {
  [_name release];
  delete _constants;
  [super dealloc];
}
@end

@interface SimLibrary : NSObject <MTLLibrary> {
 @public
  dispatch_data_t _data;
}
@end

@implementation SimLibrary
- (id<MTLFunction>)newFunctionWithName:(NSString*)functionName {
  return [self newFunctionWithName:functionName constantValues:nil error:nullptr];
}
- (id<MTLFunction>)newFunctionWithName:(NSString*)name
                        constantValues:(MTLFunctionConstantValues*)constantValues
                                 error:(NSError**)error {
  // The bytes must be the metallib the library was made from, still in place.
  if (sim_data_size(_data) < 4 || std::memcmp(sim_data_bytes(_data), "MTLB", 4) != 0) return nil;
  SimFunction* function = [[SimFunction alloc] init];
  function->_name = [name retain];
  function->_constants =
      new Constants(constantValues != nil ? *static_cast<Constants*>(constantValues->_sim_values) : Constants());
  std::lock_guard<std::mutex> lock(metal_sim::recorder().mutex);
  ++metal_sim::recorder().functions;
  return function;
}
@end

@interface SimPipeline : NSObject <MTLComputePipelineState> {
 @public
  SimFunction* _function;
  metal_sim::Limits _limits;
}
@end

@implementation SimPipeline
- (NSUInteger)maxTotalThreadsPerThreadgroup {
  return NSUInteger(_limits.max_total_threads);
}
- (NSUInteger)threadExecutionWidth {
  return NSUInteger(_limits.execution_width);
}
- (NSUInteger)staticThreadgroupMemoryLength {
  return NSUInteger(_limits.static_threadgroup_memory);
}
- (void)dealloc {
  [_function release];
  [super dealloc];
}
@end

@interface SimEncoder : NSObject <MTLComputeCommandEncoder>
@end

@implementation SimEncoder
- (void)setComputePipelineState:(id<MTLComputePipelineState>)state {
  SimFunction* function = static_cast<SimPipeline*>(state)->_function;
  metal_sim::recorder().add({"pipeline", [function->_name UTF8String], {}, 0, *function->_constants});
}
- (void)setBytes:(const void*)bytes length:(NSUInteger)length atIndex:(NSUInteger)index {
  metal_sim::recorder().add({"bytes", std::string(static_cast<const char*>(bytes), length), {int64_t(index)}, 0, {}});
}
- (void)setBuffer:(id<MTLBuffer>)buffer offset:(NSUInteger)offset atIndex:(NSUInteger)index {
  SimBuffer* sim = static_cast<SimBuffer*>(buffer);
  metal_sim::recorder().add({"buffer",
                             "",
                             {int64_t(index), int64_t(offset), int64_t(sim->_length), sim->_id},
                             reinterpret_cast<uintptr_t>(sim->_contents),
                             {}});
}
- (void)setThreadgroupMemoryLength:(NSUInteger)length atIndex:(NSUInteger)index {
  metal_sim::recorder().add({"threadgroup", "", {int64_t(index), int64_t(length)}, 0, {}});
}
- (void)useResource:(id<MTLResource>)resource usage:(MTLResourceUsage)usage {
  SimBuffer* sim = static_cast<SimBuffer*>(resource);
  metal_sim::recorder().add({"resource",
                             "",
                             {sim->_id, int64_t(sim->_length), int64_t(usage)},
                             reinterpret_cast<uintptr_t>(sim->_contents),
                             {}});
}
- (void)dispatchThreads:(MTLSize)grid threadsPerThreadgroup:(MTLSize)group {
  metal_sim::recorder().add({"dispatch",
                             "",
                             {int64_t(grid.width), int64_t(grid.height), int64_t(grid.depth), int64_t(group.width),
                              int64_t(group.height), int64_t(group.depth)},
                             0,
                             {}});
}
@end

id<MTLComputeCommandEncoder> sim_encoder() {
  static SimEncoder* encoder = [[SimEncoder alloc] init];
  return encoder;
}

@interface SimDevice : NSObject <MTLDevice>
@end

@implementation SimDevice
- (id<MTLLibrary>)newLibraryWithData:(dispatch_data_t)data error:(NSError**)error {
  SimLibrary* library = [[SimLibrary alloc] init];
  library->_data = data;
  std::lock_guard<std::mutex> lock(metal_sim::recorder().mutex);
  ++metal_sim::recorder().libraries;
  return library;
}
- (id<MTLComputePipelineState>)newComputePipelineStateWithFunction:(id<MTLFunction>)computeFunction
                                                             error:(NSError**)error {
  SimPipeline* pipeline = [[SimPipeline alloc] init];
  pipeline->_function = [static_cast<SimFunction*>(computeFunction) retain];
  std::lock_guard<std::mutex> lock(metal_sim::recorder().mutex);
  pipeline->_limits = metal_sim::recorder().limits;
  ++metal_sim::recorder().pipelines;
  return pipeline;
}
- (id<MTLBuffer>)newBufferWithBytes:(const void*)pointer length:(NSUInteger)length options:(MTLResourceOptions)options {
  void* copy = std::malloc(length);
  std::memcpy(copy, pointer, length);
  return sim_buffer(copy, length, true);
}
- (NSUInteger)maxThreadgroupMemoryLength {
  std::lock_guard<std::mutex> lock(metal_sim::recorder().mutex);
  return NSUInteger(metal_sim::recorder().limits.device_threadgroup_memory);
}
@end

extern "C" id<MTLDevice> MTLCreateSystemDefaultDevice(void) {
  static SimDevice* device = [[SimDevice alloc] init];
  return device;
}
