#include "mps/pipeline_archive.h"

#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <mutex>

// Manual reference counting, as metal_library.mm.

namespace torch_metallib::mps {

namespace {

struct Archive {
  std::mutex mutex;  // guards everything here; Metal's archive is used under it only
  std::string folder, os_build;
  id<MTLBinaryArchive> archive = nil;  // opened on the first pipeline asked for
  id<MTLDevice> device = nil;          // the archive's: another GPU compiles without it
  bool opened = false;                 // tried to open (archive may still be nil: unavailable)
  PipelineArchiveStatus status;
};

// Never destroyed: the archive is written from an exit handler.
Archive& shared() {
  static Archive* archive = new Archive();
  return *archive;
}

std::string file_name_part(const std::string& text) {
  std::string out;
  for (char c : text) out += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-') ? c : '_';
  return out.empty() ? std::string("unknown") : out;
}

NSURL* file_url(const std::string& path) {
  return [NSURL fileURLWithPath:[NSString stringWithUTF8String:path.c_str()]];
}

id<MTLBinaryArchive> new_archive(id<MTLDevice> device, const std::string& path) {
  MTLBinaryArchiveDescriptor* descriptor = [[MTLBinaryArchiveDescriptor alloc] init];
  if (!path.empty()) [descriptor setUrl:file_url(path)];
  NSError* error = nil;
  id<MTLBinaryArchive> archive = [device newBinaryArchiveWithDescriptor:descriptor error:&error];
  [descriptor release];
  return archive;
}

// The archive for `device`, read from its file when there is one (under the lock).
id<MTLBinaryArchive> open_archive(Archive& shared, id<MTLDevice> device) {
  if (shared.opened) return device == shared.device ? shared.archive : nil;
  shared.opened = true;
  shared.device = device;
  if (shared.folder.empty()) return nil;
  std::error_code failed;
  std::filesystem::create_directories(shared.folder, failed);
  shared.status.path = shared.folder + "/" + file_name_part([[device name] UTF8String]) + "-" +
                       file_name_part(shared.os_build) + ".binarchive";
  if (std::filesystem::exists(shared.status.path, failed)) {
    shared.archive = new_archive(device, shared.status.path);
    if (shared.archive == nil) {  // damaged, or from another Metal: start afresh
      std::filesystem::remove(shared.status.path, failed);
      ++shared.status.discarded;
    }
  }
  if (shared.archive == nil) shared.archive = new_archive(device, "");
  return shared.archive;
}

bool save_locked(Archive& shared) {
  if (shared.archive == nil || !shared.status.pending) return true;
  const std::string temporary = shared.status.path + ".tmp" + std::to_string(getpid());
  NSError* error = nil;
  bool saved = false;
  @autoreleasepool {
    saved = [shared.archive serializeToURL:file_url(temporary) error:&error];
  }
  std::error_code failed;
  if (saved) std::filesystem::rename(temporary, shared.status.path, failed);
  if (!saved || failed) {
    std::filesystem::remove(temporary, failed);
    return false;
  }
  shared.status.pending = false;
  ++shared.status.written;
  return true;
}

}  // namespace

void configure_pipeline_archive(const std::string& folder, const std::string& os_build) {
  Archive& archive = shared();
  std::lock_guard<std::mutex> lock(archive.mutex);
  if (archive.folder == folder && archive.os_build == os_build) return;
  save_locked(archive);
  [archive.archive release];
  archive.archive = nil;
  archive.opened = false;
  archive.device = nil;
  archive.folder = folder;
  archive.os_build = os_build;
  archive.status.path.clear();
  archive.status.pending = false;
}

id<MTLComputePipelineState> archived_pipeline(id<MTLDevice> device, id<MTLFunction> function, NSError** error,
                                              bool* from_archive) {
  Archive& shared_archive = shared();
  *from_archive = false;
  std::lock_guard<std::mutex> lock(shared_archive.mutex);
  id<MTLComputePipelineState> pipeline = nil;
  @autoreleasepool {
    id<MTLBinaryArchive> archive = open_archive(shared_archive, device);
    MTLComputePipelineDescriptor* descriptor = [[MTLComputePipelineDescriptor alloc] init];
    [descriptor setComputeFunction:function];
    if (archive != nil) {
      [descriptor setBinaryArchives:[NSArray arrayWithObject:archive]];
      // A miss is an error by request (FailOnBinaryArchiveMiss), not a compile.
      NSError* miss = nil;
      pipeline = [device newComputePipelineStateWithDescriptor:descriptor
                                                       options:MTLPipelineOptionFailOnBinaryArchiveMiss
                                                    reflection:nullptr
                                                         error:&miss];
    }
    if (pipeline != nil) {
      *from_archive = true;
      ++shared_archive.status.hits;
    } else {
      pipeline = [device newComputePipelineStateWithFunction:function error:error];
      if (pipeline != nil && archive != nil) {
        ++shared_archive.status.compiled;
        [descriptor setBinaryArchives:nil];
        NSError* refused = nil;  // not kept: the pipeline is made, the next process compiles again
        if ([archive addComputePipelineFunctionsWithDescriptor:descriptor error:&refused])
          shared_archive.status.pending = true;
      }
    }
    [descriptor release];
  }
  return pipeline;
}

bool save_pipeline_archive() {
  Archive& archive = shared();
  std::lock_guard<std::mutex> lock(archive.mutex);
  return save_locked(archive);
}

PipelineArchiveStatus pipeline_archive_status() {
  Archive& archive = shared();
  std::lock_guard<std::mutex> lock(archive.mutex);
  return archive.status;
}

}  // namespace torch_metallib::mps
