#include "cpu/tensor_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace {

constexpr uint32_t kHalf = 0x10000010u, kFloat = 0x10000020u, kBfloat = 0x90000010u;
constexpr int kLanes = 32, kBlock = 16, kPerBlock = kBlock * kBlock / kLanes;

bool is_integer(uint32_t type) { return (type >> 28) == 2u; }
size_t element_bytes(uint32_t type) { return (type & 0xFFu) / 8; }

bool dimension(int32_t v) { return v > 0 && v <= 4096 && v % kBlock == 0; }

// M and N as cooperative layouts need them (python's static check refuses others); K at
// most 64 Ki (-1 until resolved), a multiple of 16 wherever a cooperative operand depends
// on it (cooperative_layout).
bool supported(const TmMatmul2dDescriptor& d) { return dimension(d.m) && dimension(d.n) && d.k <= 65536; }

double load_element(const void* at, uint32_t type) {
  if (is_integer(type)) {
    switch (element_bytes(type)) {
      case 1: {
        int8_t v;
        std::memcpy(&v, at, 1);
        return v;
      }
      case 2: {
        int16_t v;
        std::memcpy(&v, at, 2);
        return v;
      }
      default: {
        int32_t v;
        std::memcpy(&v, at, 4);
        return v;
      }
    }
  }
  if (type == kFloat) {
    float v;
    std::memcpy(&v, at, 4);
    return v;
  }
  uint16_t bits;
  std::memcpy(&bits, at, 2);
  if (type == kBfloat) {
    const uint32_t wide = uint32_t(bits) << 16;
    float v;
    std::memcpy(&v, &wide, 4);
    return v;
  }
  _Float16 h;
  std::memcpy(&h, &bits, 2);
  return float(h);
}

