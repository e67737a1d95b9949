/* bench_stream_copy: memcpy against zb__stream_copy (util/stream.h) for the reader's copy of
 * decoded rows into a batch that outgrows the cache.
 *
 *   bench_stream_copy [--arena MIB] [--piece BYTES] [--threads T] [--rounds R]
 *
 * Each thread copies pieces of --piece bytes (default 5,801: a 1,451-nonzero cell's float32
 * values, odd so that destinations fall at every offset) from one cache-hot 64 KiB source to
 * scattered places of its own --arena MiB buffer (default 96, past the last-level cache), as the
 * reader's shuffled rows land. Both ways run alternately R times (default 5), one line each,
 * then the best of each and their ratio. */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/stream.h"

typedef struct job {
    uint8_t *arena;
    size_t arena_bytes, piece;
    const uint8_t *src;
    bool stream;
    uint64_t bytes;
} job;

static double
now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void *
run(void *arg)
{
    job *j = arg;
    size_t n = j->arena_bytes / j->piece;
    j->bytes = 0;
    for (int rep = 0; rep < 8; rep++) {
        for (size_t i = 0; i < n; i++) {
            size_t k = (size_t)(((uint64_t)i * 2654435761u) % n); /* a scattered order */
            uint8_t *d = j->arena + k * j->piece;
            const uint8_t *s = j->src + (i & 63) * 64;
            if (j->stream)
                zb__stream_copy(d, s, j->piece);
            else
                memcpy(d, s, j->piece);
            j->bytes += j->piece;
        }
    }
    if (j->stream) zb__stream_fence();
    return NULL;
}

static double
measure(job *jobs, int threads, bool stream)
{
    pthread_t th[64];
    double t0 = now();
    for (int t = 0; t < threads; t++) {
        jobs[t].stream = stream;
        pthread_create(&th[t], NULL, run, &jobs[t]);
    }
    uint64_t bytes = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(th[t], NULL);
        bytes += jobs[t].bytes;
    }
    return (double)bytes / (now() - t0) / 1e9;
}

int
main(int argc, char **argv)
{
    size_t arena_mib = 96, piece = 5801;
    int threads = 1, rounds = 5;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "bench_stream_copy: %s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "--arena"))
            arena_mib = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--piece"))
            piece = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--threads"))
            threads = atoi(v);
        else if (!strcmp(a, "--rounds"))
            rounds = atoi(v);
        else {
            fprintf(stderr, "bench_stream_copy: unknown option %s\n", a);
            return 2;
        }
        i++;
    }
    if (threads < 1 || threads > 64 || piece < 1 || piece > 4096 * 16 - 64 * 64 || rounds < 1 ||
        arena_mib < 1) {
        fprintf(stderr, "bench_stream_copy: threads 1-64, piece 1-61440, rounds and arena >= 1\n");
        return 2;
    }
    uint8_t *src = malloc(65536 + 64 * 64);
    job jobs[64];
    if (!src) return 1;
    memset(src, 7, 65536 + 64 * 64);
    for (int t = 0; t < threads; t++) {
        size_t bytes = arena_mib << 20;
        jobs[t] = (job){.arena = malloc(bytes), .arena_bytes = bytes, .piece = piece, .src = src};
        if (!jobs[t].arena) return 1;
        memset(jobs[t].arena, 1, bytes); /* faulted in before timing */
    }
    double best_m = 0, best_s = 0;
    for (int r = 0; r < rounds; r++) {
        double m = measure(jobs, threads, false), s = measure(jobs, threads, true);
        printf("round %d: memcpy %.2f GB/s, streamed %.2f GB/s\n", r + 1, m, s);
        if (m > best_m) best_m = m;
        if (s > best_s) best_s = s;
    }
    printf("arena %zu MiB x %d thread(s), piece %zu B: memcpy %.2f GB/s, streamed %.2f GB/s, "
           "ratio %.2f\n",
           arena_mib, threads, piece, best_m, best_s, best_s / best_m);
    for (int t = 0; t < threads; t++) free(jobs[t].arena);
    free(src);
    return 0;
}
