// Compiled pipelines kept across processes in an MTLBinaryArchive: one file per device and
// OS build (the compiled code is valid for neither another GPU nor another macOS build),
// consulted before a pipeline is compiled and written back at exit. Purely a speed-up:
// every failure falls back to compiling, and an unreadable file is discarded.
#pragma once

#import <Metal/Metal.h>

#include <cstdint>
#include <string>

namespace torch_metallib::mps {

// Where the archive lives: `folder` ("" turns archiving off) and the OS build that names
// its file with the device, `<folder>/<device>-<os_build>.binarchive`. Changing it writes
// out the archive in use first.
void configure_pipeline_archive(const std::string& folder, const std::string& os_build);

// The compute pipeline of `function` on `device`: taken from the archive when it holds the
// function's compiled code, else compiled and its code added to the archive. nil with
// `error` set when Metal cannot compile it. `from_archive` says which.
id<MTLComputePipelineState> archived_pipeline(id<MTLDevice> device, id<MTLFunction> function, NSError** error,
                                              bool* from_archive);

// Writes the archive if pipelines were added since it was read: to a temporary file, then
// renamed over the archive's, so a reader never sees half a file. False if writing failed.
bool save_pipeline_archive();

struct PipelineArchiveStatus {
  std::string path;       // the archive's file ("" until a pipeline asked, or when off)
  int64_t hits = 0;       // pipelines taken from the archive
  int64_t compiled = 0;   // pipelines compiled (and added) because the archive lacked them
  int64_t discarded = 0;  // archive files Metal could not read, deleted
  int64_t written = 0;    // times the archive was written
  bool pending = false;   // pipelines added since the last write
};
PipelineArchiveStatus pipeline_archive_status();

}  // namespace torch_metallib::mps
