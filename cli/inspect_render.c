/* inspect_render.c — the shared rendering of `kvq inspect` (cli/inspect.h): escaped and
 * cut text, and JSON values that keep integers and floats exact. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/inspect.h"

/* ==========================================================================
 * text helpers
 * ========================================================================== */

/* Writes s[0..n) with control characters, quotes and backslashes escaped; cuts
 * strings longer than `max` bytes (0 = never) at a UTF-8 boundary. */
void put_escaped(FILE *f, const char *s, size_t n, size_t max)
{
    size_t end = n;
    if (max && n > max) {
        end = max;
        while (end > 0 && ((unsigned char)s[end] & 0xC0) == 0x80)
            end--;
    }
    for (size_t i = 0; i < end; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n')
            fputs("\\n", f);
        else if (c == '\t')
            fputs("\\t", f);
        else if (c == '\\' || c == '"')
            fprintf(f, "\\%c", c);
        else if (c < 0x20 || c == 0x7F)
            fprintf(f, "\\x%02x", c);
        else
            fputc(c, f);
    }
    if (end < n)
        fprintf(f, "... (%zu bytes)", n);
}

void put_quoted(FILE *f, const char *s, size_t n)
{
    fputc('"', f);
    put_escaped(f, s, n, SHORT_STRING);
    fputc('"', f);
}

void put_dims(FILE *f, int n, const int64_t *dims)
{
    fputc('[', f);
    for (int i = 0; i < n; i++)
        fprintf(f, "%s%lld", i ? ", " : "", (long long)dims[i]);
    fputc(']', f);
}

/* Width of the widest of n strings. */
int widest(const char *const *s, size_t n)
{
    size_t w = 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] && strlen(s[i]) > w)
            w = strlen(s[i]);
    return (int)w;
}

/* ==========================================================================
 * JSON helpers (a NULL from an allocation failure drops the field; the final print
 * then fails and reports it)
 * ========================================================================== */

/* Integers above 2^53 do not survive a double: they become decimal strings. */
cJSON *json_u64(uint64_t v)
{
    if (v <= ((uint64_t)1 << 53))
        return cJSON_CreateNumber((double)v);
    char b[24];
    snprintf(b, sizeof b, "%llu", (unsigned long long)v);
    return cJSON_CreateString(b);
}

cJSON *json_i64(int64_t v)
{
    if (v >= -((int64_t)1 << 53) && v <= ((int64_t)1 << 53))
        return cJSON_CreateNumber((double)v);
    char b[24];
    snprintf(b, sizeof b, "%lld", (long long)v);
    return cJSON_CreateString(b);
}

/* A float32 as the shortest decimal that reads back to it, not the double's 17 digits. */
cJSON *json_f32(double v)
{
    char b[32];
    snprintf(b, sizeof b, "%.9g", v);
    return cJSON_CreateNumber(strtod(b, NULL));
}

cJSON *json_dims(int n, const int64_t *dims)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++)
        cJSON_AddItemToArray(a, json_i64(dims[i]));
    return a;
}

/* Prints and frees doc. */
int json_emit(const char *path, cJSON *doc)
{
    char *s = doc ? cJSON_Print(doc) : NULL;
    cJSON_Delete(doc);
    if (!s)
        return cli_failf(1, "%s: out of memory building the JSON output", path);
    puts(s);
    cJSON_free(s);
    return 0;
}

cJSON *json_header(const char *path, const char *format, uint64_t file_size)
{
    cJSON *doc = cJSON_CreateObject();
    cJSON_AddStringToObject(doc, "path", path);
    cJSON_AddStringToObject(doc, "format", format);
    cJSON_AddItemToObject(doc, "file_size", json_u64(file_size));
    return doc;
}

/* A double as the shortest decimal that reads back to it (cJSON's own printing keeps
 * 15 digits when they come within its epsilon), or null when it is not finite. */
cJSON *json_num_or_null(double x)
{
    char b[32];
    if (!isfinite(x))
        return cJSON_CreateNull();
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(b, sizeof b, "%.*g", digits, x);
        if (strtod(b, NULL) == x)
            break;
    }
    return cJSON_CreateRaw(b);
}

cJSON *json_str_or_null(const char *s)
{
    return s ? cJSON_CreateString(s) : cJSON_CreateNull();
}

/* ==========================================================================
 * reading the description back for the text
 * ========================================================================== */

const char *jstr(const cJSON *o, const char *key, const char *dflt)
{
    const cJSON *x = o ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
    return cJSON_IsString(x) ? x->valuestring : dflt;
}

double jvalue(const cJSON *x)
{
    if (cJSON_IsNumber(x))
        return x->valuedouble;
    if (cJSON_IsRaw(x) && x->valuestring)
        return strtod(x->valuestring, NULL);
    return NAN;
}

int64_t jint(const cJSON *x)
{
    if (cJSON_IsString(x))
        return strtoll(x->valuestring, NULL, 10);
    return cJSON_IsNumber(x) ? (int64_t)x->valuedouble : 0;
}

double jnum_or(const cJSON *o, const char *key, double dflt)
{
    const cJSON *x = o ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
    return cJSON_IsNumber(x) || cJSON_IsRaw(x) ? jvalue(x) : dflt;
}

uint64_t ju64(const cJSON *o, const char *key)
{
    const cJSON *x = o ? cJSON_GetObjectItemCaseSensitive(o, key) : NULL;
    if (cJSON_IsString(x))
        return strtoull(x->valuestring, NULL, 10);
    return cJSON_IsNumber(x) ? (uint64_t)x->valuedouble : 0;
}

double jmeta_num(const cJSON *md, const char *key)
{
    const char *v = jstr(md, key, NULL);
    char *end = NULL;
    double x = v && *v ? strtod(v, &end) : NAN;
    return end && *end == '\0' ? x : NAN;
}
