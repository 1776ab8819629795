#include "train/objective.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The objectives by name: a new one is a row here and its file. */
static const struct {
    const char *name;
    const at_objective_ops *ops;
} OBJECTIVES[] = {
    {"sft", &at_objective_sft},
    {"pt", &at_objective_pt},
    {"dpo", &at_objective_preference},
    {"cpo", &at_objective_preference},
    {"simpo", &at_objective_preference},
    {"orpo", &at_objective_preference},
    {"kto", &at_objective_kto},
    {"rm", &at_objective_rm},
    {"grpo", &at_objective_grpo},
};

at_status at_objective_open(const char *name, const at_pref_config *pref, at_objective **out)
{
    *out = NULL;
    for (size_t i = 0; name && i < sizeof OBJECTIVES / sizeof OBJECTIVES[0]; i++) {
        if (strcmp(name, OBJECTIVES[i].name) != 0) continue;
        at_objective *o = calloc(1, sizeof *o);
        if (!o) return at_error(AT_ERR_NOMEM, "out of memory");
        o->ops = OBJECTIVES[i].ops;
        o->pref = pref;
        o->rows_per_item = o->ops->rows_per_item;
        o->step_repeats = 1;
        *out = o;
        return AT_OK;
    }
    return at_error(AT_ERR_INVALID, "no training objective named %s", name ? name : "(none)");
}

size_t at_objective_rlhf_names(char *buf, size_t cap)
{
    size_t n = 0;
    if (cap) buf[0] = 0;
    for (size_t i = 0; i < sizeof OBJECTIVES / sizeof OBJECTIVES[0]; i++) {
        const char *name = OBJECTIVES[i].name;
        if (!strcmp(name, "sft") || !strcmp(name, "pt")) continue;
        int k = snprintf(buf + (n < cap ? n : cap), n < cap ? cap - n : 0, "%s%s", n ? "|" : "", name);
        n += k > 0 ? (size_t)k : 0;
    }
    return n;
}

void at_objective_free(at_objective *o)
{
    if (!o) return;
    if (o->ops->free) o->ops->free(o);
    free(o);
}
