/* CPU kernel of the rotary embedding, Hugging Face rotate_half layout (see ops/ops.h). */
#ifndef AT_DEVICE_CPU_CPU_ROPE_H
#define AT_DEVICE_CPU_CPU_ROPE_H

#include "device/backend.h"

at_status at_cpu_rope(at_tensor *y, const at_tensor *x, const at_tensor *pos, const at_tensor *inv_freq, int inverse);

#endif
