// torch_weft: datatypes and reduce ops (weft_types.h).
#include "weft_types.h"

namespace torch_weft {

bool weft_dtype_of(at::ScalarType t, weftDataType_t *out) {
  switch (t) {
    case at::kChar: *out = weftInt8; return true;
    case at::kByte: *out = weftUint8; return true;
    case at::kBool: *out = weftUint8; return true;
    case at::kInt: *out = weftInt32; return true;
    case at::kUInt32: *out = weftUint32; return true;
    case at::kLong: *out = weftInt64; return true;
    case at::kUInt64: *out = weftUint64; return true;
    case at::kHalf: *out = weftFloat16; return true;
    case at::kFloat: *out = weftFloat32; return true;
    case at::kDouble: *out = weftFloat64; return true;
    case at::kBFloat16: *out = weftBfloat16; return true;
    case at::kFloat8_e4m3fn: *out = weftFloat8e4m3; return true;
    case at::kFloat8_e5m2: *out = weftFloat8e5m2; return true;
    default: return false;
  }
}

bool is_integral(at::ScalarType t) {
  return at::isIntegralType(t, /*includeBool=*/true);
}

flat_buf bytes_of(const at::Tensor &t) {
  return {t.data_ptr(), (size_t)t.nbytes(), weftUint8};
}

flat_buf elems_of(const at::Tensor &t, const char *opname) {
  weftDataType_t dt;
  if (t.is_complex()) {
    // complex sums are sums of the real and imaginary parts
    at::Tensor r = at::view_as_real(t);
    TORCH_CHECK(weft_dtype_of(r.scalar_type(), &dt), "weft: ", opname, ": dtype ",
                t.scalar_type(), " has no weft equivalent");
    return {t.data_ptr(), (size_t)r.numel(), dt};
  }
  TORCH_CHECK(weft_dtype_of(t.scalar_type(), &dt), "weft: ", opname, ": dtype ",
              t.scalar_type(), " is not supported for reductions (weft has int8, uint8, ",
              "int32, uint32, int64, uint64, float16, bfloat16, float32, float64, ",
              "float8_e4m3fn, float8_e5m2)");
  return {t.data_ptr(), (size_t)t.numel(), dt};
}

red_plan red_plan_of(const ReduceOp &rop, at::ScalarType t, const char *opname) {
  red_plan p;
  const bool complex = at::isComplexType(t);
  switch (rop.op_) {
    case ReduceOp::SUM: p.op = weftSum; break;
    case ReduceOp::AVG: p.op = weftAvg; break;
    case ReduceOp::PRODUCT: p.op = weftProd; break;
    case ReduceOp::MIN: p.op = weftMin; break;
    case ReduceOp::MAX: p.op = weftMax; break;
    case ReduceOp::PREMUL_SUM: {
      p.kind = red_plan::premul;
      // the name torch 2.11 gives it; later releases keep it as an alias
      auto *sup = dynamic_cast<c10d::NCCLPreMulSumSupplement *>(rop.supplement_.get());
      TORCH_CHECK(sup != nullptr, "weft: ", opname, ": PREMUL_SUM without its factor");
      if (sup->tensor_factor.defined())
        p.tensor_factor = sup->tensor_factor;
      else
        p.factor = sup->double_factor;
      break;
    }
    case ReduceOp::BAND:
    case ReduceOp::BOR:
    case ReduceOp::BXOR:
      TORCH_CHECK(is_integral(t), "weft: ", opname, ": bitwise reductions need an integer ",
                  "or bool tensor, got ", t);
      p.kind = red_plan::bitwise;
      p.bit_op = rop.op_;
      break;
    default:
      TORCH_CHECK(false, "weft: ", opname, ": unknown reduce op ", (int)rop.op_);
  }
  // as NCCL: a factor in an integer (or fp8) type would be truncated
  // (PREMUL_SUM(0.5) of integers gave 0)
  if (p.kind == red_plan::premul)
    TORCH_CHECK_TYPE(complex || t == at::kHalf || t == at::kFloat || t == at::kBFloat16 ||
                         t == at::kDouble,
                     "weft: ", opname, ": PREMUL_SUM needs a half, float, bfloat16 or double ",
                     "tensor (as NCCL), got ", t);
  if (complex)
    TORCH_CHECK(p.kind != red_plan::bitwise &&
                    (p.op == weftSum || p.op == weftAvg || p.kind == red_plan::premul),
                "weft: ", opname, ": complex tensors support SUM, AVG and PREMUL_SUM only");
  if (t == at::kBool && p.kind == red_plan::native) {
    // as NCCL maps them: a sum of bools is their OR, a product their AND
    // (Gloo's bool arithmetic gives the same)
    if (p.op == weftSum) p.op = weftMax;
    if (p.op == weftProd) p.op = weftMin;
  }
  if (t == at::kBool)
    TORCH_CHECK(p.kind == red_plan::bitwise || p.op == weftMin || p.op == weftMax, "weft: ",
                opname, ": bool tensors support SUM, PRODUCT, MIN, MAX, BAND, BOR and BXOR");
  return p;
}

}  // namespace torch_weft
