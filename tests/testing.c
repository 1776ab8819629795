#include "testing.h"

#include <math.h>

int at_test_failures;
int at_test_checks;

int at_test_result(const char *name)
{
    if (at_test_failures) {
        fprintf(stderr, "%s: %d of %d checks FAILED\n", name, at_test_failures, at_test_checks);
        return 1;
    }
    printf("%s: all %d checks passed\n", name, at_test_checks);
    return 0;
}

double at_test_max_rel_err(const float *got, const float *want, size_t n, double floor)
{
    double maxw = floor, maxd = 0;
    for (size_t i = 0; i < n; i++) {
        double w = fabs((double)want[i]);
        if (w > maxw) maxw = w;
        double d = fabs((double)got[i] - (double)want[i]);
        if (d > maxd || isnan(d)) maxd = isnan(d) ? INFINITY : d;
    }
    return maxd / maxw;
}
