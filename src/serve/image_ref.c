#include "serve/image_ref.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "data/media.h"

/* Whether real path p lies inside real folder dir (equal, or below it). */
static int inside(const char *p, const char *dir)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    if (strncmp(p, dir, n)) return 0;
    return p[n] == '\0' || p[n] == '/' || (n == 1 && dir[0] == '/');
}

at_status at_serve_image_load(const char *ref, const char *allowed_dir, uint64_t max_pixels, at_image *out)
{
    memset(out, 0, sizeof *out);
    if (!strncmp(ref, "http://", 7) || !strncmp(ref, "https://", 8))
        return at_error(AT_ERR_UNSUPPORTED, "image URL %.80s: the server never fetches from the network; send the "
                        "image as a data: URL (base64)", ref);
    int is_file = !strncmp(ref, "file://", 7);
    if (!strncmp(ref, "data:", 5) || (!is_file && ref[0] != '/' && ref[0] != '.' && strlen(ref) > 200))
        return at_media_load_image(ref, max_pixels, out);
    const char *path = is_file ? ref + 7 : ref;
    if (is_file && !strncmp(path, "localhost/", 10)) path += 9;
    if (!allowed_dir || !allowed_dir[0])
        return at_error(AT_ERR_UNSUPPORTED, "image %.200s: local files are read only under the folder the server was "
                        "started with (--allowed_local_media_path DIR); send the image as a data: URL", ref);
    if (strchr(ref, ':') && !is_file)
        return at_error(AT_ERR_UNSUPPORTED, "image %.80s: only data: and file:// URLs are read", ref);
    char dir[PATH_MAX], real[PATH_MAX], joined[PATH_MAX];
    if (!realpath(allowed_dir, dir))
        return at_error(AT_ERR_NOT_FOUND, "--allowed_local_media_path %s: no such folder", allowed_dir);
    if (path[0] != '/') { /* relative to the allowed folder */
        int k = snprintf(joined, sizeof joined, "%s/%s", dir, path);
        if (k < 0 || (size_t)k >= sizeof joined) return at_error(AT_ERR_INVALID, "image path %.80s...: too long", path);
        path = joined;
    }
    if (!realpath(path, real))
        return at_error(AT_ERR_NOT_FOUND, "image %.200s: no such file under --allowed_local_media_path", ref);
    if (!inside(real, dir))
        return at_error(AT_ERR_INVALID, "image %.200s: outside --allowed_local_media_path (%s): refused", ref,
                        allowed_dir);
    return at_image_load(real, max_pixels, out);
}
