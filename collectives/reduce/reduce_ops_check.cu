// Compiles reduce_ops.h as device code: one kernel touches every (type, op),
// so that the header the host executor is tested with also builds for GPUs.
#include "collectives/reduce/reduce_ops.h"

#define CHECK_OPS(tag, type)                                                   \
  __global__ void check_##tag(type *out, const type *a, const type *b, int n) { \
    int i = blockIdx.x * blockDim.x + threadIdx.x;                             \
    if (i >= n) return;                                                        \
    type s = weft_##tag##_sum(a[i], b[i]);                                     \
    s = weft_##tag##_prod(s, b[i]);                                            \
    s = weft_##tag##_max(s, a[i]);                                             \
    s = weft_##tag##_min(s, b[i]);                                             \
    out[i] = weft_##tag##_div(s, n);                                           \
  }

CHECK_OPS(i8, int8_t)
CHECK_OPS(u8, uint8_t)
CHECK_OPS(i32, int32_t)
CHECK_OPS(u32, uint32_t)
CHECK_OPS(i64, int64_t)
CHECK_OPS(u64, uint64_t)
CHECK_OPS(f16, uint16_t)
CHECK_OPS(f32, float)
CHECK_OPS(f64, double)
CHECK_OPS(bf16, uint16_t)
CHECK_OPS(e4m3, uint8_t)
CHECK_OPS(e5m2, uint8_t)
