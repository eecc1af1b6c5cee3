/* Leaf helpers of a plan that every layer uses: element sizes and names.
 * They call nothing. */
#include "plan.h"

size_t weftTypeSize(weftDataType_t datatype) { return plan_type_size(datatype); }

const char *coll_kind_name(enum coll_kind coll) {
  static const char *names[COLL_NUM] = {"AllReduce", "AllGather", "ReduceScatter", "Broadcast",
                                        "Reduce",    "Send",      "Recv"};
  return coll < COLL_NUM ? names[coll] : "?";
}
