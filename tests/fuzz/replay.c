/* Replays inputs through a fuzz target without libFuzzer: each argument is a file or a
 * directory of files. The normal and ASan builds run every checked-in corpus (seeds and the
 * inputs of crashes found, which are regression tests) this way under CTest. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz_common.h"

/* libFuzzer's -malloc_limit_mb outside libFuzzer: one allocation past 2 GiB from inputs this
 * small is a finding (the readers must bound what they allocate from sizes they read), so the
 * replay aborts on it as the fuzzer does. Linked with --wrap=malloc,calloc,realloc. */
#define REPLAY_MALLOC_LIMIT ((size_t)2 << 30)

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t n);

static void
check_size(size_t n, const char *fn)
{
    if (n <= REPLAY_MALLOC_LIMIT) return;
    fprintf(stderr, "replay: %s(%zu): an allocation past the 2 GiB limit\n", fn, n);
    abort();
}

void *
__wrap_malloc(size_t n)
{
    check_size(n, "malloc");
    return __real_malloc(n);
}

void *
__wrap_calloc(size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size) return NULL;
    check_size(n * size, "calloc");
    return __real_calloc(n, size);
}

void *
__wrap_realloc(void *p, size_t n)
{
    check_size(n, "realloc");
    return __real_realloc(p, n);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static int
replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: cannot open %s\n", path);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fprintf(stderr, "replay: cannot read %s\n", path);
        fclose(f);
        free(buf);
        return 1;
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, (size_t)n);
    free(buf);
    return 0;
}

int
main(int argc, char **argv)
{
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    int inputs = 0, bad = 0;
    for (int i = 1; i < argc; i++) {
        struct stat sb;
        if (stat(argv[i], &sb) != 0) {
            fprintf(stderr, "replay: no such input %s\n", argv[i]);
            return 1;
        }
        if (!S_ISDIR(sb.st_mode)) {
            bad += replay_file(argv[i]);
            inputs++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        struct dirent *de;
        while (d && (de = readdir(d)) != NULL) {
            if (de->d_name[0] == '.') continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], de->d_name);
            bad += replay_file(path);
            inputs++;
        }
        if (d) closedir(d);
    }
    printf("replayed %d inputs\n", inputs);
    return bad != 0 || inputs == 0;
}
