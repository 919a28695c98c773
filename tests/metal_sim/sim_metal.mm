// The simulated Metal device: a library holds the bytes it was given, functions and
// pipelines carry their name and constant values, buffers are host memory, and the
// compute encoder records each call (recorder.h) for the test to replay on the CPU backend.
#import <Metal/Metal.h>

#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "recorder.h"

const void* sim_data_bytes(dispatch_data_t data);
size_t sim_data_size(dispatch_data_t data);
NSError* sim_error(const char* text);
const char* sim_url_path(NSURL* url);
std::vector<id> sim_array_objects(NSArray* array);

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
  std::string* _key;  // what a binary archive knows it by: library, name, constant values
}
@end

@implementation SimFunction
- (NSString*)name {
  return _name;
}
- (void)dealloc {
  [_name release];
  delete _constants;
  delete _key;
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
  // Apple's archive knows a function by its code and specialization; the simulation by its
  // library (size and first 4 KB), name and constant values.
  size_t size = sim_data_size(_data), head = size < 4096 ? size : 4096;
  std::string key =
      std::to_string(size) + ":" +
      std::to_string(std::hash<std::string>()(std::string(static_cast<const char*>(sim_data_bytes(_data)), head))) +
      ":" + [name UTF8String];
  for (const auto& [index, type, bytes] : *function->_constants) {
    key += "|" + std::to_string(index) + ":" + std::to_string(type) + "=";
    for (unsigned char c : bytes) key += "0123456789abcdef"[c >> 4], key += "0123456789abcdef"[c & 15];
  }
  function->_key = new std::string(key);
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

// --- binary archives: a set of function keys, written to a file one per line -------------

static const char kArchiveMagic[] = "SIM-MTLBINARYARCHIVE-1";

@interface SimBinaryArchive : NSObject <MTLBinaryArchive> {
 @public
  std::set<std::string>* _keys;
}
@end

@implementation SimBinaryArchive
- (BOOL)addComputePipelineFunctionsWithDescriptor:(MTLComputePipelineDescriptor*)descriptor error:(NSError**)error {
  SimFunction* function = static_cast<SimFunction*>(descriptor->_sim_function);
  if (function == nil) {
    if (error != nullptr) *error = sim_error("the descriptor has no compute function");
    return NO;
  }
  _keys->insert(*function->_key);
  std::lock_guard<std::mutex> lock(metal_sim::recorder().mutex);
  ++metal_sim::recorder().archive_additions;
  return YES;
}
- (BOOL)serializeToURL:(NSURL*)url error:(NSError**)error {
  std::ofstream out(sim_url_path(url), std::ios::binary | std::ios::trunc);
  out << kArchiveMagic << "\n";
  for (const std::string& key : *_keys) out << key << "\n";
  out.close();
  if (!out) {
    if (error != nullptr) *error = sim_error("could not write the archive");
    return NO;
  }
  std::lock_guard<std::mutex> lock(metal_sim::recorder().mutex);
  ++metal_sim::recorder().archives_written;
  return YES;
}
- (void)dealloc {
  delete _keys;
  [super dealloc];
}
@end

@implementation MTLBinaryArchiveDescriptor
- (void)setUrl:(NSURL*)url {
  [url retain];
  [_sim_url release];
  _sim_url = url;
}
- (void)dealloc {
  [_sim_url release];
  [super dealloc];
}
@end

@implementation MTLComputePipelineDescriptor
- (void)setComputeFunction:(id<MTLFunction>)function {
  [function retain];
  [_sim_function release];
  _sim_function = function;
}
- (void)setBinaryArchives:(NSArray*)archives {
  [archives retain];
  [_sim_archives release];
  _sim_archives = archives;
}
- (void)dealloc {
  [_sim_function release];
  [_sim_archives release];
  [super dealloc];
}
@end

@implementation MTLComputePipelineReflection
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
- (id<MTLBinaryArchive>)newBinaryArchiveWithDescriptor:(MTLBinaryArchiveDescriptor*)descriptor error:(NSError**)error {
  auto* keys = new std::set<std::string>();
  if (descriptor->_sim_url != nil) {  // read the file; anything but a written archive is an error
    std::ifstream in(sim_url_path(descriptor->_sim_url), std::ios::binary);
    std::string line;
    bool valid = in && std::getline(in, line) && line == kArchiveMagic;
    while (valid && std::getline(in, line)) {
      valid = !line.empty() && line.find_first_not_of("0123456789") != 0;
      keys->insert(line);
    }
    if (!valid) {
      delete keys;
      if (error != nullptr) *error = sim_error("MTLBinaryArchiveErrorInvalidFile: not a binary archive");
      return nil;
    }
    std::lock_guard<std::mutex> lock(metal_sim::recorder().mutex);
    ++metal_sim::recorder().archives_read;
  }
  SimBinaryArchive* archive = [[SimBinaryArchive alloc] init];
  archive->_keys = keys;
  return archive;
}
- (id<MTLComputePipelineState>)newComputePipelineStateWithDescriptor:(MTLComputePipelineDescriptor*)descriptor
                                                             options:(MTLPipelineOption)options
                                                          reflection:(MTLComputePipelineReflection**)reflection
                                                               error:(NSError**)error {
  SimFunction* function = static_cast<SimFunction*>(descriptor->_sim_function);
  bool archived = false;
  for (id object : sim_array_objects(descriptor->_sim_archives))
    archived = archived || static_cast<SimBinaryArchive*>(object)->_keys->count(*function->_key) > 0;
  if (!archived) {
    if (options & MTLPipelineOptionFailOnBinaryArchiveMiss) {
      std::lock_guard<std::mutex> lock(metal_sim::recorder().mutex);
      ++metal_sim::recorder().archive_misses;
      if (error != nullptr) *error = sim_error("the function is not in the binary archives (FailOnBinaryArchiveMiss)");
      return nil;
    }
    return [self newComputePipelineStateWithFunction:function error:error];
  }
  SimPipeline* pipeline = [[SimPipeline alloc] init];
  pipeline->_function = [function retain];
  std::lock_guard<std::mutex> lock(metal_sim::recorder().mutex);
  pipeline->_limits = metal_sim::recorder().limits;
  ++metal_sim::recorder().archived_pipelines;
  return pipeline;
}
- (NSString*)name {
  return [NSString stringWithUTF8String:"Simulated GPU"];
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
