#include "cpu/tensor_ops.h"

#include <cmath>
#include <cstring>

namespace {

// Element types as the AIR calls encode them: the low byte is the width in bits.
constexpr uint32_t kHalf = 0x10000010u, kFloat = 0x10000020u, kBfloat = 0x90000010u;
constexpr int kLanes = 32, kBlock = 16, kPerBlock = kBlock * kBlock / kLanes;

bool supported(const TmMatmul2dDescriptor& d) {
  auto dimension = [](int32_t v) { return v > 0 && v <= 4096 && v % kBlock == 0; };
  return dimension(d.m) && dimension(d.n) && dimension(d.k);
}

float load_element(const void* at, uint32_t type) {
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

void store_element(float value, void* at, uint32_t type) {
  if (type == kFloat) {
    std::memcpy(at, &value, 4);
  } else if (type == kBfloat) {  // round to nearest even, NaN kept quiet
    uint32_t bits;
    std::memcpy(&bits, &value, 4);
    const bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
    const auto rounded = uint16_t(nan ? (bits >> 16) | 0x40u : (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
    std::memcpy(at, &rounded, 2);
  } else {
    const _Float16 h = _Float16(value);
    std::memcpy(at, &h, 2);
  }
}

size_t element_bytes(uint32_t type) { return (type & 0xFFu) / 8; }

// An operand as stored: left M x K (K x M transposed), right K x N (N x K transposed),
// destination M x N. `logical` maps a stored (row, column) to the staged matrix's index.
struct Operand {
  int rows, columns;
  bool transposed;
  int staged_columns;  // of the row-major staged matrix (K for A, N for B and C)
  size_t staged_at;    // where that matrix starts in `staged`, in floats

  size_t logical(int row, int column) const {
    return staged_at + (transposed ? size_t(column) * staged_columns + row : size_t(row) * staged_columns + column);
  }
};

Operand operand(const TmMatmul2dDescriptor& d, int which) {
  const size_t a = 0, b = size_t(d.m) * d.k, c = b + size_t(d.k) * d.n;
  if (which == 0) return d.transpose_left ? Operand{d.k, d.m, true, d.k, a} : Operand{d.m, d.k, false, d.k, a};
  if (which == 1) return d.transpose_right ? Operand{d.n, d.k, true, d.n, b} : Operand{d.k, d.n, false, d.n, b};
  return Operand{d.m, d.n, false, d.n, c};
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

}  // namespace

extern "C" void tm_rt_matmul2d_stage(const TmMatmul2dDescriptor* descriptor, uint32_t lane, const void* left,
                                     const void* right, const void* destination, uint32_t left_type,
                                     uint32_t right_type, uint32_t destination_type, float* staged) {
  const TmMatmul2dDescriptor& d = *descriptor;
  if (!supported(d) || lane >= kLanes) return;
  const void* storage[3] = {left, right, destination};
  const uint32_t types[3] = {left_type, right_type, destination_type};
  for (int which = 0; which < 3; ++which) {
    const Operand o = operand(d, which);
    const auto* bytes = static_cast<const uint8_t*>(storage[which]);
    for (int e = 0; e < elements_per_lane(o); ++e) {
      int row, column;
      position(o, lane, e, row, column);
      staged[o.logical(row, column)] = load_element(bytes + e * element_bytes(types[which]), types[which]);
    }
  }
}

extern "C" void tm_rt_matmul2d_multiply(const TmMatmul2dDescriptor* descriptor, float* staged, uint32_t lanes) {
  const TmMatmul2dDescriptor& d = *descriptor;
  if (!supported(d)) return;
  for (uint32_t lane = 0; lane < kLanes; ++lane) {  // lanes a short SIMD-group lacks: zeros
    if (lanes & (1u << lane)) continue;
    for (int which = 0; which < 3; ++which) {
      const Operand o = operand(d, which);
      for (int e = 0; e < elements_per_lane(o); ++e) {
        int row, column;
        position(o, lane, e, row, column);
        staged[o.logical(row, column)] = 0.0f;
      }
    }
  }
  const float* a = staged;
  const float* b = staged + size_t(d.m) * d.k;
  float* c = staged + size_t(d.m) * d.k + size_t(d.k) * d.n;
  for (int m = 0; m < d.m; ++m) {
    for (int n = 0; n < d.n; ++n) {
      float acc = d.mode == 1 ? c[size_t(m) * d.n + n] : 0.0f;
      for (int k = 0; k < d.k; ++k) acc = std::fma(a[size_t(m) * d.k + k], b[size_t(k) * d.n + n], acc);
      c[size_t(m) * d.n + n] = acc;
    }
  }
}

extern "C" void tm_rt_matmul2d_read(const TmMatmul2dDescriptor* descriptor, uint32_t lane, void* destination,
                                    uint32_t destination_type, const float* staged) {
  const TmMatmul2dDescriptor& d = *descriptor;
  if (!supported(d) || lane >= kLanes) return;
  const Operand o = operand(d, 2);
  auto* bytes = static_cast<uint8_t*>(destination);
  for (int e = 0; e < elements_per_lane(o); ++e) {
    int row, column;
    position(o, lane, e, row, column);
    store_element(staged[o.logical(row, column)], bytes + e * element_bytes(destination_type), destination_type);
  }
}
