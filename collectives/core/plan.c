/* Leaf helpers of a plan that every layer uses: element sizes and names.
 * They call nothing. */
#include "plan.h"

size_t weftTypeSize(weftDataType_t datatype) {
  switch (datatype) {
    case weftInt8: case weftUint8: case weftFloat8e4m3: case weftFloat8e5m2: return 1;
    case weftFloat16: case weftBfloat16: return 2;
    case weftInt32: case weftUint32: case weftFloat32: return 4;
    case weftInt64: case weftUint64: case weftFloat64: return 8;
    default: return 0;
  }
}

const char *coll_kind_name(enum coll_kind coll) {
  static const char *names[COLL_NUM] = {"AllReduce", "AllGather", "ReduceScatter", "Broadcast",
                                        "Reduce",    "Send",      "Recv"};
  return coll < COLL_NUM ? names[coll] : "?";
}
