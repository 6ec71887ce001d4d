/* fuzz_params_record.c — libFuzzer target for the reading of a `kvq calibrate` stage's
 * STAGE.params.json record (pipeline/calibrate_records.c, calib_record_diff).
 *
 * A stage reruns when its record on disk differs from the one it would write; the old
 * record is whatever the work directory holds (damaged, cut short, edited, binary). The
 * input, as that old record, is compared with a real record in both directions: the
 * reason must be a non-empty, NUL-terminated line within its buffer (also a buffer of 8
 * bytes), the same on a second call, and the function must return in time on long
 * inputs (libFuzzer's -timeout). Any inconsistency aborts. Also built as a plain
 * corpus replayer (replay_main.c). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline/calibrate_ctx.h"

#define CHECK(c) do { if (!(c)) abort(); } while (0)

static const char RECORD[] =
    "{\n  \"stage\": \"fit\",\n  \"record\": 1,\n  \"tool\": \"kvq 0.1.0\",\n"
    "  \"input.moments\": \"5f2c0a1b9e3d4c7a\",\n  \"method\": \"qavq\",\n"
    "  \"codebook_size\": 16,\n  \"iters\": 3,\n  \"seed\": 1234,\n"
    "  \"layers\": [0, 1, 2, 3, 4]\n}\n";

static void check_reason(const char *old, const char *new_text, size_t cap)
{
    char why[256], again[256];
    memset(why, 0x55, sizeof why);
    calib_record_diff(old, new_text, why, cap);
    CHECK(memchr(why, 0, cap) != NULL && why[0] != 0 && !strchr(why, '\n'));
    for (size_t i = strlen(why) + 1; i < sizeof why; i++)
        CHECK(i < cap || (unsigned char)why[i] == 0x55); /* nothing written past cap */
    calib_record_diff(old, new_text, again, cap);
    CHECK(strcmp(why, again) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *old = malloc(size + 1);
    CHECK(old);
    memcpy(old, data, size);
    old[size] = 0; /* read as a C string, as the stage reads the file */
    check_reason(old, RECORD, 256);
    check_reason(RECORD, old, 256);
    check_reason(old, RECORD, 8);
    free(old);
    return 0;
}
