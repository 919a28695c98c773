// Metal 4's matmul2d (MetalPerformancePrimitives, functions Metal's driver supplies:
// section air.externally_defined) and the tensors it reads, for the CPU backend. Each lane
// holds its share of an operand in a cooperative tensor in thread memory; an operand may
// also be a tensor in device or threadgroup memory (a Metal tensor_inline descriptor,
// TmTensorDescriptor). The product is one SIMD-group exchange (air/tensor_ops.py):
// every lane stages its cooperative elements, the first lane to read the completed exchange
// reads the tensor operands and multiplies, every lane reads its share of the result.
#pragma once

#include <cstdint>

// The descriptor as AIR passes it: %"struct.mpp::tensor_ops::matmul2d_descriptor".
// K may be -1 (dynamic): the reduction extent of the tensor operands.
struct TmMatmul2dDescriptor {
  int32_t m, n, k;
  uint8_t transpose_left, transpose_right, relaxed_precision;
  int32_t mode;  // 0 multiply, 1 multiply_accumulate
};
static_assert(sizeof(TmMatmul2dDescriptor) == 20, "AIR's matmul2d_descriptor is 20 bytes");

// A tensor_inline descriptor of rank 2 with 32-bit indices as the CPU backend lays it out
// (air/private_tensors.py): dimension 0 is the innermost (a matrix's columns).
// Elements are counted from `origin`, which slices move, as they do not know the element size.
struct TmTensorDescriptor {
  uint8_t* data;
  int64_t origin;
  int32_t extents[2];
  int32_t strides[2];
};
static_assert(sizeof(TmTensorDescriptor) == 32, "private_tensors.py's descriptor of rank 2 is 32 bytes");

// Element types below are the codes AIR's calls carry: the kind in the high nibble
// (1 float, 2 signed integer, 9 bfloat), the width in bits in the low byte.

// Lane `lane`'s elements of the operands held in cooperative tensors (null: a tensor
// operand) into `staged`: A as M x K, B as K x N and C as M x N row-major doubles.
extern "C" void tm_rt_matmul2d_stage(const TmMatmul2dDescriptor* descriptor, uint32_t lane, const void* left,
                                     const void* right, const void* destination, uint32_t left_type,
                                     uint32_t right_type, uint32_t destination_type, double* staged);
// C = A*B (+ C with multiply_accumulate) in `staged`, after reading the tensor operands
// (non-null `left_tensor`/`right_tensor`) whole; elements of lanes missing from `lanes` count
// as zeros. Float results: one fused multiply-add in float per k; integer results: exact,
// wrapped to the result's width.
extern "C" void tm_rt_matmul2d_multiply(const TmMatmul2dDescriptor* descriptor, double* staged, uint32_t lanes,
                                        const TmTensorDescriptor* left_tensor, const TmTensorDescriptor* right_tensor,
                                        uint32_t left_type, uint32_t right_type, uint32_t destination_type);
// Lane `lane`'s elements of C from `staged` into its destination storage.
extern "C" void tm_rt_matmul2d_read(const TmMatmul2dDescriptor* descriptor, uint32_t lane, void* destination,
                                    uint32_t destination_type, const double* staged);
// `resolved` = `descriptor` with a dynamic K taken from the tensor operands' extents.
extern "C" void tm_rt_matmul2d_resolve(const TmMatmul2dDescriptor* descriptor, TmMatmul2dDescriptor* resolved,
                                       const TmTensorDescriptor* left_tensor, const TmTensorDescriptor* right_tensor);
// Lane `lane`'s elements of operand `which` between its cooperative tensor and a tensor:
// a load reads zeros outside the tensor's extents, a store skips them.
extern "C" void tm_rt_matmul2d_load(const TmMatmul2dDescriptor* descriptor, uint32_t which, uint32_t lane,
                                    void* cooperative, uint32_t cooperative_type, const TmTensorDescriptor* tensor,
                                    uint32_t tensor_type);
extern "C" void tm_rt_matmul2d_store(const TmMatmul2dDescriptor* descriptor, uint32_t which, uint32_t lane,
                                     const void* cooperative, uint32_t cooperative_type,
                                     const TmTensorDescriptor* tensor, uint32_t tensor_type);
// The (column, row) of element `index` of lane `lane`'s share of operand `which`, as two
// integers of `coordinate_type` at `out`.
extern "C" void tm_rt_matmul2d_coordinate(const TmMatmul2dDescriptor* descriptor, uint32_t which, uint32_t lane,
                                          uint32_t index, void* out, uint32_t coordinate_type);
// tensor.slice(offsets, extents) of a descriptor of any rank: the extents clamped to what
// the source holds past the offsets, so a slice never reaches outside its source.
extern "C" void tm_rt_tensor_slice(void* slice, const void* source, uint32_t rank, const int32_t* offsets,
                                   const int32_t* extents);
