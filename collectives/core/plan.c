/* weftTypeSize, the API's name for plan.h's plan_type_size (the leaf
 * helpers of a plan are inline there). */
#include "plan.h"

size_t weftTypeSize(weftDataType_t datatype) { return plan_type_size(datatype); }
