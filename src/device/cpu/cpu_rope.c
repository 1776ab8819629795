/* CPU kernel of the rotary embedding, Hugging Face rotate_half layout (see ops/ops.h). */
#include "device/cpu/cpu_kernels.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include "device/cpu/cpu_simd.h"

/* With a_i = pos · inv_freq[i] (a product in f32, as Hugging Face forms it),
 * for i < D/2:
 *   y[i]       = x[i] · cos a_i − x[i + D/2] · sin a_i
 *   y[i + D/2] = x[i + D/2] · cos a_i + x[i] · sin a_i
 * The inverse (the backward: dx = rope⁻¹(dy)) rotates by −a_i, i.e. negates
 * sin. cos/sin are computed once per token and shared by its heads. With
 * sections, pos holds several components a token and frequency i takes the
 * one its section names. */
at_status at_cpu_rope(at_tensor *y, const at_tensor *x, const at_tensor *pos, const at_tensor *inv_freq,
                      const at_rope_sections *sections, int inverse)
{
    const at_cpu_simd *v = at_cpu_simd_get();
    int64_t D = x->shape[x->ndim - 1], H = x->shape[x->ndim - 2], half = D / 2;
    int64_t ntok = at_tensor_numel(x) / (H * D);
    int nt = at_tensor_numel(x) >= AT_CPU_PAR_MIN ? omp_get_max_threads() : 1;
    size_t per = 2 * (size_t)half + 2 * (size_t)D; /* cos, sin, x row, y row */
    float *scratch = malloc((size_t)nt * per * sizeof(float));
    int *comp = malloc((size_t)(half ? half : 1) * sizeof(int)); /* the position component of each frequency */
    if ((!scratch && D) || !comp) {
        free(scratch);
        free(comp);
        return at_error(AT_ERR_NOMEM, "rope: no memory for scratch rows");
    }
    int ncomp = sections ? sections->n : 1;
    for (int64_t i = 0; i < half; i++) comp[i] = at_rope_section_of(sections, i);
    const int32_t *pp = at_tensor_data(pos);
    const float *freq = at_tensor_data(inv_freq);
    const void *px = at_tensor_data(x);
    void *py = at_tensor_data(y);
    float sign = inverse ? -1.0f : 1.0f;
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        float *cs = scratch + (size_t)omp_get_thread_num() * per, *sn = cs + half, *bx = sn + half, *by = bx + D;
#pragma omp for schedule(static)
        for (int64_t t = 0; t < ntok; t++) {
            const int32_t *pt = pp + t * ncomp;
            for (int64_t i = 0; i < half; i++) {
                float a = (float)pt[comp[i]] * freq[i];
                cs[i] = cosf(a);
                sn[i] = sign * sinf(a);
            }
            for (int64_t h = 0; h < H; h++) {
                int64_t off = (t * H + h) * D;
                const float *xr = at_cpu_in(v, bx, px, x->dtype, off, D);
                float *o = at_cpu_out(by, py, y->dtype, off);
                v->rope_row(o, xr, cs, sn, half);
                at_cpu_out_done(v, o, py, y->dtype, off, D);
            }
        }
    }
    free(scratch);
    free(comp);
    return AT_OK;
}