// `value` is a float or an integer (an exact double): floats round once to half or
// bfloat, integers wrap to the type's width as the GPU's integer arithmetic does.
void store_element(double value, void* at, uint32_t type) {
  if (is_integer(type)) {
    const auto wide = static_cast<uint64_t>(static_cast<int64_t>(value));
    std::memcpy(at, &wide, element_bytes(type));  // little-endian: the low bytes
    return;
  }
  const auto single = float(value);
  if (type == kFloat) {
    std::memcpy(at, &single, 4);
  } else if (type == kBfloat) {  // round to nearest even, NaN kept quiet
    uint32_t bits;
    std::memcpy(&bits, &single, 4);
    const bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
    const auto rounded = uint16_t(nan ? (bits >> 16) | 0x40u : (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
    std::memcpy(at, &rounded, 2);
  } else {
    const _Float16 h = _Float16(single);
    std::memcpy(at, &h, 2);
  }
}

// An operand as stored: left M x K (K x M transposed), right K x N (N x K transposed),
// destination M x N; as a tensor, a stored row is dimension 1 and a column dimension 0.
// `logical` maps a stored (row, column) to the staged matrix's index.
struct Operand {
  int rows, columns;
  bool transposed;
  int staged_columns;  // of the row-major staged matrix (K for A, N for B and C)
  size_t staged_at;    // where that matrix starts in `staged`, in elements

  size_t logical(int row, int column) const {
    return staged_at + (transposed ? size_t(column) * staged_columns + row : size_t(row) * staged_columns + column);
  }
};

Operand operand(const TmMatmul2dDescriptor& d, uint32_t which) {
  const size_t a = 0, b = size_t(d.m) * d.k, c = b + size_t(d.k) * d.n;
  if (which == 0) return d.transpose_left ? Operand{d.k, d.m, true, d.k, a} : Operand{d.m, d.k, false, d.k, a};
  if (which == 1) return d.transpose_right ? Operand{d.n, d.k, true, d.n, b} : Operand{d.k, d.n, false, d.n, b};
  return Operand{d.m, d.n, false, d.n, c};
}

// Whether a cooperative tensor of operand `which` has a layout: a multiple of 16 each way.
bool cooperative_layout(const TmMatmul2dDescriptor& d, uint32_t which) {
  return which <= 2 && supported(d) && (which == 2 || dimension(d.k));
}

// Element e of a lane's share of a stored rows x columns operand, as MLX's NAX kernels
// lay it out (steel/gemm/nax.h, BaseNAXFrag::get_coord): 16 x 16 blocks in row-major
// order, 8 elements of each per lane, two rows 8 apart of four adjacent columns.
void position(const Operand& o, uint32_t lane, int e, int& row, int& column) {
  const int block = e / kPerBlock, i = e % kPerBlock;
  const int blocks_across = o.columns / kBlock;
  const int quad = int(lane >> 2);
  const int first_row = (quad & 4) | int((lane >> 1) & 3);
  const int first_column = ((quad & 2) | int(lane & 1)) * 4;
  row = (block / blocks_across) * kBlock + first_row + (i >> 2) * 8;
  column = (block % blocks_across) * kBlock + first_column + (i & 3);
}

int elements_per_lane(const Operand& o) { return o.rows * o.columns / kLanes; }

// The address of a tensor's element at a stored (row, column), or null outside its extents.
uint8_t* tensor_element(const TmTensorDescriptor& t, int row, int column, uint32_t type) {
  if (column < 0 || row < 0 || column >= t.extents[0] || row >= t.extents[1]) return nullptr;
  const int64_t index = t.origin + int64_t(column) * t.strides[0] + int64_t(row) * t.strides[1];
  return t.data + index * int64_t(element_bytes(type));
}

// A tensor operand read whole into its staged matrix; zeros outside its extents.
void gather(const Operand& o, const TmTensorDescriptor& t, uint32_t type, double* staged) {
  for (int row = 0; row < o.rows; ++row) {
    for (int column = 0; column < o.columns; ++column) {
      const uint8_t* at = tensor_element(t, row, column, type);
      staged[o.logical(row, column)] = at == nullptr ? 0.0 : load_element(at, type);
    }
  }
}

}  // namespace

extern "C" void tm_rt_matmul2d_resolve(const TmMatmul2dDescriptor* descriptor, TmMatmul2dDescriptor* resolved,
                                       const TmTensorDescriptor* left_tensor, const TmTensorDescriptor* right_tensor) {
  *resolved = *descriptor;
  if (resolved->k >= 0) return;
  int32_t k = 0;
  if (left_tensor != nullptr) {
    k = left_tensor->extents[resolved->transpose_left ? 1 : 0];
  } else if (right_tensor != nullptr) {
    k = right_tensor->extents[resolved->transpose_right ? 0 : 1];
  }
  resolved->k = std::max(k, 0);
}

extern "C" void tm_rt_matmul2d_stage(const TmMatmul2dDescriptor* descriptor, uint32_t lane, const void* left,
                                     const void* right, const void* destination, uint32_t left_type,
                                     uint32_t right_type, uint32_t destination_type, double* staged) {
  const TmMatmul2dDescriptor& d = *descriptor;
  if (lane >= kLanes) return;
  const void* storage[3] = {left, right, destination};
  const uint32_t types[3] = {left_type, right_type, destination_type};
  for (uint32_t which = 0; which < 3; ++which) {
    if (storage[which] == nullptr || !cooperative_layout(d, which)) continue;
    const Operand o = operand(d, which);
    const auto* bytes = static_cast<const uint8_t*>(storage[which]);
    for (int e = 0; e < elements_per_lane(o); ++e) {
      int row, column;
      position(o, lane, e, row, column);
      staged[o.logical(row, column)] = load_element(bytes + e * element_bytes(types[which]), types[which]);
    }
  }
}

extern "C" void tm_rt_matmul2d_multiply(const TmMatmul2dDescriptor* descriptor, double* staged, uint32_t lanes,
                                        const TmTensorDescriptor* left_tensor, const TmTensorDescriptor* right_tensor,
                                        uint32_t left_type, uint32_t right_type, uint32_t destination_type) {
  const TmMatmul2dDescriptor& d = *descriptor;  // resolved: K >= 0
  if (!supported(d) || d.k < 0) return;
  const TmTensorDescriptor* tensors[2] = {left_tensor, right_tensor};
  for (uint32_t which = 0; which < 3; ++which) {
    const Operand o = operand(d, which);
    if (which < 2 && tensors[which] != nullptr) {
      gather(o, *tensors[which], which == 0 ? left_type : right_type, staged);
      continue;
    }
    if (!cooperative_layout(d, which)) return;
    for (uint32_t lane = 0; lane < kLanes; ++lane) {  // lanes a short SIMD-group lacks: zeros
      if (lanes & (1u << lane)) continue;
      for (int e = 0; e < elements_per_lane(o); ++e) {
        int row, column;
        position(o, lane, e, row, column);
        staged[o.logical(row, column)] = 0.0;
      }
    }
  }
  const double* a = staged;
  const double* b = staged + size_t(d.m) * d.k;
  double* c = staged + size_t(d.m) * d.k + size_t(d.k) * d.n;
  for (int m = 0; m < d.m; ++m) {
    for (int n = 0; n < d.n; ++n) {
      double& out = c[size_t(m) * d.n + n];
      if (is_integer(destination_type)) {  // exact: every product and partial sum fits 64 bits
        auto acc = d.mode == 1 ? int64_t(out) : int64_t(0);
        for (int k = 0; k < d.k; ++k) acc += int64_t(a[size_t(m) * d.k + k]) * int64_t(b[size_t(k) * d.n + n]);
        out = double(int32_t(uint32_t(uint64_t(acc))));
      } else {
        float acc = d.mode == 1 ? float(out) : 0.0f;
        for (int k = 0; k < d.k; ++k) {
          acc = std::fma(float(a[size_t(m) * d.k + k]), float(b[size_t(k) * d.n + n]), acc);
        }
        out = acc;
      }
    }
  }
}

extern "C" void tm_rt_matmul2d_read(const TmMatmul2dDescriptor* descriptor, uint32_t lane, void* destination,
                                    uint32_t destination_type, const double* staged) {
  const TmMatmul2dDescriptor& d = *descriptor;
  if (!cooperative_layout(d, 2) || lane >= kLanes) return;
  const Operand o = operand(d, 2);
  auto* bytes = static_cast<uint8_t*>(destination);
  for (int e = 0; e < elements_per_lane(o); ++e) {
    int row, column;
    position(o, lane, e, row, column);
    store_element(staged[o.logical(row, column)], bytes + e * element_bytes(destination_type), destination_type);
  }
}

extern "C" void tm_rt_matmul2d_load(const TmMatmul2dDescriptor* descriptor, uint32_t which, uint32_t lane,
                                    void* cooperative, uint32_t cooperative_type, const TmTensorDescriptor* tensor,
                                    uint32_t tensor_type) {
  const TmMatmul2dDescriptor& d = *descriptor;
  if (!cooperative_layout(d, which) || lane >= kLanes) return;
  const Operand o = operand(d, which);
  auto* bytes = static_cast<uint8_t*>(cooperative);
  for (int e = 0; e < elements_per_lane(o); ++e) {
    int row, column;
    position(o, lane, e, row, column);
    const uint8_t* at = tensor_element(*tensor, row, column, tensor_type);
    store_element(at == nullptr ? 0.0 : load_element(at, tensor_type), bytes + e * element_bytes(cooperative_type),
                  cooperative_type);
  }
}

extern "C" void tm_rt_matmul2d_store(const TmMatmul2dDescriptor* descriptor, uint32_t which, uint32_t lane,
                                     const void* cooperative, uint32_t cooperative_type,
                                     const TmTensorDescriptor* tensor, uint32_t tensor_type) {
  const TmMatmul2dDescriptor& d = *descriptor;
  if (!cooperative_layout(d, which) || lane >= kLanes) return;
  const Operand o = operand(d, which);
  const auto* bytes = static_cast<const uint8_t*>(cooperative);
  for (int e = 0; e < elements_per_lane(o); ++e) {
    int row, column;
    position(o, lane, e, row, column);
    uint8_t* at = tensor_element(*tensor, row, column, tensor_type);
    if (at != nullptr) {
      store_element(load_element(bytes + e * element_bytes(cooperative_type), cooperative_type), at, tensor_type);
    }
  }
}

extern "C" void tm_rt_matmul2d_coordinate(const TmMatmul2dDescriptor* descriptor, uint32_t which, uint32_t lane,
                                          uint32_t index, void* out, uint32_t coordinate_type) {
  const TmMatmul2dDescriptor& d = *descriptor;
  int row = 0, column = 0;
  if (cooperative_layout(d, which) && lane < kLanes && int(index) < elements_per_lane(operand(d, which))) {
    position(operand(d, which), lane, int(index), row, column);
  }
  const size_t width = element_bytes(coordinate_type);
  store_element(column, out, coordinate_type);
  store_element(row, static_cast<uint8_t*>(out) + width, coordinate_type);
}

extern "C" void tm_rt_tensor_slice(void* slice, const void* source, uint32_t rank, const int32_t* offsets,
                                   const int32_t* extents) {
  // The layout of private_tensors.py: data, origin, extents[rank], strides[rank]. `slice`
  // may be `source`: each field is read before its own is written.
  const auto* from = static_cast<const uint8_t*>(source);
  auto* to = static_cast<uint8_t*>(slice);
  int64_t origin;
  std::memcpy(&origin, from + 8, 8);
  for (uint32_t i = 0; i < rank; ++i) {
    int32_t held, stride;
    std::memcpy(&held, from + 16 + 4 * i, 4);
    std::memcpy(&stride, from + 16 + 4 * (rank + i), 4);
    held = std::max(held, 0);
    const int32_t offset = std::min(std::max(offsets[i], 0), held);
    origin += int64_t(offset) * stride;
    // A negative extent is dynamic_extent: the rest of the source.
    const int32_t sliced = extents[i] < 0 ? held - offset : std::min(extents[i], held - offset);
    std::memcpy(to + 16 + 4 * i, &sliced, 4);
    std::memcpy(to + 16 + 4 * (rank + i), &stride, 4);
  }
  std::memmove(to, from, 8);  // the data pointer
  std::memcpy(to + 8, &origin, 8);
}
