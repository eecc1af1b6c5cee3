// torch_weft: how torch's datatypes and reduce ops map onto weft's.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <weft.h>

#include <type_traits>

namespace torch_weft {

using c10d::ReduceOp;

// A buffer as weft sees it: pointer, element count and datatype. Operations
// that only move data (broadcast, gathers, all-to-all, send/recv) move any
// dtype as bytes; reductions need the tensor's own arithmetic.
struct flat_buf {
  void *ptr;
  size_t count;
  weftDataType_t dtype;
};

// How a ReduceOp runs on weft: a native op, a pre-multiplied sum, or an
// all-gather followed by a local bitwise reduction (weft has no bitwise ops).
struct red_plan {
  enum { native, premul, bitwise } kind = native;
  weftRedOp_t op = weftSum;
  ReduceOp::RedOpType bit_op = ReduceOp::BAND;
  double factor = 1.0;
  at::Tensor tensor_factor;
};

// The OpType of the coalesced tensor collectives: their own where torch has
// them, COALESCED in torch releases that have not (2.11 among them).
template <typename O, typename = void>
struct coalesced_op_types {
  static constexpr O allgather_into_tensor = O::COALESCED;
  static constexpr O reduce_scatter_tensor = O::COALESCED;
};
template <typename O>
struct coalesced_op_types<O, std::void_t<decltype(O::ALLGATHER_INTO_TENSOR_COALESCED),
                                         decltype(O::REDUCE_SCATTER_TENSOR_COALESCED)>> {
  static constexpr O allgather_into_tensor = O::ALLGATHER_INTO_TENSOR_COALESCED;
  static constexpr O reduce_scatter_tensor = O::REDUCE_SCATTER_TENSOR_COALESCED;
};

// The weft datatype of a tensor for arithmetic, or false when weft has none.
bool weft_dtype_of(at::ScalarType t, weftDataType_t *out);
bool is_integral(at::ScalarType t);
// The tensor as bytes (operations that only move data).
flat_buf bytes_of(const at::Tensor &t);
// The tensor as elements of its weft datatype; complex as real pairs.
flat_buf elems_of(const at::Tensor &t, const char *opname);
red_plan red_plan_of(const ReduceOp &rop, at::ScalarType t, const char *opname);

}  // namespace torch_weft
