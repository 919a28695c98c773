// Metal 4's matmul2d on cooperative tensors (MetalPerformancePrimitives, functions Metal's
// driver supplies: section air.externally_defined), for the CPU backend. Each lane holds
// its share of an operand in thread memory; the product is one SIMD-group exchange
// (backends/cpu/tensor_ops.py): every lane stages its elements as float, the first lane
// to read the completed exchange multiplies, every lane reads its share of the result.
#pragma once

#include <cstdint>

// The descriptor as AIR passes it: %"struct.mpp::tensor_ops::matmul2d_descriptor".
struct TmMatmul2dDescriptor {
  int32_t m, n, k;
  uint8_t transpose_left, transpose_right, relaxed_precision;
  int32_t mode;  // 0 multiply, 1 multiply_accumulate
};
static_assert(sizeof(TmMatmul2dDescriptor) == 20, "AIR's matmul2d_descriptor is 20 bytes");

// Lane `lane`'s elements of the three operands (element types as AIR encodes them) into
// `staged`: A as M x K, B as K x N and C as M x N row-major floats, one after another.
extern "C" void tm_rt_matmul2d_stage(const TmMatmul2dDescriptor* descriptor, uint32_t lane, const void* left,
                                     const void* right, const void* destination, uint32_t left_type,
                                     uint32_t right_type, uint32_t destination_type, float* staged);
// C = A*B (+ C with multiply_accumulate) in `staged`; lanes missing from `lanes` count as zeros.
extern "C" void tm_rt_matmul2d_multiply(const TmMatmul2dDescriptor* descriptor, float* staged, uint32_t lanes);
// Lane `lane`'s elements of C from `staged` into its destination storage.
extern "C" void tm_rt_matmul2d_read(const TmMatmul2dDescriptor* descriptor, uint32_t lane, void* destination,
                                    uint32_t destination_type, const float* staged);
