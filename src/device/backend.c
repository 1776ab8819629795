#include "device/backend.h"

#define OP_NAME(name) #name,
static const char *const op_names[] = {AT_BACKEND_OPS(OP_NAME)};
#undef OP_NAME

/* The enum and the struct come from the same list; this catches an entry of
 * the struct added by hand outside it. */
_Static_assert(sizeof(at_backend_ops) == AT_BACKEND_OP_COUNT * sizeof(void (*)(void)),
               "at_backend_ops must hold exactly the operations of device/op_table.h");

const char *at_backend_op_name(int index)
{
    if (index < 0 || index >= AT_BACKEND_OP_COUNT) return "?";
    return op_names[index];
}
_Static_assert(AT_BACKEND_OP_COUNT <= 64, "at_backend.fallback_warned has one bit per operation");
