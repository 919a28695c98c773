#include "mps/metal_library.h"

#import <Metal/Metal.h>

#include <map>
#include <mutex>
#include <string>

#include "dispatch/binding_plan.h"
#include "mps/command_encoder.h"
#include "mps/pipeline_archive.h"
#include "mps/torch_mps_stream.h"

// Manual reference counting throughout (no ARC: the same source builds against GCC's
// Objective-C runtime in tests/metal_sim). Every object made with new/alloc is released here.

namespace torch_metallib::mps {

namespace {

MTLDataType data_type(const dispatch::MetalType& type) {
  using dispatch::ScalarKind;
  switch (type.kind) {
    case ScalarKind::Bool: return MTLDataTypeBool;
    case ScalarKind::Float:
      return type.element_bytes == 4 ? MTLDataTypeFloat : type.name == "bfloat" ? MTLDataTypeBFloat : MTLDataTypeHalf;
    case ScalarKind::Signed:
      return type.element_bytes == 1   ? MTLDataTypeChar
             : type.element_bytes == 2 ? MTLDataTypeShort
             : type.element_bytes == 4 ? MTLDataTypeInt
                                       : MTLDataTypeLong;
    case ScalarKind::Unsigned:
      return type.element_bytes == 1   ? MTLDataTypeUChar
             : type.element_bytes == 2 ? MTLDataTypeUShort
             : type.element_bytes == 4 ? MTLDataTypeUInt
                                       : MTLDataTypeULong;
  }
  return MTLDataTypeNone;
}

// (function, constant values) as one string: the pipeline cache's key.
std::string pipeline_key(const std::string& function, const std::vector<dispatch::ConstantValue>& constants) {
  std::string key = function;
  for (const dispatch::ConstantValue& c : constants) {
    key += "|" + std::to_string(c.index) + "=";
    key.append(reinterpret_cast<const char*>(c.bytes), sizeof(c.bytes));
  }
  return key;
}

std::string describe(NSError* error) {
  return error != nil ? std::string([[error localizedDescription] UTF8String]) : std::string("no reason given");
}

std::string size_text(const uint32_t size[3]) {
  return "(" + std::to_string(size[0]) + ", " + std::to_string(size[1]) + ", " + std::to_string(size[2]) + ")";
}

}  // namespace

struct MetalLibrary::State {
  std::shared_ptr<const void> owner;
  id<MTLDevice> device = nil;  // torch's; not ours to release
  dispatch_data_t data = nullptr;
  id<MTLLibrary> library = nil;
  mutable std::mutex mutex;  // guards pipelines, built and archived
  std::map<std::string, id<MTLComputePipelineState>> pipelines;
  int64_t built = 0, archived = 0;

  id<MTLComputePipelineState> pipeline(const std::string& function,
                                       const std::vector<dispatch::ConstantValue>& constants);

