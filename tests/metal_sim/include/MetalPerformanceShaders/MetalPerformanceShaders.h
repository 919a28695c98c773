// Simulated MetalPerformanceShaders: what torch's ATen/mps/MPSStream.h names, for the
// syntax check of csrc/mps/torch_mps_stream.mm (tests/metal_sim/build.py --check).
#pragma once

#import <Metal/Metal.h>

@interface MPSCommandBuffer : NSObject <MTLCommandBuffer>
@end
