/* Copies into memory that will not be read again before it leaves the cache.
 *
 * A batch larger than the last-level cache is written once by the reader and read later by the
 * consumer, long after its lines have been evicted. A plain store makes the CPU fetch every
 * destination line before overwriting it (a read for ownership), which doubles the memory
 * traffic of such a copy; a non-temporal store writes the line without reading it. Into a buffer
 * that stays in cache it is slower than memcpy, hence the threshold below (measured with
 * `build/bench_stream_copy`: docs/PERFORMANCE.md, "Figures behind the code's decisions").
 *
 * Streamed stores are weakly ordered: the thread that made them calls zb__stream_fence() before
 * it publishes the memory to another thread. Elsewhere than x86-64 both are plain memcpy. */
#ifndef ZB_UTIL_STREAM_H
#define ZB_UTIL_STREAM_H

#include <stddef.h>

#if defined(__SSE2__)
#define ZB_HAVE_STREAM 1
#else
#define ZB_HAVE_STREAM 0
#endif

/* Writes of a request smaller than this stay in cache (the consumer may still find them there). */
#define ZB_STREAM_MIN_BATCH_BYTES ((size_t)8 << 20)

/* memcpy(dst, src, n), whole 64-byte destination lines written with non-temporal stores;
 * copies shorter than a few lines are plain. */
void zb__stream_copy(void *dst, const void *src, size_t n);

/* Orders this thread's streamed stores before its later stores (a store fence). */
void zb__stream_fence(void);

#endif