  ~State() {
    for (auto& entry : pipelines) [entry.second release];
    [library release];
    if (data != nullptr) dispatch_release(data);
  }
};

MetalLibrary::MetalLibrary(std::shared_ptr<const void> owner, const void* bytes, size_t length)
    : state_(std::make_unique<State>()) {
  state_->owner = std::move(owner);
  state_->device = current_device();
  // A no-op destructor: the bytes are `owner`'s, read in place.
  state_->data = dispatch_data_create(bytes, length, nullptr,
                                      ^{
                                      });
  NSError* error = nil;
  state_->library = [state_->device newLibraryWithData:state_->data error:&error];
  if (state_->library == nil) {
    throw dispatch::UnsupportedCall("the Metal device refused the library (" + std::to_string(length) + " bytes): " +
                                    describe(error) + ". Check that it was built for this macOS and GPU family");
  }
}

MetalLibrary::~MetalLibrary() = default;

id<MTLComputePipelineState> MetalLibrary::State::pipeline(const std::string& function,
                                                          const std::vector<dispatch::ConstantValue>& constants) {
  const std::string key = pipeline_key(function, constants);
  // Built under the lock, so each (function, constants) is compiled once even when several
  // threads ask at the same time; pipelines of other keys wait (compiles are rare).
  std::lock_guard<std::mutex> lock(mutex);
  auto found = pipelines.find(key);
  if (found != pipelines.end()) return found->second;
  NSString* name = [NSString stringWithUTF8String:function.c_str()];
  NSError* error = nil;
  id<MTLFunction> made = nil;
  if (constants.empty()) {
    made = [library newFunctionWithName:name];
  } else {
    MTLFunctionConstantValues* values = [[MTLFunctionConstantValues alloc] init];
    for (const dispatch::ConstantValue& c : constants) {
      [values setConstantValue:c.bytes type:data_type(*c.type) atIndex:NSUInteger(c.index)];
    }
    made = [library newFunctionWithName:name constantValues:values error:&error];
    [values release];
  }
  if (made == nil) {
    throw dispatch::UnsupportedCall(function + ": Metal could not make the function: " + describe(error));
  }
  bool from_archive = false;  // its compiled code from the binary archive (pipeline_archive.h)
  id<MTLComputePipelineState> pipeline = archived_pipeline(device, made, &error, &from_archive);
  [made release];
  if (pipeline == nil) {
    throw dispatch::UnsupportedCall(function + ": Metal could not build its compute pipeline: " + describe(error));
  }
  pipelines.emplace(key, pipeline);
  ++(from_archive ? archived : built);
  return pipeline;
}

PipelineLimits MetalLibrary::limits(const std::string& function,
                                    const std::vector<dispatch::ConstantValue>& constants) {
  id<MTLComputePipelineState> pipeline = state_->pipeline(function, constants);
  return {int64_t(pipeline.maxTotalThreadsPerThreadgroup), int64_t(pipeline.threadExecutionWidth),
          int64_t(pipeline.staticThreadgroupMemoryLength)};
}

void MetalLibrary::run(const dispatch::CommandList& commands) {
  id<MTLComputePipelineState> pipeline = state_->pipeline(commands.function, commands.constants);
  const uint64_t threads = uint64_t(commands.group[0]) * commands.group[1] * commands.group[2];
  if (threads > pipeline.maxTotalThreadsPerThreadgroup) {
    throw dispatch::DispatchFailure(commands.function + ": group_size " + size_text(commands.group) + " is " +
                                    std::to_string(threads) + " threads; this pipeline allows at most " +
                                    std::to_string(pipeline.maxTotalThreadsPerThreadgroup) +
                                    " (maxTotalThreadsPerThreadgroup). Pass a smaller group_size");
  }
  const uint64_t memory = uint64_t(commands.threadgroup_total) + pipeline.staticThreadgroupMemoryLength;
  if (memory > state_->device.maxThreadgroupMemoryLength) {
    throw dispatch::DispatchFailure(commands.function + ": threadgroup memory of " + std::to_string(memory) +
                                    " bytes (" + std::to_string(commands.threadgroup_total) + " set by the call, " +
                                    std::to_string(pipeline.staticThreadgroupMemoryLength) +
                                    " declared by the kernel) exceeds the device's " +
                                    std::to_string(state_->device.maxThreadgroupMemoryLength) +
                                    " (maxThreadgroupMemoryLength). Pass smaller threadgroup_memory lengths");
  }
  std::vector<id<MTLBuffer>> copies;
  id<MTLDevice> device = state_->device;
  encode_on_current_stream(
      [&](id<MTLComputeCommandEncoder> encoder) { copies = encode_commands(encoder, pipeline, device, commands); });
  for (id<MTLBuffer> copy : copies) release_when_completed(copy);
}

int64_t MetalLibrary::pipelines_built() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->built;
}

int64_t MetalLibrary::pipelines_archived() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->archived;
}

}  // namespace torch_metallib::mps
